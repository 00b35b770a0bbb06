"""Kernel or XLA, chosen by measurement: for each decoder projection shape, rows bucket, code path
and weight dtype, the fastest of {the kernel split over XLA's intra-op threads ('split'), the
kernel on the calling thread ('single'), XLA's `jnp.dot` on the raw kernel ('xla')}.

Off by default (`SPECDEC_CPU_CHOICE=auto` turns it on): on the shared 2-core Zen 5 VM this was
built on (load 12-16), the isolated per-product timing did not predict the products' cost inside
a decoder step: it found the one-thread kernel fastest for most shapes, and steps with those
choices ran 1.2-3x slower than with the size rule (results/verify_cost/choice/README.md).

* When (mode 'auto'): `pack_params` calls `ensure` for the decode projections' distinct `[K, N]` shapes (outside
  any trace). Each (shape, bucket) not yet in the cache is timed once (`measure`: a few
  milliseconds per shape and bucket, plus two compilations); the results go to a small JSON cache
  file, so a later process on the same CPU pays nothing.
* What: `choose(K, N, rows, dtype, xla_available)`, read when a step is traced (static: a Python
  string), returns the candidate with the smallest measured median among those available ('xla'
  only where the tree kept the raw kernel: `pack_params` keeps it beside the panels where XLA won
  some bucket). Not measured (rows >= 32, a set-up projection, a shape packed inside a trace, a
  failed measurement): 'auto', the size rule of earlier builds (`set_split_bytes`).
* Rows buckets (`BUCKETS`): M rows use the measurement at the largest power of two <= M, up to 16
  (M = 1 | 2-3 | 4-7 | 8-15 | 16-31); M >= 32 is not measured.
* Cache key: `identity()` (CPU vendor / family / model / stepping / name / SIMD flags, XLA's
  intra-op thread count, a digest of the extension's build, `VERSION`), the code path
  (`extension.isa()`, forced or detected), the weight dtype, K, N and the bucket. Another CPU, a
  rebuilt extension or a forced path misses and is measured; an unreadable or corrupt file is
  measured again (logged), never an error.

Switches: `SPECDEC_CPU_CHOICE` (`ENV_VAR`): 'threshold' (default: the size rule, nothing
measured, the behaviour of earlier builds), 'auto' (measured), or one candidate forced for every
product ('split', 'single', 'xla': XLA where the raw kernel is kept, and `pack_params` keeps it for
every decode projection); read when packing and when tracing. `SPECDEC_CPU_CHOICE_CACHE` (`CACHE_ENV_VAR`): the cache file (default
`$XDG_CACHE_HOME/specdec_t5x/cpu_choice.json`, `~/.cache` without XDG_CACHE_HOME); '0' or 'off':
no file (measured once per process).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import logging
import os
import pathlib
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.cpu_kernel import extension, ops

ENV_VAR = "SPECDEC_CPU_CHOICE"
CACHE_ENV_VAR = "SPECDEC_CPU_CHOICE_CACHE"
MODES = ("auto", "threshold", "split", "single", "xla")
CANDIDATES = ("split", "single", "xla")  # in this order of preference on equal medians
BUCKETS = (1, 2, 4, 8, 16)
XLA_MARGIN = 0.25  # XLA is chosen only when more than 25 % faster than the kernel's best
VERSION = 2  # bump when what is measured changes: old entries then miss
# A choice -> the kernel's `threads` attribute ('xla' never reaches the kernel).
THREADS = {
    "auto": extension.THREADS_AUTO,
    "threshold": extension.THREADS_AUTO,
    "split": extension.THREADS_SPLIT,
    "single": extension.THREADS_ONE,
}
_ROUNDS = 7  # interleaved rounds per (shape, bucket); the median decides
# Weight copies rotated per timed call (at most 4): ~4 MiB, more than this CPU's L2, so each
# product streams its weights from L3 or DRAM as in a step (every compiled copy costs start time).
_COPIES_BYTES = 4 << 20
_CALL_BYTES = 16 << 20  # weight bytes read per timed call (many products for small shapes)
_log = logging.getLogger(__package__)

# A timer for tests: (candidate, K, N, rows, dtype) -> seconds per product.
Timer = Callable[[str, int, int, int, str], float]

_entries: dict[str, dict[str, Any]] = {}  # key -> {'s': {candidate: seconds}, ...}; this process
_file_read: set[str] = set()  # cache files already merged into _entries


DEFAULT_MODE = "threshold"  # see the module docstring for why not 'auto'


def mode() -> str:
    """`SPECDEC_CPU_CHOICE` (`DEFAULT_MODE` if unset or empty). Raises ValueError naming the bad
    value otherwise."""
    value = os.environ.get(ENV_VAR, DEFAULT_MODE).strip().lower() or DEFAULT_MODE
    if value not in MODES:
        raise ValueError(f"{ENV_VAR}={value!r}: expected one of {list(MODES)}.")
    return value


def cache_path() -> pathlib.Path | None:
    """The cache file (`SPECDEC_CPU_CHOICE_CACHE`, else `$XDG_CACHE_HOME` or `~/.cache`
    `/specdec_t5x/cpu_choice.json`); None when set to '0', 'off' or ''."""
    value = os.environ.get(CACHE_ENV_VAR)
    if value is not None:
        value = value.strip()
        return None if value.lower() in ("", "0", "off") else pathlib.Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "specdec_t5x" / "cpu_choice.json"


def rows_bucket(rows: int) -> int | None:
    """The bucket (`BUCKETS`) whose measurement serves `rows` rows; None for rows >= 32."""
    if rows < 1 or rows >= 2 * BUCKETS[-1]:
        return None
    return max(b for b in BUCKETS if b <= rows)


@functools.cache
def _extension_digest() -> str:
    lib = extension.library()
    if lib is None:
        return "none"
    try:
        return hashlib.sha256(pathlib.Path(lib._name).read_bytes()).hexdigest()[:16]
    except OSError:
        return "unreadable"


def identity() -> dict[str, Any]:
    """What a measurement depends on besides path, dtype and shape: the CPU (`provenance.
    cpu_identity` without its kernel path), XLA's intra-op thread count (the CPUs this process may
    run on), the extension build's digest and `VERSION`."""
    from specdec_t5x import provenance  # imports cpu_kernel: late

    cpu = {k: v for k, v in provenance.cpu_identity().items() if k != "kernel_path"}
    try:
        threads = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        threads = os.cpu_count()
    return {"cpu": cpu, "threads": threads, "extension": _extension_digest(), "version": VERSION}


@functools.cache
def _identity_hash() -> str:
    return hashlib.sha256(json.dumps(identity(), sort_keys=True).encode()).hexdigest()[:16]


def key(isa: str | None, dtype: str, k: int, n: int, bucket: int) -> str:
    """The cache key of one measurement (this CPU's `identity()` included)."""
    return f"{_identity_hash()}|{isa}|{dtype}|{k}x{n}|m{bucket}"


def _read_file() -> None:
    """Merges the cache file's entries into this process's table once per path; an unreadable or
    malformed file is ignored (its shapes are measured again and the file rewritten)."""
    path = cache_path()
    if path is None or str(path) in _file_read:
        return
    _file_read.add(str(path))
    try:
        data = json.loads(path.read_text())
        entries = data["entries"]
        if data.get("version") != VERSION or not isinstance(entries, dict):
            raise ValueError(f"version {data.get('version')!r}")
        good = {
            k: e
            for k, e in entries.items()
            if isinstance(e, dict)
            and isinstance(e.get("s"), dict)
            and all(isinstance(t, (int, float)) and t > 0 for t in e["s"].values())
            and set(e["s"]) <= set(CANDIDATES)
        }
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as err:
        _log.warning("CPU kernel choice cache %s unreadable (%s): measuring again.", path, err)
        return
    for k, e in good.items():
        _entries.setdefault(k, e)


def _write_file(new: dict[str, dict[str, Any]]) -> None:
    """Adds `new` to the cache file (read, merge, atomic replace); failures are logged only."""
    path = cache_path()
    if path is None or not new:
        return
    try:
        try:
            data = json.loads(path.read_text())
            entries = data["entries"] if data.get("version") == VERSION else {}
            if not isinstance(entries, dict):
                entries = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            entries = {}
        entries.update(new)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as f:
            json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError as err:
        _log.warning("CPU kernel choice cache %s not written (%s).", path, err)


def clear_memory() -> None:
    """Forgets this process's table and which cache files were read (tests; a changed
    SPECDEC_CPU_CHOICE_CACHE is read afresh)."""
    _entries.clear()
    _file_read.clear()
    _identity_hash.cache_clear()


def entry(isa: str | None, dtype: str, k: int, n: int, bucket: int) -> dict[str, Any] | None:
    """The measurement of one key ({'s': {candidate: seconds per product}, ...}) from this
    process's table or the cache file; None if neither has it."""
    _read_file()
    return _entries.get(key(isa, dtype, k, n, bucket))


def _best(seconds: dict[str, float], allowed: Iterable[str]) -> str | None:
    """The fastest allowed candidate; 'xla' only if faster than both kernel candidates by more
    than `XLA_MARGIN` (choosing it keeps a second copy of the weights; a tie is noise)."""
    have = [c for c in CANDIDATES if c in allowed and c in seconds]
    if not have:
        return None
    best = min(have, key=lambda c: seconds[c])
    kernel = [c for c in have if c != "xla"]
    if best == "xla" and kernel:
        fastest = min(kernel, key=lambda c: seconds[c])
        if seconds["xla"] * (1 + XLA_MARGIN) >= seconds[fastest]:
            return fastest
    return best


def choose(k: int, n: int, rows: int, dtype: str, xla_available: bool) -> str:
    """The product to run for x float32 [rows, k] @ W [k, n] stored as `dtype` ('float32' /
    'bfloat16'), on the current code path; read at trace time (static).

    Args:
      k, n: the projection's shape (n: the `features` the layer passes to `ops.dense`).
      rows: M, the rows of the product (batch x tokens of the step).
      dtype: the packed weights' dtype name.
      xla_available: whether the raw kernel is at hand (else 'xla' is never returned).

    Returns:
      'split', 'single', 'xla', or 'auto' (the size rule: not measured, or SPECDEC_CPU_CHOICE=
      threshold, or 'xla' forced without a raw kernel).

    Raises:
      ValueError: a bad SPECDEC_CPU_CHOICE.
    """
    how = mode()
    if how == "threshold":
        return "auto"
    if how != "auto":
        return how if how != "xla" or xla_available else "auto"
    bucket = rows_bucket(rows)
    e = None if bucket is None else entry(extension.isa(), dtype, k, n, bucket)
    if e is None:
        return "auto"
    allowed = CANDIDATES if xla_available else CANDIDATES[:2]
    return _best(e["s"], allowed) or "auto"


def keep_raw(k: int, n: int, dtype: str) -> bool:
    """Whether `pack_params` should keep a decode projection's raw kernel beside its panels:
    SPECDEC_CPU_CHOICE=xla, or (auto) XLA measured fastest for some bucket on the current path."""
    how = mode()
    if how == "xla":
        return True
    if how != "auto":
        return False
    for b in BUCKETS:
        e = entry(extension.isa(), dtype, k, n, b)
        if e is not None and _best(e["s"], CANDIDATES) == "xla":
            return True
    return False


def ensure(shapes: Iterable[tuple[int, int]], dtype: str, timer: Timer | None = None) -> dict:
    """Measures every (shape, bucket) of `shapes` not yet known on the current code path (in
    mode 'auto'; otherwise nothing) and stores the results in this process and the cache file.

    Args:
      shapes: [(K, N)] projection shapes (N as `ops.dense` is given it).
      dtype: packed weight dtype name, 'float32' or 'bfloat16'.
      timer: seconds per product for (candidate, K, N, rows, dtype); None: `measure` (real).

    Returns:
      {'measured': number of (shape, bucket) timed now, 'seconds': wall time spent, 'cached':
      number found in the table or file}.

    Raises:
      ValueError: a bad SPECDEC_CPU_CHOICE or weight dtype.
    """
    ops.check_weight_dtype(dtype)
    out = {"measured": 0, "seconds": 0.0, "cached": 0}
    if mode() != "auto" or not extension.available():
        return out
    isa = extension.isa()
    start = time.perf_counter()
    new = {}
    for k, n in sorted(set(shapes)):
        missing = [b for b in BUCKETS if entry(isa, dtype, k, n, b) is None]
        out["cached"] += len(BUCKETS) - len(missing)
        if not missing:
            continue
        try:
            if timer is not None:
                timed = {
                    b: {c: float(timer(c, k, n, b, dtype)) for c in CANDIDATES} for b in missing
                }
            else:
                timed = measure_buckets(k, n, dtype, missing)
        except Exception as err:  # noqa: BLE001 - a failed timing leaves the size rule
            _log.warning("CPU kernel choice: timing %dx%d (%s) failed: %s.", k, n, dtype, err)
            continue
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for b, seconds in timed.items():
            new[key(isa, dtype, k, n, b)] = {
                "s": seconds,
                "choice": _best(seconds, CANDIDATES),
                "isa": isa,
                "dtype": dtype,
                "shape": [k, n],
                "rows": b,
                "date": date,
            }
            out["measured"] += 1
    _entries.update(new)
    _write_file(new)
    out["seconds"] = time.perf_counter() - start
    if out["measured"]:
        _log.info(
            "CPU kernel choice: timed %d (shape, rows) on %s %s in %.2f s.",
            out["measured"],
            isa,
            dtype,
            out["seconds"],
        )
    return out


def _loop(prod: Callable, iters: int):
    """jit (bucket index, x [BUCKETS[-1], K], *weight copies): for rows = BUCKETS[index], `iters` x
    (number of copies) products x[:rows] @ w over the copies in turn inside one fori_loop, each
    input depending on the previous output (nothing is hoisted or skipped). One compilation serves
    every bucket (`lax.switch`)."""

    def run(index, x, *ws):
        def branch(rows):
            def go(x):
                def body(i, carry):
                    x, acc = carry
                    for w in ws:
                        acc = acc + prod(x + 1e-30 * acc, w)[0, 0]
                    return x, acc

                return jax.lax.fori_loop(0, iters, body, (x[:rows], jnp.float32(0)))[1]

            return go

        return jax.lax.switch(index, [branch(b) for b in BUCKETS], x)

    return jax.jit(run)


def measure_buckets(
    k: int, n: int, dtype: str, buckets: Iterable[int] = BUCKETS, rounds: int = _ROUNDS
) -> dict[int, dict[str, float]]:
    """Times the three candidates for x float32 [rows, k] @ W [k, n] for every rows bucket (W as
    `dtype` for the kernel, float32 for XLA, as with the kernel off) on the current code path:
    weight copies of ~4 MiB in all rotated (streamed as in a step), ~16 MiB read per timed call,
    `rounds` interleaved rounds, each in a random order; the kernel is compiled once and its
    thread use switched by `set_split_bytes` (0: split, huge: one thread; the behaviour of
    `THREADS_SPLIT` / `THREADS_ONE`).

    Returns:
      {rows: {'split', 'single', 'xla': median seconds per product}}.

    Raises:
      RuntimeError: the extension is missing. ValueError: a bucket not in `BUCKETS`.
    """
    if not extension.available():
        raise RuntimeError("the CPU kernel extension is not built.")
    buckets = list(buckets)
    if not set(buckets) <= set(BUCKETS):
        raise ValueError(f"buckets {buckets} not all in {BUCKETS}.")
    panels = -(-n // ops.PANEL)
    wbytes = panels * ops.PANEL * k * jnp.dtype(ops.WEIGHT_DTYPES[dtype]).itemsize
    copies = int(min(4, max(1, -(-_COPIES_BYTES // wbytes))))
    iters = int(max(1, -(-_CALL_BYTES // wbytes) // copies))
    products = iters * copies
    raw = [jnp.full((k, n), 1.0 / (k + c), jnp.float32) for c in range(copies)]
    packed = [ops.pack(w, dtype) for w in raw]
    x = jnp.full((BUCKETS[-1], k), 0.5, jnp.float32)
    index = np.int32(0)
    programs = [
        (_loop(lambda a, w: ops.matmul(a, w, n), iters), packed),
        (_loop(jnp.dot, iters), raw),
    ]
    # Both compiled at once (XLA compiles outside the GIL): most of the start cost.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        kern, xla = pool.map(lambda p: p[0].lower(index, x, *p[1]).compile(), programs)
    calls = {}
    for b in buckets:
        i = np.int32(BUCKETS.index(b))
        calls[(b, "split")] = (0, functools.partial(kern, i, x, *packed))
        calls[(b, "single")] = (1 << 62, functools.partial(kern, i, x, *packed))
        calls[(b, "xla")] = (None, functools.partial(xla, i, x, *raw))
    times: dict[Any, list[float]] = {c: [] for c in calls}
    old = extension.set_split_bytes(0)
    try:
        for r in range(rounds + 1):  # round 0: compile and warm up
            order = list(calls)
            random.Random(r).shuffle(order)
            for c in order:
                split_bytes, call = calls[c]
                if split_bytes is not None:
                    extension.set_split_bytes(split_bytes)
                t0 = time.perf_counter()
                jax.block_until_ready(call())
                if r:
                    times[c].append((time.perf_counter() - t0) / products)
    finally:
        extension.set_split_bytes(old)
    out: dict[int, dict[str, float]] = {}
    for (b, c), t in times.items():
        out.setdefault(b, {})[c] = float(np.median(t))
    return out


def measure(k: int, n: int, rows: int, dtype: str, rounds: int = _ROUNDS) -> dict[str, float]:
    """`measure_buckets` for one bucket `rows`: {'split', 'single', 'xla': median s / product}."""
    return measure_buckets(k, n, dtype, [rows], rounds)[rows]
