"""Where a decoder step's CPU time goes: per-op thunk time, the machine's roofline, isolated dots.

Three probes used by `verify_cost` (scripts/profile_verify.py) to explain the cost of the k-token
verify step (Leviathan et al., 2022, §3.4 assume it costs about one token's step):

* `thunk_time_by_category`: runs a jitted function under `jax.profiler.trace` and sums XLA's
  per-thunk TraceMe events by category (weight matmuls, logits matmul, attention dots, K/V layout
  copies, softmax, ...). The events exist only when the process set
  `--xla_cpu_enable_xprof_traceme=true` in `XLA_FLAGS` before the backend started
  (`verify_cost.configure_process`); without it every category is empty.
* `roofline`: this machine's float32 GEMM rate and weight-streaming GEMV bandwidth, and the
  bandwidth/compute bound max(weight bytes / bandwidth, FLOPs / GEMM rate) of a k-token step.
* `dot_curves`: x [M, in] @ W [in, out] alone for M = 1, 2, 4, 8, with W streamed from DRAM (and
  optionally cache-hot), through XLA's dot and the CPU kernel (`cpu_kernel.matmul`).

Timings use `clock.time_interleaved` (interleaved rounds, medians).
"""

from __future__ import annotations

import collections
import functools
import glob
import gzip
import json
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel
from specdec_t5x.timing import clock

_WEIGHT_OPS = ("query", "key", "value", "out", "wi", "wi_0", "wi_1", "wo")


def _category(op: str, shape: str, op_name: str, dims: Mapping[str, int]) -> str:
    """Coarse category of one thunk; fusions containing a dot are labelled by that dot."""
    shape = shape.split("{")[0]  # drop the layout
    if op == "custom-call":  # `cpu_kernel.attention` (rank 4 out) or `cpu_kernel.matmul` (rank 2)
        return "CPU kernel attention" if shape.count(",") == 3 else "CPU kernel matmuls"
    if op == "dot":  # k = 1 GEMVs carry no op_name: weight dots are rank 2, attention dots rank 3
        if "logits_dense" in op_name or re.fullmatch(rf"f32\[\d+,{dims['vocab']}\]", shape):
            return "logits matmul"
        if any(f"/{w}/dot_general" in op_name for w in _WEIGHT_OPS) or shape.count(",") == 1:
            return "layer weight matmuls"
        return "attention dots"
    h, d = dims["heads"], dims["head_dim"]
    if op == "fusion" and re.fullmatch(rf"f32\[{h},\d+,{d}\]", shape):
        return "Q/K/V layout copies"  # [b, len, h, d] -> [h, len, d] for the batched dots
    if "scatter" in op_name:
        return "cache scatter"
    if "layer_norm" in op_name or "decoder_norm" in op_name:
        return "RMSNorm"
    if "relpos_bias" in op_name:
        return "relative position bias"
    if op == "reduce-window" or "attention" in op_name:
        return "softmax + mask"  # reduce-windows are the split max/sum reductions of softmax
    return "other"


def _instruction_labels(hlo_text: str) -> dict[str, tuple[str, str, str]]:
    """instruction -> (opcode, shape, op_name); a fusion takes its dot's, else its last op_name."""
    comps, cur, info = {}, None, {}
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            cur = comps.setdefault(head.group(1), [])
            continue
        m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
        if m:
            op_name = re.search(r'op_name="([^"]+)"', line)
            calls = re.search(r"calls=%([\w.\-]+)", line)
            info[m.group(1)] = (m.group(3), m.group(2), op_name.group(1) if op_name else "", calls)
            if cur is not None:
                cur.append(m.group(1))
    labels = {}
    for name, (op, shape, op_name, calls) in info.items():
        inner = [info[i] for i in comps.get(calls.group(1), [])] if calls else []
        dots = [x for x in inner if x[0] == "dot"]
        if dots:
            op, shape, op_name = dots[0][:3]
        elif not op_name:
            named = [x[2] for x in inner if x[2]]
            op_name = named[-1] if named else ""
        labels[name] = (op, shape, op_name)
    return labels


def thunk_time_by_category(
    fn: Callable[..., Any],
    args: Sequence[Any],
    dims: Mapping[str, int],
    steps_per_call: int = 1,
    repeats: int = 5,
) -> dict[str, float]:
    """µs per step of each thunk category of the jitted `fn(*args)`, most expensive first.

    Args:
      fn: a `jax.jit`-wrapped function (lowered and compiled here for its HLO names).
      args: its arguments.
      dims: {'vocab', 'heads', 'head_dim'} of the model (to tell the logits matmul and the
        attention layout copies apart).
      steps_per_call: decoder steps one call runs (the result is divided by calls * this).
      repeats: traced calls.

    Returns:
      {category: µs per step}; empty when XLA emitted no per-thunk events (see module docs).
    """
    labels = _instruction_labels(fn.lower(*args).compile().as_text())
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(repeats):
                jax.block_until_ready(fn(*args))
        trace = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)[0]
        events = json.load(gzip.open(trace))["traceEvents"]
    per_cat = collections.Counter()
    for ev in events:
        if ev.get("ph") == "X" and ev["name"] in labels:
            per_cat[_category(*labels[ev["name"]], dims)] += ev.get("dur", 0.0)
    return {c: us / (repeats * steps_per_call) for c, us in per_cat.most_common()}


def _median_s(fn: Callable[..., Any], *args, repeats: int = 7) -> float:
    samples = clock.time_interleaved({"fn": lambda: fn(*args)}, repeats, warmup=0)["fn"]
    return statistics.median(samples) / 1e3


def roofline(model_shapes: Mapping[str, Mapping[str, int]], ks: Sequence[int]) -> dict[str, Any]:
    """This machine's GEMM rate and GEMV bandwidth, and each model's bound on a k-token step.

    Args:
      model_shapes: name -> {'emb_dim', 'mlp_dim', 'num_heads', 'head_dim', 'vocab_size',
        'num_decoder_layers'} (float32 weights).
      ks: block sizes k (the first is the reference of `roofline_ratio`).

    Returns:
      {'gemm_gflops_1024', 'gemv_stream_gbs_64mib', 'models': {name: {
      'decoder_weight_mib_read_per_step', 'mflop_per_token', 'roofline_ms' {k: ms},
      'roofline_ratio' {k: ratio to ks[0]}}}}.
    """
    a = jnp.ones((1024, 1024), jnp.float32)
    peak = 2 * 1024**3 / _median_s(jax.jit(lambda a, b: a @ b), a, a) / 1e9
    w = jnp.ones((512, 32768), jnp.float32)  # 64 MiB: streamed from DRAM like a model's weights
    gemv_s = _median_s(jax.jit(lambda x, w: x @ w), jnp.ones((1, 512), jnp.float32), w)
    bandwidth = w.size * 4 / gemv_s / 1e9
    out = {"gemm_gflops_1024": peak, "gemv_stream_gbs_64mib": bandwidth, "models": {}}
    for name, m in model_shapes.items():
        e, f, h = m["emb_dim"], m["mlp_dim"], m["num_heads"] * m["head_dim"]
        layers = m["num_decoder_layers"]
        weights = layers * (6 * e * h + 3 * e * f) + e * m["vocab_size"]  # k/v of cross are cached
        t = {k: max(4 * weights / (bandwidth * 1e9), 2 * k * weights / (peak * 1e9)) for k in ks}
        out["models"][name] = {
            "decoder_weight_mib_read_per_step": 4 * weights / 2**20,
            "mflop_per_token": 2 * weights / 1e6,
            "roofline_ms": {str(k): 1e3 * t[k] for k in ks},
            "roofline_ratio": {str(k): t[k] / t[ks[0]] for k in ks},
        }
    return out


def _chain(x, *ws, matmul=jnp.dot):
    """The dots x @ w for every w in turn, each input depending on the previous output."""
    acc = jnp.float32(0)
    for w in ws:
        acc = acc + jnp.max(matmul(x, w))
        x = x + 1e-30 * acc
    return acc


def dot_curves(
    shapes: Iterable[tuple[int, int]],
    rounds: int,
    ms: Sequence[int] = (1, 2, 4, 8),
    hot: bool = False,
    stream_mib: int = 96,
) -> dict[str, Any]:
    """x [M, in] @ W [in, out] alone, for each (in, out) in `shapes`.

    `streamed`: n distinct float32 copies of W totalling >= `stream_mib` MiB, so every W comes from
    DRAM as in a real decoder step (`kernel_streamed` / `kernel_bf16_streamed`: the same through
    `cpu_kernel.matmul` on packed float32 / bfloat16 weights); `hot` (optional): the same W n times
    (stays in cache when it fits). The n dots are chained so they run one after another.

    Returns:
      {'<in>x<out>': {path: {M: {'us', 'gflops', 'weight_gbs', 'ratio' (to M = ms[0], same
      path), 'vs_xla_1' (to XLA's streamed M = 1 dot)}}}}; medians of per-round values.
    """
    out = {}
    for i, o in sorted(set(shapes)):
        n = max(2, -(-stream_mib * 2**20 // (4 * i * o)))
        ws = [jax.random.normal(jax.random.PRNGKey(j), (i, o), jnp.float32) for j in range(n)]
        xla = jax.jit(_chain)
        kernel = jax.jit(
            functools.partial(_chain, matmul=lambda x, w, o=o: cpu_kernel.matmul(x, w, o))
        )
        packed = {d: [cpu_kernel.pack(w, d) for w in ws] for d in ("float32", "bfloat16")}
        calls = {}
        for m in ms:
            x = jnp.ones((m, i), jnp.float32)
            if hot:
                calls[("hot", m)] = functools.partial(xla, x, *([ws[0]] * n))
            calls[("streamed", m)] = functools.partial(xla, x, *ws)
            calls[("kernel_streamed", m)] = functools.partial(kernel, x, *packed["float32"])
            calls[("kernel_bf16_streamed", m)] = functools.partial(kernel, x, *packed["bfloat16"])
        times = clock.time_interleaved(calls, rounds, warmup=1)
        times = {key: np.asarray(t) / 1e3 / n for key, t in times.items()}  # seconds per dot
        res = {}
        for (kind, m), t in times.items():
            sec = float(np.median(t))
            res.setdefault(kind, {})[str(m)] = {
                "us": 1e6 * sec,
                "gflops": 2 * m * i * o / sec / 1e9,
                "weight_gbs": 4 * i * o / sec / 1e9,
                "ratio": float(np.median(t / times[(kind, ms[0])])),
                "vs_xla_1": float(np.median(t / times[("streamed", ms[0])])),
            }
        out[f"{i}x{o}"] = res
    return out
