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

* Kernel or XLA per shape (`choice`, opt-in: SPECDEC_CPU_CHOICE=auto): for each decode projection
  shape, rows bucket, code path and weight dtype, the fastest of the kernel split over threads,
  the kernel on one thread and XLA's dot, measured once per machine when packing and cached in a
  file; by default the size rule above (README.md says why).

Modules: `extension` (loading the build, FFI registration, switches), `ops` (pack, matmul,
attention), `params` (parameter trees), `choice` (the measured choice). Their public names below are the package's surface:
`cpu_kernel.<name>`.
"""

from specdec_t5x.cpu_kernel.choice import CACHE_ENV_VAR as CHOICE_CACHE_ENV_VAR
from specdec_t5x.cpu_kernel.choice import ENV_VAR as CHOICE_ENV_VAR
from specdec_t5x.cpu_kernel.choice import choose
from specdec_t5x.cpu_kernel.extension import (
    ATTENTION_ENV_VAR,
    ATTENTION_TARGET,
    ENV_VAR,
    ISA_ENV_VAR,
    MATMUL_TARGET,
    MATMUL_THREADS_TARGET,
    PACK_TARGET,
    SETUP_ENV_VAR,
    THREADS_AUTO,
    THREADS_ONE,
    THREADS_SPLIT,
    attention_enabled,
    available,
    disabled_reason,
    env_setting,
    env_var,
    force_isa,
    isa,
    kernel_path,
    set_split_bytes,
    setup_enabled,
    split_stats,
)
from specdec_t5x.cpu_kernel.ops import (
    PANEL,
    WEIGHT_DTYPES,
    attention,
    attention_reference,
    check_weight_dtype,
    dense,
    matmul,
    pack,
    pack_reference,
    unpack,
)
from specdec_t5x.cpu_kernel.params import (
    PACKED_NAME,
    SHORTLIST_INDEX_NAME,
    SHORTLIST_KERNEL_NAME,
    is_packed,
    pack_params,
    packed_arrays,
    packed_weight_dtype,
    unpack_params,
)

__all__ = [
    "ATTENTION_ENV_VAR",
    "CHOICE_CACHE_ENV_VAR",
    "CHOICE_ENV_VAR",
    "MATMUL_THREADS_TARGET",
    "THREADS_AUTO",
    "THREADS_ONE",
    "THREADS_SPLIT",
    "choose",
    "ATTENTION_TARGET",
    "ENV_VAR",
    "MATMUL_TARGET",
    "PACKED_NAME",
    "PACK_TARGET",
    "PANEL",
    "SETUP_ENV_VAR",
    "SHORTLIST_INDEX_NAME",
    "SHORTLIST_KERNEL_NAME",
    "WEIGHT_DTYPES",
    "attention",
    "attention_enabled",
    "attention_reference",
    "available",
    "check_weight_dtype",
    "dense",
    "disabled_reason",
    "env_setting",
    "env_var",
    "force_isa",
    "ISA_ENV_VAR",
    "kernel_path",
    "is_packed",
    "isa",
    "matmul",
    "pack",
    "pack_params",
    "pack_reference",
    "packed_arrays",
    "packed_weight_dtype",
    "set_split_bytes",
    "setup_enabled",
    "split_stats",
    "unpack",
    "unpack_params",
]
