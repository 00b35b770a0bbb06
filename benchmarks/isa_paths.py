"""The CPU kernel's code paths side by side: AVX2 + FMA, AVX-512, an earlier build, XLA's dot.

  python scripts/profile_isa.py --before /tmp/base/_matmul.so --rounds 15 \\
      --variants xla,kernel@avx2+fma,kernel_before@avx2+fma,kernel@avx512f

A variant is `xla` (jnp.dot, SPECDEC_CPU_KERNEL=0) or `kernel[_bf16][_before|_auto]@<path>`: the
CPU kernel on float32 (bfloat16) packed weights (`_auto`: each product on the candidate
`cpu_kernel.choice` measured fastest for that path, packed and traced with the path forced; the
others keep the size rule, SPECDEC_CPU_CHOICE=threshold), run on code path <path> (`cpu_kernel.force_isa`:
'avx2+fma', 'avx512f', 'portable'; read by the C++ at call time, so variants on different paths
interleave in one process). `kernel_no_matmul@<path>`: every projection stubbed out, so the step
costs what it costs besides its matmuls (`verify_cost._projections_stubbed`; steps only). `_before` runs another build of the extension (`--before`, e.g. one
built from an earlier commit: `python setup.py build_ext` there), its FFI targets registered under
other names and used when the variant is traced; the weights are packed by this build (the same
panel layout).

Two probes, every variant timed in the same interleaved rounds (`clock.time_interleaved`, each
round in a seeded random order; medians of per-round values, compilation excluded):

* `dots`: x [M, in] @ W [in, out] alone, W streamed (distinct copies totalling --stream_mib, each
  from DRAM or L3 as in a decoder step), for the decoder projection shapes of --dot_models;
  µs per product, GFLOP/s, GB/s of weights read.
* `attention` (--attention): one layer's fused cached attention alone (k query rows over the
  --max_len cache, the models' heads), chained 64 times in one jitted call; µs per call.
* `steps`: --loop_steps cached decoder steps of k tokens inside one `lax.fori_loop`
  (`verify_cost.make_fn`, 'loop' mode, as the samplers run) for --models and --ks; ms per step,
  step(k) / step(k0) of the same variant and round, and against XLA's step(k0).

Writes <out>/isa_paths[_<tag>].json and .md with the command, commit, hardware (lscpu, SIMD
flags), the detected code path, and the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import pathlib
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import verify_cost
from specdec_t5x import cpu_kernel, models, provenance
from specdec_t5x.cpu_kernel import choice, extension, ops
from specdec_t5x.cpu_kernel import params as cpu_params
from specdec_t5x.timing import clock

_ISA_CODES = {"portable": 0, "avx2+fma": 1, "avx512f": 2}
_BEFORE = "_before"  # suffix of the earlier build's FFI target names


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    kernel: bool  # False: XLA's jnp.dot
    weight_dtype: str = "float32"
    before: bool = False  # the --before build
    isa: str | None = None
    no_matmul: bool = False  # every projection stubbed (`verify_cost._projections_stubbed`)
    auto: bool = False  # the measured kernel / XLA choice (`cpu_kernel.choice`)

    @classmethod
    def parse(cls, name: str) -> Variant:
        if name == "xla":
            return cls(name, kernel=False)
        base, _, isa = name.partition("@")
        known = [f"kernel{d}{b}" for d in ("", "_bf16") for b in ("", _BEFORE, "_auto")]
        if base not in [*known, "kernel_no_matmul"] or isa not in _ISA_CODES:
            raise ValueError(
                f"variant {name!r}: expected 'xla' or kernel[_bf16][_before]@<path> or "
                f"kernel_no_matmul@<path>, <path> one of {sorted(_ISA_CODES)}."
            )
        dtype = "bfloat16" if "_bf16" in base else "float32"
        return cls(
            name,
            kernel=True,
            weight_dtype=dtype,
            before=base.endswith(_BEFORE),
            isa=isa,
            no_matmul=base == "kernel_no_matmul",
            auto=base.endswith("_auto"),
        )


def load_before(path: str | os.PathLike) -> ctypes.CDLL:
    """Loads another build of the extension and registers its FFI targets as `<target>_before`."""
    lib = ctypes.CDLL(str(path))
    for target, symbol in (
        (extension.MATMUL_TARGET, lib.SpecdecMatmul),
        (extension.ATTENTION_TARGET, lib.SpecdecAttention),
    ):
        jax.ffi.register_ffi_target(target + _BEFORE, jax.ffi.pycapsule(symbol), platform="cpu")
    return lib


def _ffi_attention_before(q, k, v, bias):
    """`ops._ffi_attention` on the --before build. A function object of its own: JAX caches the
    branch jaxprs of `lax.platform_dependent` by function, so the module's `_ffi_attention`
    traced once with one target name would keep it."""
    call = jax.ffi.ffi_call(
        extension.ATTENTION_TARGET + _BEFORE,
        jax.ShapeDtypeStruct(q.shape, jnp.float32),
        vmap_method="broadcast_all",
    )
    return call(q, k, v, bias)


@contextlib.contextmanager
def _traced_as(v: Variant):
    """While tracing `v`: the kernel switch, and the --before build's targets for `_before` (the
    matmul's branch is a fresh lambda per call, so it reads the patched target name)."""
    matmul_target, ffi_attention = extension.MATMUL_TARGET, ops._ffi_attention
    if v.before:
        extension.MATMUL_TARGET = matmul_target + _BEFORE
        ops._ffi_attention = _ffi_attention_before
    if v.kernel:  # the choice is keyed by the path when traced
        cpu_kernel.force_isa(v.isa)
    try:
        with (
            cpu_kernel.env_var(choice.ENV_VAR, "auto" if v.auto else "threshold"),
            cpu_kernel.env_setting(v.kernel),
            verify_cost._projections_stubbed() if v.no_matmul else contextlib.nullcontext(),
        ):
            yield
    finally:
        extension.MATMUL_TARGET, ops._ffi_attention = matmul_target, ffi_attention
        if v.kernel:
            cpu_kernel.force_isa(None)


def _on_path(v: Variant, libs: Sequence[ctypes.CDLL], thunk):
    """`thunk` run (and waited for) with every loaded build forced onto v's code path (read at
    call time)."""
    if not v.kernel:
        return lambda: jax.block_until_ready(thunk())

    def call():
        for lib in libs:
            if not lib.SpecdecMatmulForceIsa(_ISA_CODES[v.isa]):
                raise RuntimeError(f"this CPU cannot run the {v.isa} path ({cpu_kernel.isa()}).")
        return jax.block_until_ready(thunk())

    return call


def _chain(x, *ws, matmul):
    """The products x @ w for every w in turn, each input depending on the previous output."""
    acc = jnp.float32(0)
    for w in ws:
        acc = acc + jnp.max(matmul(x, w))
        x = x + 1e-30 * acc
    return acc


def projection_shapes(name: str) -> list[tuple[int, int]]:
    """The distinct [in, out] of a model's decoder projections (attention, MLP, logits)."""
    m = verify_cost.MODELS[name]
    e, h, f = m["emb_dim"], m["num_heads"] * m["head_dim"], m["mlp_dim"]
    return sorted({(e, h), (h, e), (e, f), (f, e), (e, m["vocab_size"])})


def dots(shapes, variants, libs, ms, rounds: int, stream_mib: float) -> dict[str, Any]:
    """{'<in>x<out>': {variant: {M: {'us', 'gflops', 'weight_gbs', 'vs_xla_1'}}}}."""
    out = {}
    for i, o in shapes:
        n = max(2, int(-(-stream_mib * 2**20 // (4 * i * o))))  # weight copies per chain
        ws = [jax.random.normal(jax.random.PRNGKey(j), (i, o), jnp.float32) for j in range(n)]
        packed = {
            d: [cpu_kernel.pack(w, d) for w in ws]
            for d in {v.weight_dtype for v in variants if v.kernel}
        }
        calls = {}
        for v in variants:
            if v.no_matmul or v.auto:  # nothing to time alone / products are not chosen here
                continue
            weights = packed[v.weight_dtype] if v.kernel else ws
            matmul = (lambda x, w, o=o: cpu_kernel.matmul(x, w, o)) if v.kernel else jnp.dot
            for m in ms:
                x = jnp.ones((m, i), jnp.float32)
                fn = jax.jit(functools.partial(_chain, matmul=matmul))
                call = _on_path(v, libs, functools.partial(fn, x, *weights))
                with _traced_as(v):
                    call()  # traces (and compiles) under the variant's setting
                calls[(v.name, m)] = call
        times = clock.time_interleaved(calls, rounds, warmup=1, shuffle=True)
        times = {key: np.asarray(t) / 1e3 / n for key, t in times.items()}  # s per product
        res = {}
        for (name, m), t in times.items():
            sec = float(np.median(t))
            bytes_per = 2 if "bf16" in name else 4
            row = {
                "us": 1e6 * sec,
                "gflops": 2 * m * i * o / sec / 1e9,
                "weight_gbs": bytes_per * i * o / sec / 1e9,
            }
            if ("xla", ms[0]) in times:
                row["vs_xla_1"] = float(np.median(t / times[("xla", ms[0])]))
            res.setdefault(name, {})[str(m)] = row
        out[f"{i}x{o}"] = res
        print(f"  dots {i}x{o} done", flush=True)
    return out


def attention(name: str, variants, libs, ks, s: verify_cost.Settings, rounds: int):
    """{variant: {k: {'us', 'vs_xla_1'}}}: one layer's cached attention of k query rows over
    the --max_len cache (`cpu_kernel.attention`; xla: `attention_reference`), 64 calls chained
    inside one jitted function, µs per call."""
    m = verify_cost.MODELS[name]
    h, d, length = m["num_heads"], m["head_dim"], s.max_len
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    kv = [jax.random.normal(key, (1, h, length, d), jnp.float32) for key in keys[:2]]
    reps = 64
    calls = {}
    for v in variants:
        if v.no_matmul or v.auto or v.weight_dtype != "float32":
            continue
        fn_attn = cpu_kernel.attention if v.kernel else cpu_kernel.attention_reference

        def chain(q, k, vv, bias, fn_attn=fn_attn):
            def body(i, q):
                return q + 1e-3 * fn_attn(q, k, vv, bias)

            return jax.lax.fori_loop(0, reps, body, q)

        for kk in ks:
            q = jax.random.normal(keys[2], (1, kk, h, d), jnp.float32)
            bias = jnp.zeros((1, h, kk, length), jnp.float32)
            fn = jax.jit(chain)
            call = _on_path(v, libs, functools.partial(fn, q, kv[0], kv[1], bias))
            with _traced_as(v):
                call()
            calls[(v.name, kk)] = call
    times = clock.time_interleaved(calls, rounds, warmup=1, shuffle=True)
    times = {key: np.asarray(t) * 1e3 / reps for key, t in times.items()}  # µs per call
    out = {}
    for (vname, kk), t in times.items():
        row = out.setdefault(vname, {})[str(kk)] = {"us": float(np.median(t))}
        if ("xla", ks[0]) in times:
            row["vs_xla_1"] = float(np.median(t / times[("xla", ks[0])]))
    return out


def steps(name: str, variants, libs, ks, s: verify_cost.Settings) -> dict[str, Any]:
    """{variant: {k: {'ms', 'ms_q25_q75', 'ratio', 'ratio_q25', 'ratio_q75', 'vs_xla_1'}}}."""
    module, params, enc, cache = verify_cost.build(name, s)
    packed, chosen = {}, {}
    for v in variants:  # one packed tree per dtype, and per path for the measured choice
        key = (v.weight_dtype, v.auto and v.isa)
        if not v.kernel or key in packed:
            continue
        with _traced_as(v):
            if v.auto:
                chosen[f"{v.isa} {v.weight_dtype}"] = _choice(params, v.weight_dtype)
            packed[key] = models.pack_params(module, params, v.weight_dtype)
    pos = jnp.full((1,), s.position, jnp.int32)
    calls = {}
    for v in variants:
        p = packed[(v.weight_dtype, v.auto and v.isa)] if v.kernel else params
        fn = verify_cost.make_fn(module, "loop", s.loop_steps)
        for k in ks:
            toks = jnp.full((1, k), 3, jnp.int32)
            call = _on_path(v, libs, functools.partial(fn, p, enc, cache, toks, pos))
            with _traced_as(v):
                call()  # traces (and compiles) under the variant's setting
            calls[(v.name, k)] = call
    times = clock.time_interleaved(calls, s.rounds, warmup=1, shuffle=True)
    times = {key: np.asarray(t) / s.loop_steps for key, t in times.items()}  # ms per step
    out = {}
    for (vname, k), t in times.items():
        ratio = t / times[(vname, ks[0])]
        row = out.setdefault(vname, {})[str(k)] = {
            "ms": float(np.median(t)),
            "ms_q25_q75": [float(np.quantile(t, q)) for q in (0.25, 0.75)],
            "ratio": float(np.median(ratio)),
            "ratio_q25": float(np.quantile(ratio, 0.25)),
            "ratio_q75": float(np.quantile(ratio, 0.75)),
        }
        if ("xla", ks[0]) in times:
            row["vs_xla_1"] = float(np.median(t / times[("xla", ks[0])]))
        if ("xla", k) in times:
            row["vs_xla_k"] = float(np.median(t / times[("xla", k)]))
    if chosen:
        out["choice"] = chosen
    return out


def _choice(params, dtype: str) -> dict[str, Any]:
    """`choice.ensure` for a model's decode projections on the current path (timed now unless
    cached): its cost and the choice per shape and rows bucket."""
    shapes = {
        cpu_params._choice_shape(cpu_params._node(params, p))
        for p in cpu_params._projection_paths(params)
    }
    cost = choice.ensure(shapes, dtype)
    table = {}
    for k, n in sorted(shapes):
        for b in choice.BUCKETS:
            e = choice.entry(extension.isa(), dtype, k, n, b)
            if e is not None:
                table.setdefault(f"{k}x{n}", {})[str(b)] = {
                    "choice": choice.choose(k, n, b, dtype, True),
                    "us": {c: round(t * 1e6, 2) for c, t in e["s"].items()},
                }
    return {"cost": cost, "table": table}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# The CPU kernel's code paths side by side{result['title']}", ""]
    ks = result["settings"]["ks"]
    for name, res in result.get("steps", {}).items():
        lines += [
            f"## {name}: in-loop decoder step (ms per step; step(k) / step({ks[0]}) per-round "
            f"median; vs XLA's k = {ks[0]})",
            "",
            "| variant | " + " | ".join(f"k = {k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        for v, per_k in res.items():
            if v == "choice":
                continue
            cells = []
            for k in ks:
                r = per_k[str(k)]
                extra = f", {r['vs_xla_1']:.2f}x xla" if "vs_xla_1" in r else ""
                extra += f", {r['vs_xla_k']:.2f}x xla(k)" if "vs_xla_k" in r else ""
                cells.append(f"{r['ms']:.2f} ms ({r['ratio']:.2f}x{extra})")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines.append("")
        for where, c in res.get("choice", {}).items():
            cost = c["cost"]
            lines += [
                f"Choice on {where}: timed {cost['measured']} (shape, rows) in "
                f"{cost['seconds']:.1f} s ({cost['cached']} cached); per shape, rows: choice "
                "(µs per product split / single / xla)",
                "",
            ]
            for shape, per_b in c["table"].items():
                cells = [
                    f"{b}: {r['choice']} ({r['us'].get('split', 0):.1f} / "
                    f"{r['us'].get('single', 0):.1f} / {r['us'].get('xla', 0):.1f})"
                    for b, r in per_b.items()
                ]
                lines.append(f"- {shape}: " + "; ".join(cells))
            lines.append("")
    for name, res in result.get("attention", {}).items():
        lines += [
            f"## {name}: one layer's cached attention alone, k query rows over the cache "
            "(µs per call)",
            "",
            "| variant | " + " | ".join(f"k = {k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        for v, per_k in res.items():
            lines.append(f"| {v} | " + " | ".join(f"{per_k[str(k)]['us']:.1f}" for k in ks) + " |")
        lines.append("")
    if "dots" in result:
        ms = result["settings"]["dot_ms"]
        lines += [
            "## Isolated `x [M, in] @ W [in, out]`, weights streamed: µs per product "
            "(GFLOP/s, GB/s of weights)",
            "",
            "| W | variant | " + " | ".join(f"M = {m}" for m in ms) + " |",
            "|---|---|" + "---|" * len(ms),
        ]
        for shape, res in result["dots"].items():
            for v, per_m in res.items():
                cells = [
                    f"{r['us']:.0f} ({r['gflops']:.0f}, {r['weight_gbs']:.0f})"
                    for r in (per_m[str(m)] for m in ms)
                ]
                lines.append(f"| {shape} | {v} | " + " | ".join(cells) + " |")
        lines.append("")
    s = result["settings"]
    lines += [
        f"- batch 1, enc_len {s['enc_len']}, cache length {s['max_len']}, block at position "
        f"{s['position']}, {s['rounds']} interleaved rounds, {s['loop_steps']} steps per "
        f"`fori_loop`; products and attention: {s['dot_rounds']} rounds, {s['stream_mib']:g} MiB of "
        "weights per product shape; random float32 weights.",
        f"- kernel code path detected: `{result['isa_detected']}`; --before: `{result['before']}`",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- date: `{result['date']}`",
        f"- hardware: {result['hardware']}",
        f"- load average before / after: {result['load_before']} / {result['load_after']}",
    ]
    return "\n".join(lines) + "\n"


def _csv(kind=str):
    return lambda text: [kind(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variants", type=_csv(), default="xla,kernel@avx2+fma,kernel@avx512f")
    p.add_argument("--before", default=None, help="another build of _matmul*.so (for *_before)")
    p.add_argument("--models", type=_csv(), default="embedded,small_v8192,base_v8192")
    p.add_argument("--ks", type=_csv(int), default="1,8")
    p.add_argument("--dot_models", type=_csv(), default="embedded,small_v8192")
    p.add_argument("--dot_ms", type=_csv(int), default="1,2,4,6,8,12,16")
    p.add_argument("--stream_mib", type=float, default=96)
    p.add_argument("--dot_rounds", type=int, default=9)
    p.add_argument("--position", type=int, default=32)
    p.add_argument("--enc_len", type=int, default=64)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--loop_steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--attention", action="store_true", help="time one layer's attention alone")
    p.add_argument("--no_steps", dest="steps", action="store_false", help="skip the steps")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default="results/verify_cost/avx2")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, prog: str = "scripts/profile_isa.py") -> pathlib.Path:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    variants = [Variant.parse(v) for v in args.variants]
    if not cpu_kernel.available() and any(v.kernel for v in variants):
        raise RuntimeError(f"the CPU kernel is not available: {cpu_kernel.disabled_reason()}")
    libs = [extension.library()] if cpu_kernel.available() else []
    if any(v.before for v in variants):
        if not args.before:
            raise ValueError("*_before variants need --before PATH (another build of the .so).")
        libs.append(load_before(args.before))
    s = verify_cost.Settings(
        position=args.position,
        enc_len=args.enc_len,
        max_len=args.max_len,
        loop_steps=args.loop_steps,
        rounds=args.rounds,
    )
    result = {
        "title": f" ({args.tag})" if args.tag else "",
        "command": shlex.join(["python", prog, *argv]),
        "commit": provenance.git_commit(),
        "date": provenance.utc_date(),
        "hardware": provenance.hardware_info() | provenance.cpu_details(),
        "isa_detected": cpu_kernel.isa(),
        "before": args.before,
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "settings": dataclasses.asdict(s)
        | {
            "ks": args.ks,
            "dot_ms": args.dot_ms,
            "stream_mib": args.stream_mib,
            "dot_rounds": args.dot_rounds,
        },
    }
    try:
        if args.dot_models:
            shapes = sorted({sh for m in args.dot_models for sh in projection_shapes(m)})
            print(f"timing isolated products {shapes} ...", flush=True)
            result["dots"] = dots(
                shapes, variants, libs, args.dot_ms, args.dot_rounds, args.stream_mib
            )
        if args.attention:
            result["attention"] = {}
            for name in args.models:
                print(f"timing {name} attention ...", flush=True)
                result["attention"][name] = attention(
                    name, variants, libs, args.ks, s, args.dot_rounds
                )
        result["steps"] = {}
        for name in args.models if args.steps else ():
            print(f"timing {name} steps ...", flush=True)
            result["steps"][name] = steps(name, variants, libs, args.ks, s)
    finally:
        for lib in libs:
            lib.SpecdecMatmulForceIsa(-1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("isa_paths" + (f"_{args.tag}" if args.tag else "") + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(result))
    print(path.with_suffix(".md").read_text())
    return path
