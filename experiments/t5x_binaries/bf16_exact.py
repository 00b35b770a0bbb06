"""Are the shipped weights exactly representable in bfloat16? (Then T5X's default restore cast
RestoreCheckpointConfig.dtype = 'bfloat16' changes no value.)

  python bf16_exact.py > results/bf16_exact.json
"""
import json

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import checkpoints

out = {}
for name in ("target", "draft"):
    path = f"/work/t5x_run/ckpt/{name}/checkpoint_0"
    leaves = jax.tree_util.tree_leaves(checkpoints.load_t5x_checkpoint(path)["target"])
    total = sum(int(np.size(x)) for x in leaves)
    exact = sum(int((np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
                     == np.asarray(x)).sum()) for x in leaves)
    out[name] = {"checkpoint": path, "dtypes": sorted({str(np.asarray(x).dtype) for x in leaves}),
                 "values": total, "bfloat16_exact": exact}
print(json.dumps(out, indent=1))
