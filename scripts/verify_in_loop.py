"""Why the eval job's verify/step (γ = 5, k = 6) reads higher than profile_verify's k = 8 ratio.

  python scripts/verify_in_loop.py --rounds 40      # -> results/verify_cost/in_loop_{cpu,wall}.{json,md}

On the shipped embedded target (packed for the CPU kernel), one DDTP test input, batch 1, cache
length 64, 8 steps per `fori_loop` call, k = 1 and k = 6, interleaved rounds:

1. `job`: the eval job's own measurement (`step_timer.step_costs`: target, draft and verify
   steps interleaved, wall clock, ratio of medians), --job_repeats rounds.
2. Harness variants, same process, median of per-round ratios, --clock: `eval_style` (constant
   tokens, one logit consumed, position 8: `benchmark.time_decoder_steps`), `carry_tokens` (tokens
   depend on the loop carry: nothing hoistable), `consume_all` (max over every logit),
   `profile_style` (both: `scripts/profile_verify.py`'s loop mode), `eval_style@32` (position 32).
3. Cache state: each timed call preceded by an untimed call of the same step (`warm`: the target's
   26 MiB of projections partly in the 32 MiB L3) or by a 48 MiB streaming pass (`cold`).
4. The kernel's compute rate with cache-hot weights: `cpu_kernel.matmul` of one 256 x 1024 matrix
   (1 MiB, L2-resident), 200 products per `fori_loop`, M = 1..16, against `jnp.dot`.

Writes command, commit, hardware, date and load with the tables.
"""

import argparse
import json
import pathlib
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, gin_utils, provenance, steps
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.timing import step_timer

GIN_FILE = "gin/experiments/embedded_ende_model_t0.gin"
STEPS = 8


def _clock(kind):
    return time.process_time if kind == "cpu" else time.perf_counter


def _hot_matmul(clock, k=256, n=1024, reps=200, rounds=15) -> dict:
    w = jax.random.normal(jax.random.PRNGKey(0), (k, n))
    packed = cpu_kernel.pack(w)
    out = {}
    for m in (1, 2, 4, 6, 8, 12, 16):
        x = jax.random.normal(jax.random.PRNGKey(1), (m, k))

        def chain(x, w, product):  # each product depends on the last: nothing hoisted
            body = lambda i, acc: acc + product(x + 0 * acc[:, :k], w)  # noqa: E731
            return jax.lax.fori_loop(0, reps, body, jnp.zeros((x.shape[0], n)))

        fns = {
            "kernel": (
                jax.jit(lambda x, w: chain(x, w, lambda a, b: cpu_kernel.matmul(a, b, n))),
                packed,
            ),
            "xla": (jax.jit(lambda x, w: chain(x, w, jnp.dot)), w),
        }
        row = {}
        for name, (fn, weights) in fns.items():
            jax.block_until_ready(fn(x, weights))
            ts = []
            for _ in range(rounds):
                start = clock()
                jax.block_until_ready(fn(x, weights))
                ts.append((clock() - start) / reps)
            t = float(np.median(ts))
            row[f"{name}_us"], row[f"{name}_gflops"] = 1e6 * t, 2 * m * k * n / t / 1e9
        out[str(m)] = row
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--job_repeats", type=int, default=30)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--out", default="results/verify_cost")
    p.add_argument("--note", default="", help="conditions (e.g. other jobs running)")
    args = p.parse_args(argv)

    gin_utils.parse([GIN_FILE], ["gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS)"], False)
    spec_model, raw = gin_utils.build()
    module = spec_model.module
    params = steps.pack_params(module, raw)
    del raw
    examples, _ = inputs_lib.load_examples("ddtp_ende", "test", 1, 64, 64)
    enc = np.zeros((1, 64), np.int32)
    enc[0, : len(examples[0]["inputs"])] = examples[0]["inputs"]
    enc = jnp.asarray(enc)
    result = {"clock": args.clock, "rounds": args.rounds, "note": args.note}

    # 1. The eval job's own numbers.
    costs = step_timer.step_costs(
        spec_model, params, spec_model.draft.params, enc, 64, 5, repeats=args.job_repeats
    )
    result["job"] = {k: costs[k] for k in ("target_step_ms", "verify_step_ms", "verify_cost_ratio")}

    # 2 + 3. Harness variants and cache state.
    cache0 = jax.jit(lambda p, e: steps.prepare_cache(module, p, e, 64))(params, enc)

    def make(carry_tokens, consume_all):
        def run(p, e, tokens, positions, cache):
            step = steps.make_block_step(module, p, e)

            def body(_, carry):
                cache, total = carry
                toks = tokens + (total[0] > 1e30).astype(jnp.int32) if carry_tokens else tokens
                logits, cache = step(toks, positions, cache)
                return cache, total + (jnp.max(logits) if consume_all else logits[:, -1, 0])

            total = jnp.zeros((tokens.shape[0],), jnp.float32)
            cache, total = jax.lax.fori_loop(0, STEPS, body, (cache, total))
            return total, cache

        return jax.jit(run, donate_argnums=(4,))

    harness = {
        "eval_style": (make(False, False), 8),
        "eval_style@32": (make(False, False), 32),
        "carry_tokens": (make(True, False), 8),
        "consume_all": (make(False, True), 8),
        "profile_style": (make(True, True), 8),
    }
    caches = {}

    def thunk(name, k):
        fn, pos = harness[name]
        toks, positions = jnp.full((1, k), 5, jnp.int32), jnp.full((1,), pos, jnp.int32)

        def call():
            if (name, k) not in caches:
                caches[(name, k)] = jax.tree_util.tree_map(jnp.copy, cache0)
            total, caches[(name, k)] = fn(params, enc, toks, positions, caches[(name, k)])
            return total

        return call

    calls = {(n, k): thunk(n, k) for n in harness for k in (1, 6)}
    big = jnp.ones((48 * 2**20 // 4,), jnp.float32)
    flush = jax.jit(lambda x: jnp.sum(x * 1.0001))
    for c in [*calls.values(), lambda: flush(big)]:
        jax.block_until_ready(c())
        jax.block_until_ready(c())
    clock = _clock(args.clock)
    modes = [(n, None) for n in harness] + [("eval_style", "warm"), ("eval_style", "cold")]
    keys = [(n, m, k) for n, m in modes for k in (1, 6)]
    times = {key: [] for key in keys}
    for r in range(args.rounds):
        for name, mode, k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            if mode == "warm":
                jax.block_until_ready(calls[(name, k)]())
            elif mode == "cold":
                jax.block_until_ready(flush(big))
            start = clock()
            jax.block_until_ready(calls[(name, k)]())
            times[(name, mode, k)].append(1e3 * (clock() - start) / STEPS)
    rows = {}
    for name, mode in modes:
        t1, t6 = np.asarray(times[(name, mode, 1)]), np.asarray(times[(name, mode, 6)])
        rows[name if mode is None else f"{name} ({mode})"] = {
            "k1_ms": float(np.median(t1)),
            "k6_ms": float(np.median(t6)),
            "ratio": float(np.median(t6 / t1)),
        }
    result["harness"] = rows
    result["hot_matmul"] = _hot_matmul(clock)
    command = shlex.join(["python", "scripts/verify_in_loop.py", *(argv or sys.argv[1:])])
    result.update(provenance.record(command))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"in_loop_{args.clock}.json").write_text(json.dumps(result, indent=2) + "\n")
    job = result["job"]
    lines = [
        "# Verify step (k = 6) vs one-token step in the loop: harness and cache-state variants",
        "",
        *(f"* {line}" for line in provenance.markdown_lines(result)),
        f"* Conditions: {args.note or '-'}; clock {args.clock}; {args.rounds} rounds.",
        "",
        f"Eval job's own measurement (`step_timer.step_costs`, wall clock): target step "
        f"{job['target_step_ms']:.3f} ms, verify (k = 6) {job['verify_step_ms']:.3f} ms, "
        f"ratio {job['verify_cost_ratio']:.3f}.",
        "",
        "| variant | k = 1 ms/step | k = 6 ms/step | ratio (median per round) |",
        "|---|---|---|---|",
        *(
            f"| {n} | {r['k1_ms']:.3f} | {r['k6_ms']:.3f} | {r['ratio']:.3f} |"
            for n, r in rows.items()
        ),
    ]
    lines += [
        "",
        "Cache-hot 256 x 1024 product (µs per product, GFLOP/s):",
        "",
        "| M | kernel | jnp.dot |",
        "|---|---|---|",
        *(
            f"| {m} | {r['kernel_us']:.1f} µs, {r['kernel_gflops']:.0f} | "
            f"{r['xla_us']:.1f} µs, {r['xla_gflops']:.0f} |"
            for m, r in result["hot_matmul"].items()
        ),
    ]
    (out / f"in_loop_{args.clock}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
