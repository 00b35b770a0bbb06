"""Cost of a k-token cached decoder step (the speculative verify call) relative to a 1-token step.

  python scripts/profile_verify.py --roofline --dots --rounds 25        # -> verify_cost.{json,md}
  python scripts/profile_verify.py --pin_cpu 1 --breakdown --dots --variants default,ynn_off \\
      --tag pinned --rounds 20                                          # one core + per-op split

Random weights (timing does not depend on their values), batch 1, encoder length 64, cache length
64, block written at --position. For every (model, variant, mode, k) one jitted function:

* `loop`: --loop_steps block steps inside one `lax.fori_loop` with the cache as loop carry (in-place
  cache updates, no per-call dispatch: how the samplers run). The step's tokens depend on the carry
  and the full logits are consumed, so XLA can neither hoist nor slice away any work.
* `single`: one jitted step call returning only the logits: adds Python dispatch and thread
  hand-off to every call (why `step_timer.time_decoder_steps` times steps inside a loop).
* `single_cache`: one jitted step call that also returns the updated cache (copies it).

Calls are interleaved in rotating order (`clock.time_interleaved`); each round's time is divided
by the same round's k = 1 time (same model, variant, mode), and the medians of those per-round ratios
are reported (more robust than a ratio of medians when other jobs load the machine). Variants, all
timed in one process: `xla` = XLA's jnp.dot (SPECDEC_CPU_KERNEL=0; `default` is its earlier name);
`kernel` / `kernel_bf16` = the CPU kernel (`cpu_kernel`) on float32 / bfloat16 packed weights;
`kernel_no_matmul` = `kernel` with every projection replaced by a broadcast of its
input (the step's cost besides its matmuls: a wall-clock ablation, see `_projections_stubbed`);
`ynn_off` = jnp.dot compiled with YNNPACK dot fusions disabled (Eigen dots; per-function
`compiler_options`, same as `XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`); `before` =
specdec_t5x/network.py at --before_ref (default HEAD) with jnp.dot: against `xla` it shows a change
to network.py, or the measurement noise when there is none.

--breakdown, --breakdown_kernel, --roofline and --dots add the probes of `xla_profile` (per-op
thunk time of the `loop` function at k = 1 and the largest k, with XLA's dots / on the CPU kernel
path; the machine's GEMM / GEMV roofline; isolated
x [M, in] @ W [in, out] dots on the models' MLP and logits shapes). Findings:
results/verify_cost/README.md.

Writes <out>/verify_cost[_<tag>].json and .md (tables, command, commit, lscpu hardware, date).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing as bench_timing
from benchmarks import xla_profile
from specdec_t5x import cpu_kernel, models, network, provenance
from specdec_t5x.timing import clock, step_timer

# variant -> (CPU weight dtype of the packed decoder, None = XLA's jnp.dot; XLA compiler options)
VARIANTS = {
    "xla": (None, None),
    "default": (None, None),  # the earlier name of `xla` (commands in results/verify_cost/)
    "kernel": ("float32", None),
    "kernel_bf16": ("bfloat16", None),
    "kernel_1t": ("float32", None),  # every product on the calling thread (no split)
    "kernel_xla_attn": (
        "float32",
        None,
    ),  # packed matmuls, XLA's attention (SPECDEC_CPU_ATTENTION=0)
    "kernel_bf16_1t": ("bfloat16", None),
    "kernel_no_matmul": ("float32", None),  # the kernel path with every projection stubbed out
    "ynn_off": (None, {"xla_cpu_experimental_ynn_fusion_type": ""}),
    "before": (None, None),
}
# variant -> `cpu_kernel.set_split_bytes` value while its calls run (others: the default).
SPLIT_OFF = {"kernel_1t": 1 << 62, "kernel_bf16_1t": 1 << 62}
XLA_ATTENTION = {"kernel_xla_attn"}  # traced with SPECDEC_CPU_ATTENTION=0
NO_MATMUL = {"kernel_no_matmul"}  # traced with `_projections_stubbed`


@contextlib.contextmanager
def _projections_stubbed():
    """While tracing: every packed projection (`cpu_kernel.dense`) returns its input's first
    column broadcast to the output shape instead of the product, so the traced step costs what a
    step costs besides its matmuls (attention, norms, cache writes, embedding, bookkeeping).

    The per-op profile (`xla_profile`) inflates small thunks several-fold on the 2-core VM
    (its traceme events), so this wall-clock ablation is how the non-matmul part of a k-token
    step's growth is measured (`kernel` minus `kernel_no_matmul`: the projections' part).
    """
    real = cpu_kernel.dense

    def stub(x, packed, features, dtype, kernel=None):
        col = x[..., :1].astype(jnp.float32) * packed[0, 0, 0].astype(jnp.float32)
        return jnp.broadcast_to(col, (*x.shape[:-1], features)).astype(dtype)

    cpu_kernel.dense = stub
    try:
        yield
    finally:
        cpu_kernel.dense = real


_SHAPE = ("vocab_size", "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers")
MODELS = {  # T5 v1.1 shapes: the embedded target that ships, T5-small, and a tiny smoke-test one;
    # `*_v8192`: T5 1.1 small / base widths with the shipped 8192-token vocabulary (the targets the
    # eval job widens the shipped one to, `widen.T5_1_1_SHAPES`).
    "embedded": dict(zip(_SHAPE, (8192, 256, 4, 4, 4), strict=True), head_dim=64, mlp_dim=1024),
    "small": dict(zip(_SHAPE, (32128, 512, 6, 8, 8), strict=True), head_dim=64, mlp_dim=1024),
    "small_v8192": dict(zip(_SHAPE, (8192, 512, 6, 8, 8), strict=True), head_dim=64, mlp_dim=1024),
    "base_v8192": dict(
        zip(_SHAPE, (8192, 768, 12, 12, 12), strict=True), head_dim=64, mlp_dim=2048
    ),
    "tiny": dict(zip(_SHAPE, (256, 32, 2, 1, 2), strict=True), head_dim=16, mlp_dim=64),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Shapes and timing of one run (the command-line options of the same names)."""

    position: int = 32
    enc_len: int = 64
    max_len: int = 64
    loop_steps: int = 8
    rounds: int = 30
    before_ref: str = "HEAD"
    pause_pid_file: str | None = None


def configure_process(pin_cpu: int | None, traceme: bool) -> None:
    """Pins this process to one CPU and/or turns on XLA's per-thunk trace events.

    Call before JAX's backend starts (its first computation): the thread pools inherit the CPU
    mask when they are created, and XLA reads `XLA_FLAGS` once, when the backend is created.
    """
    if pin_cpu is not None:
        os.sched_setaffinity(0, {pin_cpu})
    if traceme:
        flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
        os.environ["XLA_FLAGS"] = flags.strip()


def network_at(ref: str):
    """specdec_t5x/network.py as it is at git `ref`, imported as a separate module.

    Raises:
      subprocess.CalledProcessError: `ref` is not a git revision of this repository.
    """
    source = subprocess.run(
        ["git", "show", f"{ref}:specdec_t5x/network.py"],
        cwd=provenance.REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "network_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("network_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["network_before"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def build(name: str, s: Settings, network=network):
    """(module, float32 params, int32 [1, enc_len] encoder tokens, cache of length max_len)."""
    cfg = network.T5Config(
        **MODELS[name], dtype="float32", mlp_activations=("gelu", "linear"), dropout_rate=0.0
    )
    module = network.Transformer(cfg)
    ones = jnp.ones((1, 4), jnp.int32)
    params = module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)["params"]
    enc = jax.random.randint(jax.random.PRNGKey(1), (1, s.enc_len), 2, cfg.vocab_size)
    enc = enc.astype(jnp.int32)
    model = models.EncoderDecoderModel(module)
    cache = jax.jit(lambda p, e: model.decoder_state(p, e, s.max_len)[0])(params, enc)
    return module, params, enc, cache


def make_fn(module, mode: str, loop_steps: int, compiler_options=None):
    """jitted (params, enc, cache, tokens [1, k], positions [1]) -> something to block on."""

    step = step_timer.decoder_step(module)

    if mode == "loop":

        def fn(params, enc, cache, tokens, positions):
            def body(i, carry):
                cache, acc = carry
                toks = tokens + (acc > 1e30).astype(jnp.int32)  # carry-dependent: no hoisting
                logits, cache = step(params, enc, toks, positions, cache)
                return cache, acc + jnp.max(logits)  # every logit is needed

            return jax.lax.fori_loop(0, loop_steps, body, (cache, jnp.float32(0)))[1]

    elif mode == "single":
        fn = lambda p, e, c, t, ps: step(p, e, t, ps, c)[0]
    elif mode == "single_cache":
        fn = lambda p, e, c, t, ps: step(p, e, t, ps, c)
    else:
        raise ValueError(f"mode must be 'loop', 'single' or 'single_cache'; got {mode!r}.")
    return jax.jit(fn, compiler_options=compiler_options)


def _with_split(thunk, split_bytes: int):
    """`thunk` run with the kernel's split threshold at `split_bytes`, restored afterwards."""

    def call():
        old = cpu_kernel.set_split_bytes(split_bytes)
        try:  # dispatch is asynchronous: wait here, while the setting holds
            return jax.block_until_ready(thunk())
        finally:
            cpu_kernel.set_split_bytes(old)

    return call


def measure(name: str, ks: Sequence[int], variants, modes, s: Settings) -> dict[str, Any]:
    """{variant: {mode: {k: {'ms', 'ms_q25_q75', 'ratio', 'ratio_q25', 'ratio_q75',
    'vs_xla_1' (with the xla variant)}}}}: ms per step, ratios to k = ks[0], per-round medians."""
    built = {"after": build(name, s)}
    if "before" in variants:
        built["before"] = build(name, s, network_at(s.before_ref))
    pos = jnp.full((1,), s.position, jnp.int32)
    calls, steps = {}, {}
    for variant in variants:
        module, params, enc, cache = built["before" if variant == "before" else "after"]
        weight_dtype, options = VARIANTS[variant]
        if weight_dtype is not None:  # packed once, outside the timed loop (as the eval job)
            params = models.pack_params(module, params, weight_dtype)
            if not cpu_kernel.is_packed(params):
                raise RuntimeError(f"variant {variant!r}: {cpu_kernel.disabled_reason()}")
        for mode in modes:
            fn = make_fn(module, mode, s.loop_steps, options)
            for k in ks:
                toks = jnp.full((1, k), 3, jnp.int32)
                thunk = lambda fn=fn, t=toks, p=params, e=enc, c=cache: fn(p, e, c, t, pos)
                if variant in SPLIT_OFF:
                    thunk = _with_split(thunk, SPLIT_OFF[variant])
                with (
                    cpu_kernel.env_setting(weight_dtype is not None),
                    cpu_kernel.env_var(
                        cpu_kernel.ATTENTION_ENV_VAR, "0" if variant in XLA_ATTENTION else "1"
                    ),
                    _projections_stubbed() if variant in NO_MATMUL else contextlib.nullcontext(),
                ):
                    jax.block_until_ready(thunk())  # traces (and compiles) under that setting
                calls[(variant, mode, k)] = thunk
                steps[(variant, mode, k)] = s.loop_steps if mode == "loop" else 1
    with bench_timing.paused(s.pause_pid_file):
        times = clock.time_interleaved(calls, s.rounds, warmup=1)
    times = {key: np.asarray(t) / 1e3 / steps[key] for key, t in times.items()}  # s per step
    out = {}
    for (variant, mode, k), t in times.items():
        ratio = t / times[(variant, mode, ks[0])]
        row = out.setdefault(variant, {}).setdefault(mode, {})[str(k)] = {
            "ms": 1e3 * float(np.median(t)),
            "ms_q25_q75": [1e3 * float(np.quantile(t, q)) for q in (0.25, 0.75)],
            "ratio": float(np.median(ratio)),
            "ratio_q25": float(np.quantile(ratio, 0.25)),
            "ratio_q75": float(np.quantile(ratio, 0.75)),
        }
        if "xla" in variants:  # against today's one-token step (jnp.dot), same round
            row["vs_xla_1"] = float(np.median(t / times[("xla", mode, ks[0])]))
    return out


def breakdown(
    name: str, ks: Sequence[int], s: Settings, kernel: bool = False
) -> dict[str, dict[str, float]]:
    """{k: {category: µs per step}} of the `loop` function at k = ks[0], ks[-1]: XLA's own dots,
    or with `kernel` the default CPU path (float32 packed weights; the projections are then one
    "CPU kernel matmuls" category of custom calls, whose thunk time includes waiting for the
    helper threads they split over).

    Raises:
      RuntimeError: `kernel` while the CPU kernel is unavailable (`cpu_kernel.disabled_reason`).
    """
    module, params, enc, cache = build(name, s)
    if kernel:
        params = models.pack_params(module, params, "float32")
        if not cpu_kernel.is_packed(params):
            raise RuntimeError(f"kernel breakdown: {cpu_kernel.disabled_reason()}")
    pos = jnp.full((1,), s.position, jnp.int32)
    cfg = MODELS[name]
    dims = {"vocab": cfg["vocab_size"], "heads": cfg["num_heads"], "head_dim": cfg["head_dim"]}
    out = {}
    for k in (ks[0], ks[-1]):
        fn = make_fn(module, "loop", s.loop_steps)
        args = (params, enc, cache, jnp.full((1, k), 3, jnp.int32), pos)
        with cpu_kernel.env_setting(kernel):  # off: XLA's own dots (categories are XLA thunks)
            out[str(k)] = xla_profile.thunk_time_by_category(fn, args, dims, s.loop_steps)
    return out


def run(
    names: Sequence[str],
    ks: Sequence[int],
    variants: Sequence[str],
    modes: Sequence[str],
    s: Settings,
    *,
    command: str,
    out: str | os.PathLike,
    tag: str = "",
    with_breakdown: bool = False,
    with_breakdown_kernel: bool = False,
    with_roofline: bool = False,
    with_dots: bool = False,
    dots_hot: bool = False,
    dots_stream_mib: int = 96,
) -> pathlib.Path:
    """Measures, writes `<out>/verify_cost[_<tag>].json` and `.md`, and returns the JSON path.

    Raises:
      ValueError: an unknown model, variant or mode name, or a bad k.
    """
    for kind, given, known in (
        ("model", names, MODELS),
        ("variant", variants, VARIANTS),
        ("mode", modes, ("loop", "single", "single_cache")),
    ):
        unknown = [x for x in given if x not in known]
        if unknown:
            raise ValueError(f"unknown {kind}(s) {unknown}; expected some of {sorted(known)}.")
    if not ks or min(ks) < 1 or max(ks) + s.position > s.max_len:
        raise ValueError(f"need ks >= 1 with position + k <= max_len; got ks={list(ks)}, {s}.")
    result = {
        "title": f" ({tag})" if tag else "",
        "command": command,
        "commit": provenance.git_commit(),
        "date": provenance.utc_date(),
        "hardware": provenance.hardware_info() | provenance.cpu_details(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "settings": {k: getattr(s, k) for k in ("position", "enc_len", "max_len", "rounds")}
        | {"loop_steps": s.loop_steps, "ks": list(ks)},
        "results": {},
    }
    for name in names:
        print(f"timing {name} ...", flush=True)
        result["results"][name] = measure(name, ks, variants, modes, s)
    if with_breakdown:
        result["breakdown"] = {}
        for name in names:
            print(f"profiling {name} ...", flush=True)
            result["breakdown"][name] = breakdown(name, ks, s)
    if with_breakdown_kernel:
        result["breakdown_kernel"] = {}
        for name in names:
            print(f"profiling {name} (CPU kernel) ...", flush=True)
            result["breakdown_kernel"][name] = breakdown(name, ks, s, kernel=True)
    if with_roofline:
        result["roofline"] = xla_profile.roofline({n: MODELS[n] for n in names}, ks)
    if with_dots:
        print("timing isolated dots ...", flush=True)
        shapes = [
            (MODELS[n]["emb_dim"], MODELS[n][o]) for n in names for o in ("mlp_dim", "vocab_size")
        ]
        with bench_timing.paused(s.pause_pid_file):
            result["dots"] = xla_profile.dot_curves(
                shapes, max(5, s.rounds // 3), hot=dots_hot, stream_mib=dots_stream_mib
            )
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "verify_cost" + (f"_{tag}" if tag else "")
    path = out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(result))
    return path


def markdown(result: dict[str, Any]) -> str:
    """The tables of a `run` result (per model: ratios, vs xla k = 1, roofline, breakdown; dots)
    with its settings and provenance."""
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
        for key, path in (("breakdown", "XLA's dots"), ("breakdown_kernel", "the CPU kernel")):
            if name not in result.get(key, {}):
                continue
            bd = result[key][name]
            k1, kn = list(bd)
            cats = sorted(set(bd[k1]) | set(bd[kn]), key=lambda c: -bd[kn].get(c, 0.0))
            lines += [
                "",
                f"Per-op thunk time, `loop` mode, {path}, µs per step (k={k1} vs k={kn}):",
                "",
            ]
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


def _csv(kind=str):
    return lambda text: [kind(x) for x in text.split(",")]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=_csv(), default="embedded,small", help=f"of {list(MODELS)}")
    p.add_argument("--ks", type=_csv(int), default="1,2,4,8")
    p.add_argument(
        "--variants",
        type=_csv(),
        default="xla,kernel,kernel_bf16",
        help="xla (alias default): jnp.dot (SPECDEC_CPU_KERNEL=0); kernel / kernel_bf16: the CPU "
        "kernel on float32 / bfloat16 packed weights; ynn_off: jnp.dot without YNNPACK dots; "
        "before: network.py at --before_ref with jnp.dot",
    )
    p.add_argument("--before_ref", default="HEAD", help="git ref of the 'before' network.py")
    p.add_argument("--modes", type=_csv(), default="loop,single", help="loop, single, single_cache")
    p.add_argument("--position", type=int, default=32)
    p.add_argument("--enc_len", type=int, default=64)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--loop_steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--pin_cpu", type=int, default=None, help="run on this one CPU only")
    p.add_argument("--breakdown", action="store_true")
    p.add_argument(
        "--breakdown_kernel",
        action="store_true",
        help="per-op thunk time of the CPU kernel path (as --breakdown for XLA's dots)",
    )
    p.add_argument("--roofline", action="store_true")
    p.add_argument("--dots", action="store_true", help="isolated x @ W timings for M = 1, 2, 4, 8")
    p.add_argument("--dots_hot", action="store_true", help="--dots also with cache-hot weights")
    p.add_argument("--dots_stream_mib", type=int, default=96, help="streamed weights per dot shape")
    p.add_argument("--tag", default="")
    p.add_argument(
        "--pause_pid_file",
        default=None,
        help="pause (SIGSTOP) this process while the interleaved rounds run, resume after",
    )
    p.add_argument("--out", default="results/verify_cost")
    return p.parse_args(argv)


def main(
    argv: Sequence[str] | None = None, prog: str = "scripts/profile_verify.py"
) -> pathlib.Path:
    """The command line of scripts/profile_verify.py; returns the JSON path written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    configure_process(args.pin_cpu, args.breakdown or args.breakdown_kernel)
    settings = Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})
    path = run(
        args.models,
        args.ks,
        args.variants,
        args.modes,
        settings,
        command=shlex.join(["python", prog, *argv]),
        out=args.out,
        tag=args.tag,
        with_breakdown=args.breakdown,
        with_breakdown_kernel=args.breakdown_kernel,
        with_roofline=args.roofline,
        with_dots=args.dots,
        dots_hot=args.dots_hot,
        dots_stream_mib=args.dots_stream_mib,
    )
    print(path.with_suffix(".md").read_text())
    return path
