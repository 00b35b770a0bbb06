"""The kernel's operations: packing one matrix into panels, the panel matmul, fused attention.

Each runs the FFI kernel on CPU and an XLA reference elsewhere (`lax.platform_dependent`);
differentiating them raises (inference only; train on raw parameters).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.cpu_kernel import extension

Array = jax.Array

PANEL = 32  # output columns per packed panel
WEIGHT_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_weight_dtype(weight_dtype: str) -> Any:
    """The jnp dtype of a weight_dtype name; ValueError naming the bad value otherwise."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(
            f"cpu_weight_dtype (the CPU kernel's weight storage) must be one of "
            f"{sorted(WEIGHT_DTYPES)}; got {weight_dtype!r}."
        )
    return WEIGHT_DTYPES[weight_dtype]


def pack_reference(kernel: Array, dtype: Any) -> Array:
    """What `pack` computes, in XLA ops (the other platforms' path and the tests' reference):
    `dtype [ceil(N / 32), K, 32]` from a float [K, N] kernel."""
    k, n = kernel.shape
    panels = -(-n // PANEL)
    w = jnp.pad(kernel.astype(dtype), ((0, 0), (0, panels * PANEL - n)))
    return w.reshape(k, panels, PANEL).transpose(1, 0, 2)


@functools.partial(jax.jit, static_argnames="weight_dtype")
def _pack(kernel: Array, weight_dtype: str) -> Array:
    dtype = WEIGHT_DTYPES[weight_dtype]
    if not extension.available():
        return pack_reference(kernel, dtype)
    # On CPU one streaming pass in C++ (XLA's pad + transpose is ~5x slower; packing inside a
    # jitted predict call must stay cheap next to the decode).
    k, n = kernel.shape
    out = jax.ShapeDtypeStruct((-(-n // PANEL), k, PANEL), dtype)
    return jax.lax.platform_dependent(
        kernel.astype(jnp.float32),
        cpu=jax.ffi.ffi_call(extension.PACK_TARGET, out, vmap_method="expand_dims"),
        default=lambda w: pack_reference(w, dtype),
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


def _ffi_matmul(x2: Array, packed: Array, n: int, threads: int) -> Array:
    out = jax.ShapeDtypeStruct((x2.shape[0], n), jnp.float32)
    if threads == extension.THREADS_AUTO:  # the size rule: the plain target (as earlier builds)
        call = jax.ffi.ffi_call(extension.MATMUL_TARGET, out, vmap_method="expand_dims")
        return call(x2, packed, n=np.int32(n))
    # vmap_method: the handler folds/loops leading (vmapped) axes itself.
    call = jax.ffi.ffi_call(extension.MATMUL_THREADS_TARGET, out, vmap_method="expand_dims")
    return call(x2, packed, n=np.int32(n), threads=np.int32(threads))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _matmul2d(x2: Array, packed: Array, n: int, threads: int) -> Array:
    return jax.lax.platform_dependent(
        x2,
        packed,
        cpu=lambda a, w: _ffi_matmul(a, w, n, threads),
        default=lambda a, w: jnp.dot(a, unpack(w, n)),
    )


@_matmul2d.defjvp
def _matmul2d_jvp(n, threads, primals, tangents):
    raise NotImplementedError(
        "cpu_kernel.matmul is inference-only and has no derivative: differentiate a model with "
        f"its raw (unpacked) parameters, or set {extension.ENV_VAR}=0."
    )


def matmul(x: Array, packed: Array, n: int, threads: int = extension.THREADS_AUTO) -> Array:
    """`x @ W` for a packed W (see `pack`), through the FFI kernel on CPU.

    Args:
      x: float32 [..., K] activations (any leading shape; all rows share one pass over W).
      packed: float32 or bfloat16 [ceil(n / 32), K, 32] from `pack`.
      n: columns N of the original matrix.
      threads: static; `extension.THREADS_AUTO` (0, default: split over XLA's intra-op threads
        from `set_split_bytes` of packed weights on), `THREADS_ONE` (1: the calling thread only)
        or `THREADS_SPLIT` (2: split whatever the size). The result is bit-identical for all
        three (each output column is summed by the same code in the same order).

    Returns:
      float32 [..., n].

    Raises:
      ValueError: x not float32, shapes that do not match, a zero-size operand, or another
        `threads` value.
      NotImplementedError: when differentiated.
    """
    if threads not in (extension.THREADS_AUTO, extension.THREADS_ONE, extension.THREADS_SPLIT):
        raise ValueError(f"matmul: threads must be 0, 1 or 2; got {threads!r}.")
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
    return _matmul2d(x.reshape(-1, k), packed, int(n), int(threads)).reshape(*lead, n)


def attention_reference(q: Array, k: Array, v: Array, bias: Array) -> Array:
    """What `attention` computes, in XLA ops (the other platforms' path and the tests' reference).

    Same arguments and result as `attention`."""
    logits = jnp.einsum("bqhd,bhkd->bhqk", q, k) + bias
    weights = jax.nn.softmax(logits)
    return jnp.einsum("bhqk,bhkd->bqhd", weights, v)


def _ffi_attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
    call = jax.ffi.ffi_call(
        extension.ATTENTION_TARGET,
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
        f"with its raw (unpacked) parameters, or set {extension.ENV_VAR}=0."
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
    extension.library()  # registers the FFI target (needed on CPU, harmless elsewhere)
    return _attention(q, k, v, bias)


def dense(x: Array, packed: Array, features: int, dtype: Any, kernel: Array | None = None) -> Array:
    """A bias-free Dense layer on a packed kernel (used by `network.Dense` when its parameter is
    `kernel_packed`), on the product `choice.choose` picks for its shape and rows at trace time.

    Args:
      x: [..., K] activations (any float dtype).
      packed: float32 / bfloat16 [ceil(features / 32), K, 32] from `pack`.
      features: N, the layer's output width.
      dtype: the layer's activation dtype.
      kernel: the raw float [K, features] kernel when the tree kept it (`pack_params` does where
        XLA's dot measured faster for some rows bucket), else None (XLA is then not a candidate).

    Returns:
      dtype [..., features]: with the choice 'xla', `jnp.dot(x.astype(dtype),
      kernel.astype(dtype))`, the very op `network.Dense` runs with the kernel off; otherwise the
      kernel's product in float32 (`matmul`, same floats whatever the thread choice), cast.

    Raises:
      ValueError: as `matmul`.
    """
    from specdec_t5x.cpu_kernel import choice  # choice imports ops

    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    how = choice.choose(
        packed.shape[-2], features, rows, jnp.dtype(packed.dtype).name, kernel is not None
    )
    if how == "xla":
        return jnp.dot(x.astype(dtype), kernel.astype(dtype))
    return matmul(x.astype(jnp.float32), packed, features, choice.THREADS[how]).astype(dtype)
