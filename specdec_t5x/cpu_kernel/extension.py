"""The compiled extension (`matmul.cc`, `attention.cc`): loading, FFI registration, switches.

`library()` loads `_matmul*.so` once and registers its XLA FFI targets (`MATMUL_TARGET`,
`PACK_TARGET`, `ATTENTION_TARGET`) for the CPU platform; None when the extension is missing or
stale (then every projection stays `jnp.dot`, logged once). The environment switches
(`ENV_VAR`, `ATTENTION_ENV_VAR`, `SETUP_ENV_VAR`) are read when a function is traced or a tree
packed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.machinery
import logging
import os
import pathlib

import jax

ENV_VAR = "SPECDEC_CPU_KERNEL"  # "0" turns the kernel off
ATTENTION_ENV_VAR = "SPECDEC_CPU_ATTENTION"  # "0" keeps XLA's attention with packed weights (A/B)
# "0" leaves the set-up projections (encoder, cross-attention K/V) on jnp.dot when packing (A/B).
SETUP_ENV_VAR = "SPECDEC_CPU_KERNEL_SETUP"
# A code path to force for the whole process ('avx2+fma', 'portable'; read when the extension
# loads): runs the AVX2 path on an AVX-512 machine for A/B timing; unset: the detected path.
ISA_ENV_VAR = "SPECDEC_CPU_ISA"
MATMUL_TARGET = "specdec_matmul"  # FFI target names, as the custom calls appear in HLO
# The matmul with its thread use fixed by a static `threads` attribute (THREADS_*; `choice`).
MATMUL_THREADS_TARGET = "specdec_matmul_threads"
PACK_TARGET = "specdec_pack"
ATTENTION_TARGET = "specdec_attention"
_ISAS = {"portable": 0, "avx2+fma": 1, "avx512f": 2}
# `threads` of MATMUL_THREADS_TARGET: the size rule (`set_split_bytes`; MATMUL_TARGET's behaviour),
# the calling thread only, or split over XLA's intra-op pool whatever the size. Same floats.
THREADS_AUTO, THREADS_ONE, THREADS_SPLIT = 0, 1, 2
_log = logging.getLogger(__package__)


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


@functools.cache
def library() -> ctypes.CDLL | None:
    """Loads the compiled extension and registers its FFI target once; None if it is missing."""
    here = pathlib.Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_matmul{suffix}"
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            if not hasattr(lib, "SpecdecMatmulThreads"):  # built from an older source tree
                log_fallback_once(f"{path.name} is stale: rebuild it with `pip install -e .`")
                return None
            lib.SpecdecMatmulIsa.restype = ctypes.c_char_p
            lib.SpecdecMatmulSetSplitBytes.restype = ctypes.c_int64
            lib.SpecdecMatmulSetSplitBytes.argtypes = [ctypes.c_int64]
            lib.SpecdecMatmulSplitCalls.restype = ctypes.c_int64
            lib.SpecdecMatmulPoolThreads.restype = ctypes.c_int64
            for target, symbol in (
                (MATMUL_TARGET, lib.SpecdecMatmul),
                (MATMUL_THREADS_TARGET, lib.SpecdecMatmulThreads),
                (PACK_TARGET, lib.SpecdecPack),
                (ATTENTION_TARGET, lib.SpecdecAttention),
            ):
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
            forced = os.environ.get(ISA_ENV_VAR, "").strip()
            if forced and not lib.SpecdecMatmulForceIsa(_ISAS.get(forced, 99)):
                raise RuntimeError(
                    f"{ISA_ENV_VAR}={forced!r}: not a code path this CPU runs (this CPU's: "
                    f"{lib.SpecdecMatmulIsa().decode()}; expected one of {sorted(_ISAS)} up to it)."
                )
            return lib
    return None


def kernel_path() -> str:
    """The CPU kernel's code path decoding would take now: 'avx512f', 'avx2+fma', 'portable' (forced
    or detected), or 'off (<why>)' (`disabled_reason`). Recorded with every result."""
    reason = disabled_reason()
    return f"off ({reason})" if reason else str(isa())


def available() -> bool:
    """Whether the compiled extension is present (built by `pip install`)."""
    return library() is not None


def isa() -> str | None:
    """Code path the kernel runs on this CPU: 'avx512f', 'avx2+fma', 'portable' (None: no build)."""
    lib = library()
    return None if lib is None else lib.SpecdecMatmulIsa().decode()


def force_isa(name: str | None) -> None:
    """Forces a code path ('portable', 'avx2+fma', 'avx512f'; None: the detected one). For tests
    and A/B timing. Raises RuntimeError if the extension is missing or this CPU lacks that path."""
    lib = library()
    which = -1 if name is None else _ISAS.get(name)
    if lib is None or which is None or not lib.SpecdecMatmulForceIsa(which):
        raise RuntimeError(f"cannot force the kernel code path {name!r} here (isa: {isa()}).")


def set_split_bytes(nbytes: int) -> int:
    """Sets the packed-weight size (bytes) from which one product is split over XLA's intra-op
    threads (default 64 KiB; a huge value keeps every product on the calling thread). For tests and
    A/B timing. Returns the previous value. Raises RuntimeError if the extension is missing."""
    lib = library()
    if lib is None:
        raise RuntimeError("the CPU kernel extension is not built.")
    return int(lib.SpecdecMatmulSetSplitBytes(int(nbytes)))


def split_stats() -> tuple[int, int]:
    """(products split over threads so far in this process, threads XLA's intra-op pool reported
    to the last kernel call). For tests. Raises RuntimeError if the extension is missing."""
    lib = library()
    if lib is None:
        raise RuntimeError("the CPU kernel extension is not built.")
    return int(lib.SpecdecMatmulSplitCalls()), int(lib.SpecdecMatmulPoolThreads())


@functools.cache
def log_fallback_once(reason: str) -> None:
    """Logs once per reason that the kernel is not used (decoder projections on jnp.dot)."""
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


def attention_enabled() -> bool:
    """Whether packed decoder layers use the fused `attention` (SPECDEC_CPU_ATTENTION, default on;
    read when a step is traced). With it off they keep XLA's dots and softmax (for A/B timing)."""
    return os.environ.get(ATTENTION_ENV_VAR, "1").strip() != "0"


def setup_enabled() -> bool:
    """Whether `pack_params` packs the set-up projections too (`SPECDEC_CPU_KERNEL_SETUP`, on by
    default): the encoder's and the cross-attention K/V, float32 panels whatever the weight dtype.
    Read when packing."""
    return os.environ.get(SETUP_ENV_VAR, "1").strip() != "0"
