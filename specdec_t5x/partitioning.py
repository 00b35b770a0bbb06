"""Model-parallel decoding on a ('data', 'model') device mesh, T5X style (`t5x/partitioning.py`).

Parameters carry T5X's *logical* axis names, declared by the network itself with flax's
`param_with_axes` exactly as `t5x/examples/t5/layers.py` declares them (`network`; the `params_axes`
collection of `models.EncoderDecoderModel.get_initial_variables`, which T5X's `PjitPartitioner`
reads). `logical_axes` reads that collection, so this module and T5X's partitioner shard from one
source. `LOGICAL_AXIS_RULES` (T5X's `standard_logical_axis_rules` for 1-D parameter and activation
partitioning) map the names to mesh axes::

  token_embedder/embedding                 [vocab, embed]      -> ('model', None)
  */{query,key,value}/kernel                [embed, joined_kv]  -> (None, 'model')
  */out/kernel                              [joined_kv, embed]  -> ('model', None)
  */mlp/wi(_0|_1)/kernel                    [embed, mlp]        -> (None, 'model')
  */mlp/wo/kernel                           [mlp, embed]        -> ('model', None)
  decoder/logits_dense/kernel               [embed, vocab]      -> (None, 'model')
  */relpos_bias/rel_embedding               [heads, relpos_buckets] -> ('model', None)
  */scale (norms)                           [embed]             -> replicated
  cache cached_key / cached_value           [batch, heads, length, kv] -> ('data', 'model', None, None)

With `T5Config(scan_layers=True)` layer parameters and caches have a leading layer axis (logical
name 'layers', as flax's `scan_with_axes` names it), which is never sharded. Parameters packed for
the CPU kernel (`kernel_packed`, draft shortlists) have no logical axes and are replicated.

A dimension that the mesh axis does not divide stays replicated (T5X would refuse), so tiny test
models run on any mesh. Decoding is plain `jax.jit` with `in_shardings`/`out_shardings` plus
sharding constraints on the caches; XLA inserts the collectives (GSPMD), none are hand-written.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import partitioning as nn_partitioning
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_t5x import cpu_kernel

MESH_AXES = ("data", "model")

# T5X's standard_logical_axis_rules(activation_partitioning_dims=1, parameter_partitioning_dims=1).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("length", None),
)


def make_mesh(mesh_shape: Sequence[int] = (1, -1), devices: Sequence[Any] | None = None) -> Mesh:
    """A ('data', 'model') mesh over `devices` (default: all).

    Args:
      mesh_shape: (data, model) sizes; one entry may be -1 (all remaining devices).

    Raises:
      ValueError: the shape does not use exactly the available devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = list(mesh_shape)
    if len(shape) != 2:
        raise ValueError(f"mesh_shape must be (data, model); got {mesh_shape}.")
    if shape.count(-1) == 1:
        shape[shape.index(-1)] = len(devices) // max(1, -int(np.prod(shape)))
    if int(np.prod(shape)) != len(devices):
        raise ValueError(
            f"mesh_shape {tuple(mesh_shape)} needs {np.prod(shape)} devices; {len(devices)} available."
        )
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_axes(module) -> dict[str, Any]:
    """T5X logical axis names of every parameter, as `module` declares them (`params_axes`).

    Args:
      module: a `network.Transformer` (any config; nothing is allocated: `jax.eval_shape`).

    Returns:
      A nested dict shaped like the module's `params`, each leaf a tuple of logical axis names
      (`('embed', 'mlp')`; scanned layers lead with 'layers').
    """
    ones = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    variables = jax.eval_shape(
        lambda e, d: module.init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False), ones, ones
    )
    specs = flatten_dict(nn_partitioning.get_axis_names(variables["params_axes"]))
    return unflatten_dict({path: tuple(spec) for path, spec in specs.items()})


_UNSHARDED_LEAVES = (
    cpu_kernel.PACKED_NAME,
    cpu_kernel.SHORTLIST_INDEX_NAME,
    cpu_kernel.SHORTLIST_KERNEL_NAME,
)


def logical_to_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]] = LOGICAL_AXIS_RULES,
) -> PartitionSpec:
    """PartitionSpec of an array with logical `axes`; undivisible or reused mesh axes replicate."""
    table = dict(rules)
    spec, used = [], set()
    for name, size in zip(axes, shape, strict=True):
        mesh_axis = table.get(name) if name is not None else None
        ok = mesh_axis is not None and mesh_axis not in used and size % mesh.shape[mesh_axis] == 0
        spec.append(mesh_axis if ok else None)
        used.add(mesh_axis if ok else None)
    return PartitionSpec(*spec)


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def param_shardings(params_or_shapes: Any, mesh: Mesh, module, rules=LOGICAL_AXIS_RULES) -> Any:
    """A `NamedSharding` for every parameter (arrays or `jax.ShapeDtypeStruct`s), same tree.

    Args:
      params_or_shapes: a parameter tree of `module` (raw, or packed for the CPU kernel).
      mesh: a ('data', 'model') mesh.
      module: the `network.Transformer` the parameters belong to: its declared logical axes
        (`logical_axes`) give each leaf's sharding.
      rules: logical-to-mesh axis rules (T5X's `standard_logical_axis_rules` by default).

    Raises:
      ValueError: a parameter `module` does not declare (the message names it).
    """
    axes = flatten_dict(logical_axes(module))

    def sharding(path, leaf):
        names = _path_names(path)
        if names in axes:
            return NamedSharding(mesh, logical_to_spec(axes[names], leaf.shape, mesh, rules))
        if names[-1] in _UNSHARDED_LEAVES:
            return NamedSharding(mesh, PartitionSpec())
        raise ValueError(
            f"parameter {'/'.join(names)!r} is not declared by {type(module).__name__}."
        )

    return jax.tree_util.tree_map_with_path(sharding, params_or_shapes)


def cache_shardings(cache: Any, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> Any:
    """Shardings of a decode cache: K/V `[batch, heads, length, kv]`; other leaves batch-first."""

    def sharding(path, leaf):
        names = _path_names(path)
        if names and names[-1] in ("cached_key", "cached_value") and len(leaf.shape) == 4:
            axes = ("batch", "heads", "length", "kv")
        elif names and names[-1] in ("cached_key", "cached_value") and len(leaf.shape) == 5:
            axes = (None, "batch", "heads", "length", "kv")  # scanned layers
        else:
            axes = ("batch",) + (None,) * (len(leaf.shape) - 1) if leaf.shape else ()
        return NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules))

    return jax.tree_util.tree_map_with_path(sharding, cache)


def batch_shardings(batch: Any, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> Any:
    """Input features (`[batch, ...]` arrays) split over 'data' (replicated if undivisible)."""

    def sharding(leaf):
        axes = ("batch",) + (None,) * (len(leaf.shape) - 1) if leaf.shape else ()
        return NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules))

    return jax.tree_util.tree_map(sharding, batch)


def shard_params(params: Any, mesh: Mesh, module, rules=LOGICAL_AXIS_RULES) -> Any:
    """`params` of `module` placed on `mesh` by `param_shardings` (one leaf at a time)."""
    shardings = param_shardings(params, mesh, module, rules)
    return jax.tree_util.tree_map(jax.device_put, params, shardings)


def constrain_caches(decode_fn, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
    """Wraps a decode fn so its cache arguments (`cache`, `*_cache`) get `cache_shardings`.

    Works for `decoding.temperature_sample` (`cache`) and `speculative.speculative_sample`
    (`target_cache`, `draft_cache`) alike: it only adds `with_sharding_constraint`s.
    """
    signature = inspect.signature(decode_fn)

    @functools.wraps(decode_fn)
    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            if name == "cache" or name.endswith("_cache"):
                bound.arguments[name] = jax.lax.with_sharding_constraint(
                    value, cache_shardings(value, mesh, rules)
                )
        return decode_fn(*bound.args, **bound.kwargs)

    return wrapped


def predict_fn(
    model, mesh: Mesh, decoder_params: Mapping[str, Any] | None = None, rules=LOGICAL_AXIS_RULES
):
    """A jitted `predict_batch_with_aux` of `model` partitioned over `mesh`.

    Inside the jitted function the parameters are constrained to `param_shardings`, the batch to
    `batch_shardings` ('data'), the decode caches to `cache_shardings` and the decodes to 'data';
    arguments already placed that way (`shard_params`) are used in place, others are moved.

    Args:
      model: `models.EncoderDecoderModel` (baseline) or `models.SpeculativeEncoderDecoderModel`
        (then the function takes `draft_params` too; T5 drafts shard like the target, other
        drafts' tables are replicated).
      mesh: a ('data', 'model') mesh (`make_mesh`).
      decoder_params: static decode settings (temperature, topk, gamma, ...).

    Returns:
      `fn(params, batch, rng[, draft_params]) -> (decodes, aux)`: decodes int32 [batch, L]
      (sharded over 'data'), aux as the model's.
    """
    model = copy.copy(model)  # the copy decodes with constrained caches; the original is untouched
    model.decode_fn = constrain_caches(model.decode_fn, mesh, rules)
    decoder_params = dict(decoder_params or {})
    constrain = jax.lax.with_sharding_constraint

    def place(params, batch):
        return (
            constrain(params, param_shardings(params, mesh, model.module, rules)),
            constrain(batch, batch_shardings(batch, mesh, rules)),
        )

    def finish(out):
        decodes, aux = out
        return constrain(decodes, batch_shardings(decodes, mesh, rules)), aux

    if hasattr(model, "draft"):

        def run(params, batch, rng, draft_params):
            params, batch = place(params, batch)
            shardings = _draft_shardings(model.draft, draft_params, mesh, rules)
            draft_params = constrain(draft_params, shardings)
            return finish(
                model.predict_batch_with_aux(
                    params, batch, rng, decoder_params=decoder_params, draft_params=draft_params
                )
            )

    else:

        def run(params, batch, rng):
            params, batch = place(params, batch)
            return finish(
                model.predict_batch_with_aux(params, batch, rng, decoder_params=decoder_params)
            )

    return jax.jit(run)


def _draft_shardings(draft, draft_params: Any, mesh: Mesh, rules) -> Any:
    """T5 draft parameters shard by their own network's axes, like the target's; other drafts
    (n-gram tables, copy drafts) replicate."""
    module = getattr(draft, "module", None)
    if hasattr(module, "config"):
        return param_shardings(draft_params, mesh, module, rules)
    return jax.tree_util.tree_map(lambda _: NamedSharding(mesh, PartitionSpec()), draft_params)
