"""Cost of a k-token cached decoder step (the speculative verify call) relative to a 1-token step.

  python scripts/profile_verify.py --roofline --dots --rounds 25        # -> verify_cost.{json,md}
  python scripts/profile_verify.py --pin_cpu 1 --breakdown --dots --variants default,ynn_off \
      --tag pinned --rounds 20                                          # one core + per-op split

Random weights (timing does not depend on their values), batch 1, encoder length 64, cache length
64, block written at --position. For every (model, XLA variant, mode, k) one jitted function:

* `loop`: --loop_steps block steps inside one `lax.fori_loop` with the cache as loop carry (in-place
  cache updates, no per-call dispatch: how the samplers run). The step's tokens depend on the carry
  and the full logits are consumed, so XLA can neither hoist nor slice away any work.
* `single`: one jitted step call returning only the logits (what `benchmark.measure_step_costs` /
  the eval job time): adds Python dispatch and thread hand-off to every call.
* `single_cache`: one jitted step call that also returns the updated cache (copies it).

Calls are interleaved in rotating order; each round's time is divided by the same round's k = 1
time (same model, variant, mode), and the medians of those per-round ratios are reported (more robust
than a ratio of medians when other jobs load the machine). Variants, all timed in one process:
`before` = specdec_t5x/network.py at --before_ref (default HEAD) with default XLA options; `default`
= the working tree's network.py; `ynn_off` = the working tree's network.py compiled with YNNPACK dot
fusions disabled (Eigen dots; per-function `compiler_options`, same as
`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`). When network.py is unchanged, `before` vs
`default` shows the measurement noise.

--breakdown profiles the `loop` function at k = 1 and the largest k with XLA's per-thunk TraceMe
events and sums thunk time per category (weight matmuls, logits matmul, attention dots, K/V layout
copies, softmax, ...). --roofline measures this machine's f32 GEMM rate and weight-streaming GEMV
bandwidth and derives the bandwidth/compute roofline ratio for each k. --dots times an isolated
x [M, in] @ W [in, out] for M = 1, 2, 4, 8 on the models' MLP and logits shapes, with W cache-hot and
streamed from DRAM. Findings: results/verify_cost/README.md.

Writes <out>/verify_cost[_<tag>].json and .md (tables, command, commit, lscpu hardware, date).
"""

import argparse
import os
import sys

# variant -> (CPU weight dtype of the packed decoder, None = XLA's jnp.dot; XLA compiler options)
VARIANTS = {
    "xla": (None, None),
    "kernel": ("float32", None),
    "kernel_bf16": ("bfloat16", None),
    "ynn_off": (None, {"xla_cpu_experimental_ynn_fusion_type": ""}),
    "before": (None, None),
}
_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers")
MODELS = {  # T5 v1.1 shapes: the embedded target that ships, and T5-small.
    "embedded": dict(zip(_SHAPE, (8192, 256, 4, 4, 4), strict=True), head_dim=64, mlp_dim=1024),
    "small": dict(zip(_SHAPE, (32128, 512, 6, 8, 8), strict=True), head_dim=64, mlp_dim=1024),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="embedded,small")
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument(
        "--variants",
        default="xla,kernel,kernel_bf16",
        help="xla: jnp.dot (SPECDEC_CPU_KERNEL=0); kernel / kernel_bf16: the CPU kernel on "
        "float32 / bfloat16 packed weights; ynn_off: jnp.dot without YNNPACK dots; before: "
        "network.py at --before_ref with jnp.dot",
    )
    p.add_argument("--before_ref", default="HEAD", help="git ref of the 'before' network.py")
    p.add_argument("--modes", default="loop,single")
    p.add_argument("--position", type=int, default=32)
    p.add_argument("--enc_len", type=int, default=64)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--loop_steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--pin_cpu", type=int, default=None, help="run on this one CPU only")
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--roofline", action="store_true")
    p.add_argument("--dots", action="store_true", help="isolated x @ W timings for M = 1, 2, 4, 8")
    p.add_argument("--dots_hot", action="store_true", help="--dots also with cache-hot weights")
    p.add_argument("--tag", default="")
    p.add_argument(
        "--pause_pid_file",
        default=None,
        help="pause (SIGSTOP) this process while the interleaved rounds run, resume after",
    )
    p.add_argument("--out", default="results/verify_cost")
    return p.parse_args()


ARGS = parse_args()
if ARGS.pin_cpu is not None:  # before JAX starts its thread pools, so they inherit the mask
    os.sched_setaffinity(0, {ARGS.pin_cpu})
if ARGS.breakdown:  # per-thunk trace events; must be set before the backend is created
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
    ).strip()

import collections  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from specdec_t5x import cpu_kernel, models, network, provenance  # noqa: E402


def network_at(ref: str):
    """specdec_t5x/network.py as it is at git `ref`, imported as a separate module."""
    source = subprocess.run(
        ["git", "show", f"{ref}:specdec_t5x/network.py"], capture_output=True, text=True, check=True
    ).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "network_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("network_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["network_before"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def build(name: str, network=network):
    cfg = network.T5Config(
        **MODELS[name], dtype="float32", mlp_activations=("gelu", "linear"), dropout_rate=0.0
    )
    module = network.Transformer(cfg)
    ones = jnp.ones((1, 4), jnp.int32)
    params = module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)["params"]
    enc = jax.random.randint(jax.random.PRNGKey(1), (1, ARGS.enc_len), 2, cfg.vocab_size)
    enc = enc.astype(jnp.int32)
    model = models.EncoderDecoderModel(module)
    cache = jax.jit(lambda p, e: model.decoder_state(p, e, ARGS.max_len)[0])(params, enc)
    return module, params, enc, cache


def make_fn(module, mode: str, compiler_options):
    """jitted (params, enc, cache, tokens [1, k], positions [1]) -> something to block on."""

    def step(params, enc, tokens, positions, cache):
        return models.make_block_step(module, params, enc)(tokens, positions, cache)

    if mode == "loop":

        def fn(params, enc, cache, tokens, positions):
            def body(i, carry):
                cache, acc = carry
                toks = tokens + (acc > 1e30).astype(jnp.int32)  # carry-dependent: no hoisting
                logits, cache = step(params, enc, toks, positions, cache)
                return cache, acc + jnp.max(logits)  # every logit is needed

            return jax.lax.fori_loop(0, ARGS.loop_steps, body, (cache, jnp.float32(0)))[1]

    elif mode == "single":
        fn = lambda p, e, c, t, ps: step(p, e, t, ps, c)[0]
    else:
        fn = lambda p, e, c, t, ps: step(p, e, t, ps, c)
    return jax.jit(fn, compiler_options=compiler_options)


def time_all(calls: dict, rounds: int) -> dict:
    """{key: (thunk, steps per call)} -> {key: per-step seconds list}, interleaved and rotated."""
    for thunk, _ in calls.values():
        jax.block_until_ready(thunk())
        jax.block_until_ready(thunk())
    keys, times = list(calls), {k: [] for k in calls}
    for r in range(rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            thunk, steps = calls[key]
            start = time.perf_counter()
            jax.block_until_ready(thunk())
            times[key].append((time.perf_counter() - start) / steps)
    return times


@contextlib.contextmanager
def paused(pid_file: str | None):
    """SIGSTOP the process in `pid_file` (e.g. a background training job) while timing; SIGCONT
    after, whatever happens. No-op without a file."""
    pid = int(pathlib.Path(pid_file).read_text().strip()) if pid_file else None
    if pid:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)


def measure(name: str, ks, variants, modes) -> dict:
    built = {"after": build(name)}
    if "before" in variants:
        built["before"] = build(name, network_at(ARGS.before_ref))
    pos = jnp.full((1,), ARGS.position, jnp.int32)
    calls = {}
    for variant in variants:
        module, params, enc, cache = built["before" if variant == "before" else "after"]
        weight_dtype, options = VARIANTS[variant]
        if weight_dtype is not None:  # packed once, outside the timed loop (as the eval job)
            params = models.pack_params(module, params, weight_dtype)
            assert cpu_kernel.is_packed(params), cpu_kernel.disabled_reason()
        for mode in modes:
            fn = make_fn(module, mode, options)
            steps = ARGS.loop_steps if mode == "loop" else 1
            for k in ks:
                toks = jnp.full((1, k), 3, jnp.int32)
                thunk = lambda fn=fn, t=toks, p=params, e=enc, c=cache: fn(p, e, c, t, pos)
                with cpu_kernel.env_setting(weight_dtype is not None):
                    jax.block_until_ready(thunk())  # traces (and compiles) under that setting
                calls[(variant, mode, k)] = (thunk, steps)
    with paused(ARGS.pause_pid_file):
        times = time_all(calls, ARGS.rounds)
    out = {}
    for (variant, mode, k), t in times.items():
        ratio = np.asarray(t) / np.asarray(times[(variant, mode, ks[0])])
        row = out.setdefault(variant, {}).setdefault(mode, {})[str(k)] = {
            "ms": 1e3 * float(np.median(t)),
            "ms_q25_q75": [1e3 * float(np.quantile(t, q)) for q in (0.25, 0.75)],
            "ratio": float(np.median(ratio)),
            "ratio_q25": float(np.quantile(ratio, 0.25)),
            "ratio_q75": float(np.quantile(ratio, 0.75)),
        }
        if "xla" in variants:  # against today's one-token step (jnp.dot), same round
            row["vs_xla_1"] = float(np.median(np.asarray(t) / times[("xla", mode, ks[0])]))
    return out


# ----------------------------------------------------------------------------------------------
# Per-op breakdown from XLA's per-thunk trace events.

_WEIGHT_OPS = ("query", "key", "value", "out", "wi", "wi_0", "wi_1", "wo")


def _category(op: str, shape: str, op_name: str, dims: dict) -> str:
    """Coarse category of one thunk; fusions containing a dot are labelled by that dot."""
    shape = shape.split("{")[0]  # drop the layout
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


def _instruction_labels(hlo_text: str) -> dict:
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


def breakdown(name: str, ks) -> dict:
    module, params, enc, cache = build(name)
    pos = jnp.full((1,), ARGS.position, jnp.int32)
    out, repeats = {}, 5
    cfg = MODELS[name]
    dims = {"vocab": cfg["vocab_size"], "heads": cfg["num_heads"], "head_dim": cfg["head_dim"]}
    for k in (ks[0], ks[-1]):
        fn = make_fn(module, "loop", None)
        args = (params, enc, cache, jnp.full((1, k), 3, jnp.int32), pos)
        with cpu_kernel.env_setting(False):  # XLA's own dots (the categories below are XLA thunks)
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
        steps = repeats * ARGS.loop_steps
        out[str(k)] = {c: us / steps for c, us in per_cat.most_common()}
    return out


# ----------------------------------------------------------------------------------------------
# Roofline: this machine's GEMM rate and GEMV streaming bandwidth.


def roofline(names, ks) -> dict:
    def median_time(fn, *args, n=7):
        jax.block_until_ready(fn(*args))
        ts = []
        for _ in range(n):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - start)
        return float(np.median(ts))

    a = jnp.ones((1024, 1024), jnp.float32)
    gemm = jax.jit(lambda a, b: a @ b)
    peak = 2 * 1024**3 / median_time(gemm, a, a) / 1e9
    w = jnp.ones((512, 32768), jnp.float32)  # 64 MiB: streamed from DRAM like a model's weights
    gemv = jax.jit(lambda x, w: x @ w)
    bandwidth = w.size * 4 / median_time(gemv, jnp.ones((1, 512), jnp.float32), w) / 1e9
    out = {"gemm_gflops_1024": peak, "gemv_stream_gbs_64mib": bandwidth, "models": {}}
    for name in names:
        m = MODELS[name]
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


def dot_curves(names, ms=(1, 2, 4, 8)) -> dict:
    """x [M, in] @ W [in, out] alone, for each model's MLP and logits kernel shapes.

    `hot`: the same W n times (stays in cache when it fits); `streamed`: n distinct copies totalling
    >= 96 MiB, so every W comes from DRAM as in a real decoder step. The n dots are chained (each
    input depends on the previous output) so they run one after another.
    """
    out = {}
    shapes = sorted(
        {
            (MODELS[n]["emb_dim"], o)
            for n in names
            for o in (MODELS[n]["mlp_dim"], MODELS[n]["vocab_size"])
        }
    )
    for i, o in shapes:
        n = max(2, -(-96 * 2**20 // (4 * i * o)))
        ws = [jax.random.normal(jax.random.PRNGKey(j), (i, o), jnp.float32) for j in range(n)]

        def chain(x, *ws, matmul=jnp.dot):
            acc = jnp.float32(0)
            for w in ws:
                y = matmul(x, w)
                acc = acc + jnp.max(y)
                x = x + 1e-30 * acc
            return acc

        f = jax.jit(chain)
        kernel = jax.jit(
            functools.partial(chain, matmul=lambda x, w, o=o: cpu_kernel.matmul(x, w, o))
        )
        packed = {d: [cpu_kernel.pack(w, d) for w in ws] for d in ("float32", "bfloat16")}
        calls = {}
        for m in ms:
            x = jnp.ones((m, i), jnp.float32)
            if ARGS.dots_hot:
                calls[("hot", m)] = (functools.partial(f, x, *([ws[0]] * n)), n)
            calls[("streamed", m)] = (functools.partial(f, x, *ws), n)
            calls[("kernel_streamed", m)] = (functools.partial(kernel, x, *packed["float32"]), n)
            calls[("kernel_bf16_streamed", m)] = (
                functools.partial(kernel, x, *packed["bfloat16"]),
                n,
            )
        with paused(ARGS.pause_pid_file):
            times = time_all(calls, max(5, ARGS.rounds // 3))
        res = {}
        for (kind, m), t in times.items():
            sec = float(np.median(t))
            res.setdefault(kind, {})[str(m)] = {
                "us": 1e6 * sec,
                "gflops": 2 * m * i * o / sec / 1e9,
                "weight_gbs": 4 * i * o / sec / 1e9,
                "ratio": float(np.median(np.asarray(t) / np.asarray(times[(kind, ms[0])]))),
                "vs_xla_1": float(np.median(np.asarray(t) / np.asarray(times[("streamed", 1)]))),
            }
        out[f"{i}x{o}"] = res
    return out


# ----------------------------------------------------------------------------------------------
# Provenance and output.


def hardware() -> dict:
    """`provenance.hardware_info()` plus what matters for CPU kernels: caches, SIMD, affinity."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    keep = ("Thread(s) per core", "L1d cache", "L2 cache", "L3 cache")
    hw = provenance.hardware_info() | {k: fields[k].strip() for k in keep if k in fields}
    flags = fields.get("Flags", "").split()
    hw["simd"] = " ".join(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16"))
    hw["affinity"] = sorted(os.sched_getaffinity(0))
    hw["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return hw


def markdown(result: dict) -> str:
    lines = [f"# Verify-step cost: k-token vs 1-token cached decoder step{result['title']}", ""]
    for name, res in result["results"].items():
        variants = list(res)
        modes = list(res[variants[0]])
        lines += [f"## {name} (ratio = per-round median of step(k) / step(1); ms per step)", ""]
        header = ["k"] + [f"{v} {m}" for v in variants for m in modes]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for k in result["settings"]["ks"]:
            cells = [str(k)]
            for v in variants:
                for m in modes:
                    r = res[v][m][str(k)]
                    cells.append(f"{r['ratio']:.2f}x ({r['ms']:.2f} ms)")
            lines.append("| " + " | ".join(cells) + " |")
        if "xla" in variants:
            lines += [
                "",
                "Against today's one-token step (xla, k=1), same round, per-round medians:",
                "",
            ]
            lines += [
                "| variant | mode | "
                + " | ".join(f"k={k}" for k in result["settings"]["ks"])
                + " |"
            ]
            lines += ["|---|---|" + "---|" * len(result["settings"]["ks"])]
            for v in variants:
                for m in modes:
                    cells = [
                        f"{res[v][m][str(k)]['vs_xla_1']:.2f}x" for k in result["settings"]["ks"]
                    ]
                    lines.append(f"| {v} | {m} | " + " | ".join(cells) + " |")
        if name in result.get("roofline", {}).get("models", {}):
            roof = result["roofline"]["models"][name]
            lines += [
                "",
                "roofline max(weight bytes / GEMV bandwidth, FLOPs / GEMM rate): "
                + ", ".join(
                    f"k={k}: {ms:.2f} ms ({roof['roofline_ratio'][k]:.2f}x)"
                    for k, ms in roof["roofline_ms"].items()
                ),
            ]
        if name in result.get("breakdown", {}):
            bd = result["breakdown"][name]
            k1, kn = list(bd)
            cats = sorted(set(bd[k1]) | set(bd[kn]), key=lambda c: -bd[kn].get(c, 0.0))
            lines += ["", f"Per-op thunk time, `loop` mode, µs per step (k={k1} vs k={kn}):", ""]
            lines += [f"| category | k={k1} | k={kn} | extra |", "|---|---|---|---|"]
            for c in cats + ["total"]:
                a = sum(bd[k1].values()) if c == "total" else bd[k1].get(c, 0.0)
                b = sum(bd[kn].values()) if c == "total" else bd[kn].get(c, 0.0)
                lines.append(f"| {c} | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
        lines.append("")
    if "roofline" in result:
        r = result["roofline"]
        lines += [
            f"Machine: f32 GEMM 1024³ {r['gemm_gflops_1024']:.0f} GFLOP/s, "
            f"GEMV weight streaming (64 MiB) {r['gemv_stream_gbs_64mib']:.1f} GB/s.",
            "",
        ]
    if "dots" in result:
        lines += [
            "## Isolated `x [M, in] @ W [in, out]` (µs per dot; ratio to XLA's M=1 dot on the "
            "same weights, same round; GFLOP/s)",
            "",
        ]
        lines += ["| W | path | M=1 | M=2 | M=4 | M=8 |", "|---|---|---|---|---|---|"]
        for shape, res in result["dots"].items():
            for kind, per_m in res.items():
                cells = [
                    f"{r['us']:.0f} ({r['vs_xla_1']:.2f}x, {r['gflops']:.0f})"
                    for r in per_m.values()
                ]
                lines.append(f"| {shape} | {kind} | " + " | ".join(cells) + " |")
        lines.append("")
    s = result["settings"]
    lines += [
        f"- batch 1, enc_len {s['enc_len']}, cache length {s['max_len']}, block at position "
        f"{s['position']}, {s['rounds']} interleaved rounds, loop = {s['loop_steps']} steps per "
        "`fori_loop`, random float32 weights.",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- date: `{result['date']}`",
        f"- hardware: {result['hardware']}",
        f"- load average before / after: {result['load_before']} / {result['load_after']}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    names = ARGS.models.split(",")
    ks = [int(k) for k in ARGS.ks.split(",")]
    variants, modes = ARGS.variants.split(","), ARGS.modes.split(",")
    result = {
        "title": f" ({ARGS.tag})" if ARGS.tag else "",
        "command": "python " + shlex.join(sys.argv),
        "commit": provenance.git_commit(),
        "date": provenance.utc_date(),
        "hardware": hardware(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "settings": {k: getattr(ARGS, k) for k in ("position", "enc_len", "max_len", "rounds")}
        | {"loop_steps": ARGS.loop_steps, "ks": ks},
        "results": {},
    }
    for name in names:
        print(f"timing {name} ...", flush=True)
        result["results"][name] = measure(name, ks, variants, modes)
    if ARGS.breakdown:
        result["breakdown"] = {}
        for name in names:
            print(f"profiling {name} ...", flush=True)
            result["breakdown"][name] = breakdown(name, ks)
    if ARGS.roofline:
        result["roofline"] = roofline(names, ks)
    if ARGS.dots:
        print("timing isolated dots ...", flush=True)
        result["dots"] = dot_curves(names)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out = pathlib.Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "verify_cost" + (f"_{ARGS.tag}" if ARGS.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
