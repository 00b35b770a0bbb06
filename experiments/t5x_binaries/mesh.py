"""Prints the mesh T5X's PjitPartitioner(num_partitions=1) builds here (T5X's CPU path logs none)."""
import jax
from t5x import partitioning

p = partitioning.PjitPartitioner(num_partitions=1,
                                 logical_axis_rules=partitioning.standard_logical_axis_rules())
m = p.mesh
print("devices", jax.devices(), "mesh axes", m.axis_names, "shape", dict(m.shape),
      "data layout(batch 4)", p.get_data_layout(4))
