"""Parameter trees: the decoder projections of a T5 tree (T5X names, see `network`) packed once.

`pack_params` turns every `kernel [K, N]` a cached decode step runs (and, in float32, the
set-up projections) into `kernel_packed` panels (`ops.pack`); `unpack_params` is its inverse for
consumers of the T5X layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x.cpu_kernel import choice, extension, ops

PACKED_NAME = "kernel_packed"  # parameter name of a packed Dense kernel
# A draft's output-vocabulary shortlist (`drafts.shortlist_params`): the logits layer holds only
# the shortlisted columns, raw `kernel_shortlist [K, S]` or packed, and `shortlist_index int32
# [vocab]` (each token's column, -1 outside the shortlist: logit -inf).
SHORTLIST_KERNEL_NAME = "kernel_shortlist"
SHORTLIST_INDEX_NAME = "shortlist_index"

_MLP = ("wi", "wi_0", "wi_1", "wo")
# {stack: {block: Dense names}} of the Dense layers a cached decode step runs (plus the decoder's
# `logits_dense`); the cross-attention K/V are cached, used once per call (set-up, below).
_DECODE = {
    "decoder": {
        "self_attention": ("query", "key", "value", "out"),
        "encoder_decoder_attention": ("query", "out"),
        "mlp": _MLP,
    }
}
# The projections a decode's set-up runs once per call on every source position (M = the source
# length in rows): the encoder's, and the cross-attention K/V the cache keeps.
_SETUP = {
    "encoder": {"attention": ("query", "key", "value", "out"), "mlp": _MLP},
    "decoder": {"encoder_decoder_attention": ("key", "value")},
}


def _paths(params, table: dict) -> list[tuple[str, ...]]:
    """Paths from the tree's root (e.g. `('decoder', 'layers_0', 'mlp', 'wo')`) of the Dense
    layers of `table` the tree has, in `layers_{i}` (T5X's names) or one `layers` module under
    nn.scan (leading layer axis)."""
    paths = []
    for stack, blocks in table.items():
        node = params.get(stack, {})
        for layer in sorted(k for k in node if k == "layers" or k.startswith("layers_")):
            for block, names in blocks.items():
                have = node[layer].get(block, {})
                paths += [(stack, layer, block, n) for n in names if n in have]
    return paths


def _projection_paths(params) -> list[tuple[str, ...]]:
    """Paths (from the root) of every Dense a cached decode step runs."""
    logits = [("decoder", "logits_dense")] if "logits_dense" in params.get("decoder", {}) else []
    return logits + _paths(params, _DECODE)


def _setup_paths(params) -> list[tuple[str, ...]]:
    """Paths (from the root) of the set-up projections (`_SETUP`) the tree has."""
    return _paths(params, _SETUP)


def _node(params, path: tuple[str, ...]):
    for key in path:
        params = params[key]
    return params


def packed_arrays(params) -> list:
    """The `kernel_packed` arrays of a tree's decode projections, each `float32/bfloat16 [P, K, 32]`
    (`[layers, P, K, 32]` for scanned layers); an empty list for a raw tree."""
    if not hasattr(params, "get"):
        return []
    nodes = [_node(params, path) for path in _projection_paths(params)]
    return [node[PACKED_NAME] for node in nodes if PACKED_NAME in node]


def is_packed(params) -> bool:
    """Whether `params` comes from `pack_params` (some decoder Dense holds `kernel_packed`)."""
    return bool(packed_arrays(params))


def packed_weight_dtype(params) -> str | None:
    """'float32' or 'bfloat16': storage of a packed tree's panels (None: not packed)."""
    leaves = packed_arrays(params)
    return None if not leaves else jnp.dtype(leaves[0].dtype).name


def _multi_device(leaves) -> bool:
    for leaf in leaves:
        if isinstance(leaf, jax.core.Tracer):
            if jax.device_count() > 1:
                return True  # traced: placement unknown; a mesh may shard it
        elif isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) > 1:
            return True
    return False


def pack_params(params, weight_dtype: str = "float32", *, activation_dtype: Any = jnp.float32):
    """The parameter tree with every decoder projection a cached step runs packed for the kernel.

    Each `decoder/.../{query,key,value,out,wi*,wo,logits_dense}/kernel [K, N]` of the decoder's
    self-attention, cross-attention query/out, MLP and logits layer becomes `kernel_packed
    [ceil(N / 32), K, 32]` (see `pack`), stored in `weight_dtype`. So do, in float32 whatever
    `weight_dtype` is, the set-up projections a decode runs once per call on every source
    position: the encoder's attention and MLP kernels and the decoder's cross-attention key/value
    (at M = the source length the kernel beats XLA:CPU's GEMM: experiments/setup_switches;
    `SPECDEC_CPU_KERNEL_SETUP=0` leaves them on `jnp.dot`, for A/B runs; so does packing traced
    parameters inside a jitted call, where they would be packed on every call and used once).
    Everything else (embeddings, norms, relative position biases) is the same array object, so
    the packed tree does not copy it. Call it once per parameter set, outside every decode loop,
    and drop the raw tree (the packed one serves every use of the model, the teacher-forced
    forward included): one copy of each projection, except that a decode projection whose shape
    XLA's dot measured faster for some rows bucket keeps its raw `kernel` beside the panels, for
    the steps `choice.choose` sends to XLA. With `SPECDEC_CPU_CHOICE=auto` (off by default) it first
    times, outside a trace, the decode projections' shapes not yet in the choice cache
    (`choice.ensure`: 1.7-4 s per distinct shape the first time on a loaded 2-core VM; nothing
    once cached). It is idempotent; an already packed tree is returned as is, except
    that float32 decode panels are narrowed (rounded) to bfloat16 when weight_dtype='bfloat16'
    asks for it (bfloat16 panels are never widened back). The input tree is not modified
    (checkpoints and the T5X parameter layout are untouched).

    Returns `params` unchanged (the decoder then runs `jnp.dot`) when the kernel is off
    (`SPECDEC_CPU_KERNEL=0`), the default backend is not CPU, the extension is missing, the
    activations are not float32 (T5X's bfloat16 activations keep `jnp.dot`), or the parameters are
    sharded over several devices (a custom call has no partitioning rule). Logged once.

    Args:
      params: T5 parameter tree (`network.Transformer`, T5X names), raw or already packed.
      weight_dtype: 'float32' (default) or 'bfloat16' (CPU weight storage; changes numerics).
      activation_dtype: the model's activation dtype (`T5Config.dtype`).

    Returns:
      A new nested dict (or `params` itself, see above).

    Raises:
      ValueError: unknown weight_dtype.
    """
    dtype = ops.check_weight_dtype(weight_dtype)
    if not hasattr(params, "get") or "decoder" not in params:
        return params
    if is_packed(params):  # float32 panels are narrowed to bfloat16 on request, never widened
        wider = [w for w in packed_arrays(params) if w.dtype.itemsize > jnp.dtype(dtype).itemsize]
        if not wider:
            return params

        def narrow(path, dense: dict) -> dict:
            w = dense.get(PACKED_NAME)
            return dense if w is None else {**dense, PACKED_NAME: w.astype(dtype)}

        return _map_projections(params, narrow)
    reason = extension.disabled_reason()
    if reason is None and jnp.dtype(activation_dtype) != jnp.float32:
        reason = f"activations are {jnp.dtype(activation_dtype).name}"
    if reason is None and _multi_device(jax.tree_util.tree_leaves(params)):
        reason = "parameters are (or may be) sharded over several devices"
    if reason is not None:
        extension.log_fallback_once(reason)
        return params

    decode = _projection_paths(params)
    shapes = {path: _choice_shape(_node(params, path)) for path in decode}
    if not _traced(params, decode):  # inside a trace: cached measurements only
        choice.ensure(set(shapes.values()), weight_dtype)

    def packer(dtype_name: str, keep_raw=lambda path: False):
        def pack_dense(path, dense: dict) -> dict:
            dense = dict(dense)
            name = SHORTLIST_KERNEL_NAME if SHORTLIST_INDEX_NAME in dense else "kernel"
            kernel = dense[name] if keep_raw(path) else dense.pop(name)
            if kernel.ndim == 3:  # scanned layers: [layers, K, N] -> [layers, P, K, 32]
                dense[PACKED_NAME] = jax.vmap(lambda w: ops.pack(w, dtype_name))(kernel)
            else:
                dense[PACKED_NAME] = ops.pack(kernel, dtype_name)
            return dense

        return pack_dense

    keep = lambda path: choice.keep_raw(*shapes[path], weight_dtype)  # noqa: E731
    out = _map_projections(params, packer(weight_dtype, keep))
    if extension.setup_enabled() and not _traced(params, _setup_paths(params)):
        out = _map_projections(out, packer("float32"), _setup_paths(out))
    return out


def _choice_shape(dense: dict) -> tuple[int, int]:
    """(K, N) of a raw decode Dense as `ops.dense` will be given it (a shortlist: its packed,
    zero-padded width)."""
    if SHORTLIST_INDEX_NAME in dense:
        k, s = dense[SHORTLIST_KERNEL_NAME].shape[-2:]
        return int(k), -(-int(s) // ops.PANEL) * ops.PANEL
    k, n = dense["kernel"].shape[-2:]
    return int(k), int(n)


def _traced(params, paths) -> bool:
    """Whether any kernel at `paths` is a tracer: packing inside a traced call (a jitted
    `predict_batch_with_aux` over raw parameters) happens on every call, and a set-up projection
    is used once per call, so packing it there would cost about what it saves."""
    return any(
        isinstance(_node(params, p).get(name), jax.core.Tracer)
        for p in paths
        for name in ("kernel", SHORTLIST_KERNEL_NAME)
    )


def _map_projections(params, fn, paths=None):
    """A new tree with `fn(path, dense dict)` at every path of `paths` (default: the decode
    projections, `_projection_paths`); every other node is the very same object (no copy)."""
    out = dict(params)
    for path in _projection_paths(params) if paths is None else paths:
        parent = out
        for key in path[:-1]:
            parent[key] = dict(parent[key])
            parent = parent[key]
        parent[path[-1]] = fn(path, parent[path[-1]])
    return out


def unpack_params(params, out_features):
    """The raw T5X layout of a tree from `pack_params` (`kernel_packed` -> `kernel [K, N]`).

    For consumers of the T5X layout (e.g. `hf.export_hf`) handed a decode-ready tree; a raw tree is
    returned unchanged. Exact for float32 panels; bfloat16 panels come back widened to float32.

    Args:
      params: T5 parameter tree, packed or raw.
      out_features: callable `(path: tuple of str from the tree's root, e.g. ('decoder',
        'layers_0', 'mlp', 'wo')) -> N`, the output width of that Dense (e.g.
        `steps.unpack_params` reads it from the model's shapes).

    Returns:
      A new tree with float32 `kernel`s where `kernel_packed` was (`params` itself if raw).
    """
    if not hasattr(params, "get") or "decoder" not in params or not is_packed(params):
        return params

    def unpack_dense(path, dense: dict) -> dict:
        if PACKED_NAME not in dense:
            return dense
        dense = dict(dense)
        packed = dense.pop(PACKED_NAME)
        scanned = packed.ndim == 4  # [layers, P, K, 32]
        if SHORTLIST_INDEX_NAME in dense:  # a shortlist keeps its (zero-padded) packed width
            name, n = SHORTLIST_KERNEL_NAME, packed.shape[-3] * ops.PANEL
        else:
            name, n = "kernel", int(out_features(path))
        dense[name] = (
            jax.vmap(lambda w: ops.unpack(w, n))(packed) if scanned else ops.unpack(packed, n)
        )
        return dense

    out = _map_projections(params, unpack_dense)
    return _map_projections(out, unpack_dense, _setup_paths(out))
