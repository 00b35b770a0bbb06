"""Weight-streaming small-M matmul and fused cached attention for CPU decoding (XLA FFI custom
calls; C++ in `matmul.cc` and `attention.cc`).

A cached decoder step multiplies M = batch x k rows (k = 1 for a plain step, γ + 1 for the
speculative verify step) by every projection matrix. XLA:CPU lowers M >= 2 rows to a GEMM that
re-packs each weight matrix on every call, so on DRAM-bound models the verify step costs ~2x a
one-token step instead of the ~1x a roofline (and the paper's Section 3.4 cost model) assumes; see
`results/verify_cost/`. This kernel reads weights packed *once* into contiguous column panels
`[ceil(N / 32), K, 32]` and streams each panel exactly once per call whatever M is. A matrix of at
least 64 KiB (packed) is split by panel blocks over XLA's own intra-op thread pool (the calling
thread works too; `set_split_bytes` tunes it), and the weights are prefetched 4 KiB ahead of the
FMAs (without it the hardware prefetcher falls behind once several rows keep the core busy).
Splitting never changes a result: each output column is summed by the same code in the same order.

* `pack` / `unpack`: one matrix `[K, N]` <-> panels. `pack_params` packs a T5 parameter tree's
  decoder projections once per parameter set (`kernel` -> `kernel_packed`, see there).
* `matmul(x, packed, n)`: `x float32 [..., K]` times the packed matrix -> `float32 [..., n]`.
  Works under `jit`, `while_loop`, `scan` and `vmap`; on GPU/TPU it unpacks and uses `jnp.dot`
  (`lax.platform_dependent`); differentiating it raises (inference only; train on raw params).
* `attention(q, k, v, bias)`: fused cached attention (logits, additive bias, softmax, P.V) for one
  layer of a decode step, C++ in `attention.cc`. XLA:CPU runs a k-token step's attention as two
  batched GEMMs that pack the whole K / V cache on every call plus separate bias and softmax
  fusions; on a 256-token source that was all of the verify step's growth with k. Used by
  `network.MultiHeadAttention` for packed float32 parameters (`SPECDEC_CPU_ATTENTION=0` keeps
  XLA's attention for A/B timing); same platform, vmap and gradient rules as `matmul`.
* Weight dtype (`WEIGHT_DTYPES`): 'float32' (default) or 'bfloat16' (weights stored rounded to
  bfloat16, widened to float32 in registers: activations, products and sums stay float32; halves
  the bytes streamed, changes numerics, never the default).

The extension is compiled by `pip install` (setup.py, optional: without a compiler the package still
installs). When it is missing, or `SPECDEC_CPU_KERNEL=0` is set, `pack_params` returns the
parameters unchanged and every projection stays `jnp.dot` (logged once).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.machinery
import logging
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

PANEL = 32  # output columns per packed panel
PACKED_NAME = "kernel_packed"  # parameter name of a packed Dense kernel
# A draft's output-vocabulary shortlist (`drafts.shortlist_params`): the logits layer holds only
# the shortlisted columns, raw `kernel_shortlist [K, S]` or packed, and `shortlist_index int32
# [vocab]` (each token's column, -1 outside the shortlist: logit -inf).
SHORTLIST_KERNEL_NAME = "kernel_shortlist"
SHORTLIST_INDEX_NAME = "shortlist_index"
WEIGHT_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ENV_VAR = "SPECDEC_CPU_KERNEL"  # "0" turns the kernel off
ATTENTION_ENV_VAR = "SPECDEC_CPU_ATTENTION"  # "0" keeps XLA's attention with packed weights (A/B)
# "0" leaves the set-up projections (encoder, cross-attention K/V) on jnp.dot when packing (A/B).
SETUP_ENV_VAR = "SPECDEC_CPU_KERNEL_SETUP"


@contextlib.contextmanager
def env_var(name: str, value: str):
    """Sets environment variable `name` to `value` inside the block and restores it after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def env_setting(on: bool):
    """Sets SPECDEC_CPU_KERNEL inside the block and restores the previous value after it.

    The setting is read when a function is traced, so it applies to jit traces made inside.
    """
    return env_var(ENV_VAR, "1" if on else "0")


_TARGET = "specdec_matmul"
_PACK_TARGET = "specdec_pack"
_ATTENTION_TARGET = "specdec_attention"
_ISAS = {"portable": 0, "avx2+fma": 1, "avx512f": 2}
_log = logging.getLogger(__name__)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """Loads the compiled extension and registers its FFI target once; None if it is missing."""
    here = pathlib.Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_matmul{suffix}"
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            if not hasattr(lib, "SpecdecAttention"):  # built from an older source tree
                _log_fallback_once(f"{path.name} is stale: rebuild it with `pip install -e .`")
                return None
            lib.SpecdecMatmulIsa.restype = ctypes.c_char_p
            lib.SpecdecMatmulSetSplitBytes.restype = ctypes.c_int64
            lib.SpecdecMatmulSetSplitBytes.argtypes = [ctypes.c_int64]
            lib.SpecdecMatmulSplitCalls.restype = ctypes.c_int64
            lib.SpecdecMatmulPoolThreads.restype = ctypes.c_int64
            for target, symbol in (
                (_TARGET, lib.SpecdecMatmul),
                (_PACK_TARGET, lib.SpecdecPack),
                (_ATTENTION_TARGET, lib.SpecdecAttention),
            ):
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
            return lib
    return None


def available() -> bool:
    """Whether the compiled extension is present (built by `pip install`)."""
    return _library() is not None


def isa() -> str | None:
    """Code path the kernel runs on this CPU: 'avx512f', 'avx2+fma', 'portable' (None: no build)."""
    lib = _library()
    return None if lib is None else lib.SpecdecMatmulIsa().decode()


def force_isa(name: str | None) -> None:
    """Forces a code path ('portable', 'avx2+fma', 'avx512f'; None: the detected one). For tests
    and A/B timing. Raises RuntimeError if the extension is missing or this CPU lacks that path."""
    lib = _library()
    which = -1 if name is None else _ISAS.get(name)
    if lib is None or which is None or not lib.SpecdecMatmulForceIsa(which):
        raise RuntimeError(f"cannot force the kernel code path {name!r} here (isa: {isa()}).")


def set_split_bytes(nbytes: int) -> int:
    """Sets the packed-weight size (bytes) from which one product is split over XLA's intra-op
    threads (default 64 KiB; a huge value keeps every product on the calling thread). For tests and
    A/B timing. Returns the previous value. Raises RuntimeError if the extension is missing."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the CPU kernel extension is not built.")
    return int(lib.SpecdecMatmulSetSplitBytes(int(nbytes)))


def split_stats() -> tuple[int, int]:
    """(products split over threads so far in this process, threads XLA's intra-op pool reported
    to the last kernel call). For tests. Raises RuntimeError if the extension is missing."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the CPU kernel extension is not built.")
    return int(lib.SpecdecMatmulSplitCalls()), int(lib.SpecdecMatmulPoolThreads())


@functools.cache
def _log_fallback_once(reason: str) -> None:
    _log.warning("CPU matmul kernel not used (%s): decoder projections run on jnp.dot.", reason)


def disabled_reason() -> str | None:
    """Why `pack_params` would leave parameters unpacked (None: the kernel is used)."""
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return f"{ENV_VAR}=0"
    if jax.default_backend() != "cpu":
        return f"default backend is {jax.default_backend()}"
    if not available():
        return "the compiled extension is missing (reinstall with a C++ compiler)"
    return None


def check_weight_dtype(weight_dtype: str) -> Any:
    """The jnp dtype of a weight_dtype name; ValueError naming the bad value otherwise."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(
            f"cpu_weight_dtype (the CPU kernel's weight storage) must be one of "
            f"{sorted(WEIGHT_DTYPES)}; got {weight_dtype!r}."
        )
    return WEIGHT_DTYPES[weight_dtype]


def _pack_xla(kernel: Array, dtype: Any) -> Array:
    k, n = kernel.shape
    panels = -(-n // PANEL)
    w = jnp.pad(kernel.astype(dtype), ((0, 0), (0, panels * PANEL - n)))
    return w.reshape(k, panels, PANEL).transpose(1, 0, 2)


@functools.partial(jax.jit, static_argnames="weight_dtype")
def _pack(kernel: Array, weight_dtype: str) -> Array:
    dtype = WEIGHT_DTYPES[weight_dtype]
    if not available():
        return _pack_xla(kernel, dtype)
    # On CPU one streaming pass in C++ (XLA's pad + transpose is ~5x slower; packing inside a
    # jitted predict call must stay cheap next to the decode).
    k, n = kernel.shape
    out = jax.ShapeDtypeStruct((-(-n // PANEL), k, PANEL), dtype)
    return jax.lax.platform_dependent(
        kernel.astype(jnp.float32),
        cpu=jax.ffi.ffi_call(_PACK_TARGET, out, vmap_method="expand_dims"),
        default=lambda w: _pack_xla(w, dtype),
    )


def pack(kernel: Array, weight_dtype: str = "float32") -> Array:
    """Packs one matrix into column panels.

    Args:
      kernel: float [K, N] (a Dense kernel, T5X layout `[in, out]`).
      weight_dtype: 'float32' or 'bfloat16' (storage of the packed copy).

    Returns:
      weight_dtype [ceil(N / 32), K, 32]; panel p holds columns 32p .. 32p + 31 (zero past N).

    Raises:
      ValueError: not 2-D, a zero-size axis, or an unknown weight_dtype.
    """
    check_weight_dtype(weight_dtype)
    if kernel.ndim != 2 or 0 in kernel.shape:
        raise ValueError(f"pack needs a non-empty [K, N] matrix; got shape {kernel.shape}.")
    return _pack(kernel, weight_dtype)


def unpack(packed: Array, n: int) -> Array:
    """Inverse of `pack`: float32 [K, n] from panels `[P, K, 32]` (bfloat16 widened exactly)."""
    panels, k, _ = packed.shape
    return packed.transpose(1, 0, 2).reshape(k, panels * PANEL)[:, :n].astype(jnp.float32)


def _ffi_matmul(x2: Array, packed: Array, n: int) -> Array:
    call = jax.ffi.ffi_call(
        _TARGET,
        jax.ShapeDtypeStruct((x2.shape[0], n), jnp.float32),
        vmap_method="expand_dims",  # the handler folds/loops leading (vmapped) axes itself
    )
    return call(x2, packed, n=np.int32(n))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _matmul2d(x2: Array, packed: Array, n: int) -> Array:
    return jax.lax.platform_dependent(
        x2,
        packed,
        cpu=lambda a, w: _ffi_matmul(a, w, n),
        default=lambda a, w: jnp.dot(a, unpack(w, n)),
    )


@_matmul2d.defjvp
def _matmul2d_jvp(n, primals, tangents):
    raise NotImplementedError(
        "cpu_kernel.matmul is inference-only and has no derivative: differentiate a model with "
        f"its raw (unpacked) parameters, or set {ENV_VAR}=0."
    )


def matmul(x: Array, packed: Array, n: int) -> Array:
    """`x @ W` for a packed W (see `pack`), through the FFI kernel on CPU.

    Args:
      x: float32 [..., K] activations (any leading shape; all rows share one pass over W).
      packed: float32 or bfloat16 [ceil(n / 32), K, 32] from `pack`.
      n: columns N of the original matrix.

    Returns:
      float32 [..., n].

    Raises:
      ValueError: x not float32, shapes that do not match, or a zero-size operand.
      NotImplementedError: when differentiated.
    """
    if x.dtype != jnp.float32:
        raise ValueError(f"matmul needs float32 activations; got {x.dtype}.")
    if (
        packed.ndim != 3
        or packed.shape[2] != PANEL
        or packed.dtype
        not in (
            jnp.float32,
            jnp.bfloat16,
        )
    ):
        raise ValueError(
            f"packed must be float32/bfloat16 [P, K, {PANEL}] from pack(); got {packed.dtype} "
            f"{packed.shape}."
        )
    k = packed.shape[1]
    if (
        x.ndim < 1
        or x.shape[-1] != k
        or x.size == 0
        or not (packed.shape[0] - 1) * PANEL < n <= packed.shape[0] * PANEL
    ):
        raise ValueError(
            f"matmul: x {x.shape} (needs [..., {k}] with at least one row) does not fit packed "
            f"{packed.shape} with n={n} (needs {(packed.shape[0] - 1) * PANEL} < n <= "
            f"{packed.shape[0] * PANEL})."
        )
    lead = x.shape[:-1]
    return _matmul2d(x.reshape(-1, k), packed, int(n)).reshape(*lead, n)


def attention_enabled() -> bool:
    """Whether packed decoder layers use the fused `attention` (SPECDEC_CPU_ATTENTION, default on;
    read when a step is traced). With it off they keep XLA's dots and softmax (for A/B timing)."""
    return os.environ.get(ATTENTION_ENV_VAR, "1").strip() != "0"


def attention_reference(q: Array, k: Array, v: Array, bias: Array) -> Array:
    """What `attention` computes, in XLA ops (the other platforms' path and the tests' reference).

    Same arguments and result as `attention`."""
    logits = jnp.einsum("bqhd,bhkd->bhqk", q, k) + bias
    weights = jax.nn.softmax(logits)
    return jnp.einsum("bhqk,bhkd->bqhd", weights, v)


def _ffi_attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
    call = jax.ffi.ffi_call(
        _ATTENTION_TARGET,
        jax.ShapeDtypeStruct(q.shape, jnp.float32),
        vmap_method="broadcast_all",  # the handler folds leading (vmapped) axes into the batch
    )
    return call(q, k, v, bias)


@jax.custom_jvp
def _attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
    return jax.lax.platform_dependent(
        q, k, v, bias, cpu=_ffi_attention, default=attention_reference
    )


@_attention.defjvp
def _attention_jvp(primals, tangents):
    raise NotImplementedError(
        "cpu_kernel.attention is inference-only and has no derivative: differentiate a model "
        f"with its raw (unpacked) parameters, or set {ENV_VAR}=0."
    )


def attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
    """Fused cached attention (logits, additive bias, softmax, P.V) through the FFI kernel on CPU.

    T5-style: no 1/sqrt(d) scaling (T5X `layers.dot_product_attention` with the scale folded into
    the query initialisation). One call per attention layer of a decode step; each cache row is
    read once for every query row (see `attention.cc` for why XLA's batched dots cost more).

    Args:
      q: float32 [batch, q_len, heads, head_dim] queries.
      k, v: float32 [batch, heads, kv_len, head_dim] keys / values (the cache, heads first).
      bias: float32 [batch | 1, heads | 1, q_len, kv_len] additive bias (mask as 0 / -1e10, plus
        any relative-position bias).

    Returns:
      float32 [batch, q_len, heads, head_dim], softmax(q.k + bias) @ v.

    Raises:
      ValueError: a dtype other than float32, shapes that do not match, or a zero-size operand.
      NotImplementedError: when differentiated.
    """
    arrays = {"q": q, "k": k, "v": v, "bias": bias}
    bad = {n: a.dtype for n, a in arrays.items() if a.dtype != jnp.float32}
    if bad:
        raise ValueError(f"attention needs float32 operands; got {bad}.")
    if any(a.ndim != 4 for a in arrays.values()):
        raise ValueError(
            f"attention needs rank-4 operands; got { {n: a.shape for n, a in arrays.items()} }."
        )
    b, ql, h, d = q.shape
    s = k.shape[2]
    if (
        k.shape != (b, h, s, d)
        or v.shape != k.shape
        or bias.shape[0] not in (1, b)
        or bias.shape[1] not in (1, h)
        or bias.shape[2:] != (ql, s)
        or min(q.size, k.size) == 0
    ):
        raise ValueError(
            f"attention: q {q.shape} [b, q, h, d], k {k.shape} and v {v.shape} [b, h, s, d], bias "
            f"{bias.shape} [b|1, h|1, q, s] do not match (or an operand is empty)."
        )
    _library()  # registers the FFI target (on CPU the call needs it; elsewhere it is harmless)
    return _attention(q, k, v, bias)


def dense(x: Array, packed: Array, features: int, dtype: Any) -> Array:
    """A bias-free Dense layer on a packed kernel (used by `network.Dense` when its parameter is
    `kernel_packed`): `x dtype [..., K]` -> `dtype [..., features]`, computed in float32."""
    return matmul(x.astype(jnp.float32), packed, features).astype(dtype)


# ----------------------------------------------------------------------------------------------
# Parameter trees: pack the decoder projections of a T5 tree (T5X names, see `network`) once.

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


def setup_enabled() -> bool:
    """Whether `pack_params` packs the set-up projections too (`SPECDEC_CPU_KERNEL_SETUP`, on by
    default): the encoder's and the cross-attention K/V, float32 panels whatever the weight dtype.
    Read when packing."""
    return os.environ.get(SETUP_ENV_VAR, "1").strip() != "0"


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
    (at M = the source length the kernel beats XLA:CPU's GEMM: results/setup_kernel/;
    `SPECDEC_CPU_KERNEL_SETUP=0` leaves them on `jnp.dot`, for A/B runs; so does packing traced
    parameters inside a jitted call, where they would be packed on every call and used once).
    Everything else (embeddings, norms, relative position biases) is the same array object, so
    the packed tree does not copy it. Call it once per parameter set, outside every decode loop, and drop the raw
    tree (the packed one serves every use of the model, the teacher-forced forward included): one
    copy of each projection. It is idempotent; an already packed tree is returned as is, except
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
    dtype = check_weight_dtype(weight_dtype)
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
    reason = disabled_reason()
    if reason is None and jnp.dtype(activation_dtype) != jnp.float32:
        reason = f"activations are {jnp.dtype(activation_dtype).name}"
    if reason is None and _multi_device(jax.tree_util.tree_leaves(params)):
        reason = "parameters are (or may be) sharded over several devices"
    if reason is not None:
        _log_fallback_once(reason)
        return params

    def packer(dtype_name: str):
        def pack_dense(path, dense: dict) -> dict:
            dense = dict(dense)
            kernel = dense.pop(SHORTLIST_KERNEL_NAME if SHORTLIST_INDEX_NAME in dense else "kernel")
            if kernel.ndim == 3:  # scanned layers: [layers, K, N] -> [layers, P, K, 32]
                dense[PACKED_NAME] = jax.vmap(lambda w: pack(w, dtype_name))(kernel)
            else:
                dense[PACKED_NAME] = pack(kernel, dtype_name)
            return dense

        return pack_dense

    out = _map_projections(params, packer(weight_dtype))
    if setup_enabled() and not _traced(params, _setup_paths(params)):
        out = _map_projections(out, packer("float32"), _setup_paths(out))
    return out


def _traced(params, paths) -> bool:
    """Whether any kernel at `paths` is a tracer: packing inside a traced call (a jitted
    `predict_batch_with_aux` over raw parameters) happens on every call, and a set-up projection
    is used once per call, so packing it there would cost about what it saves."""
    return any(isinstance(_node(params, p).get("kernel"), jax.core.Tracer) for p in paths)


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
            name, n = SHORTLIST_KERNEL_NAME, packed.shape[-3] * PANEL
        else:
            name, n = "kernel", int(out_features(path))
        dense[name] = jax.vmap(lambda w: unpack(w, n))(packed) if scanned else unpack(packed, n)
        return dense

    out = _map_projections(params, unpack_dense)
    return _map_projections(out, unpack_dense, _setup_paths(out))
