"""A set-up switch on and off: decode times of the shipped pairs, interleaved.

    python scripts/encoder_buckets_ab.py --num_examples 40 --rounds 6 --out results/encoder_buckets
    python scripts/encoder_buckets_ab.py --switch setup_kernel --out results/setup_kernel

`--switch buckets` (default): encoder length buckets (`steps.bucketed`) against the padded length
(`SPECDEC_ENCODER_BUCKETS=0`, read while tracing). `--switch setup_kernel`: the set-up's
projections (encoder, cross-attention K/V) on the CPU kernel against `jnp.dot`
(`SPECDEC_CPU_KERNEL_SETUP=0`, read while packing). Each variant packs and traces under its own
setting.

For each task (DDTP En→De, T = 0; Debian summarization, T = 0 and T = 1) the shipped target and
draft decode the first `--num_examples` validation sources, batch 1, γ = the task's fixed-γ gin
setting, four ways: the baseline (`decoding.temperature_sample`) and speculative decoding, each
with the switch on (the default) and off. Every round times all four on every source in
a seeded random order (compilation and one warm-up call excluded); the table gives the median
over rounds of the per-source mean time and of the per-round speed-up, and whether the four
decodes of each source agree (greedy: token for token).

Writes <out>/<switch name>.{json,md} (encoder_buckets or setup_kernel) with command, commit,
hardware and date.
"""

import argparse
import random
import statistics
import sys
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, gin_utils, models, provenance, steps
from specdec_t5x import inputs as inputs_lib

TASKS = {  # name: (seqio task, target gin, draft gin, enc_len, max_decode_len, γ, temperatures)
    "ende": ("ddtp_ende", "embedded_ende_target", "embedded_ende_draft", 64, 64, 2, (0.0,)),
    "sum": (
        "debian_summarize",
        "embedded_sum_target",
        "embedded_sum_draft_te",
        256,
        32,
        2,
        (0.0, 1.0),
    ),
}
SWITCHES = {  # --switch: (environment variable, {variant: its value}, output name, title)
    "buckets": (
        steps.BUCKETS_ENV_VAR,
        {"buckets": "1", "padded": "0"},
        "encoder_buckets",
        "Encoder length buckets: decode time per source with and without them",
    ),
    "setup_kernel": (
        cpu_kernel.SETUP_ENV_VAR,
        {"kernel": "1", "jnp_dot": "0"},
        "setup_kernel",
        "Set-up projections on the CPU kernel or on jnp.dot: decode time per source",
    ),
}


def _build(target_gin: str, draft_gin: str):
    gin.clear_config(clear_constants=True)  # one configuration per task in this process
    gin_utils.parse(
        [f"models/{target_gin}.gin", "decoding/speculative.gin", f"models/{draft_gin}.gin"],
        ["gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS)"],
    )
    model, params = gin_utils.build()
    return model, model.pack_params(params)


def _speculative(model, settings: dict):
    """`(params, draft_params, batch, rng) -> decodes` of `model` (to jit)."""
    return lambda p, d, x, r: model.predict_batch_with_aux(p, x, r, settings, draft_params=d)[0]


def _measure(
    name: str, temperature: float, num_examples: int, rounds: int, seed: int, switch: str
) -> dict:
    task, target_gin, draft_gin, enc_len, max_len, gamma, _ = TASKS[name]
    env_name, variants, _, _ = SWITCHES[switch]
    built = {}
    for variant, env in variants.items():
        with cpu_kernel.env_var(env_name, env):  # packing reads SPECDEC_CPU_KERNEL_SETUP
            model, params = _build(target_gin, draft_gin)
        built[variant] = (model, params, model.draft.params)
    base = models.EncoderDecoderModel(model.module, model.input_vocabulary, model.output_vocabulary)
    examples, _ = inputs_lib.load_examples(task, "validation", num_examples, enc_len, max_len)
    batches = [
        {
            "encoder_input_tokens": jnp.asarray(inputs_lib.pad_rows([e["inputs"]], enc_len)),
            "decoder_input_tokens": jnp.zeros((1, max_len), jnp.int32),
        }
        for e in examples
    ]
    settings = {"temperature": temperature}
    calls = {}
    for variant, env in variants.items():
        model, params, dparams = built[variant]
        with cpu_kernel.env_var(env_name, env):  # SPECDEC_ENCODER_BUCKETS is read while tracing
            b = jax.jit(lambda p, x, r: base.predict_batch_with_aux(p, x, r, settings)[0])
            s = jax.jit(_speculative(model, {**settings, "gamma": gamma}))
            key = jax.random.PRNGKey(0)
            jax.block_until_ready(b(params, batches[0], key))
            jax.block_until_ready(s(params, dparams, batches[0], key))
        calls[(variant, "baseline")] = lambda x, r, b=b, p=params: b(p, x, r)
        calls[(variant, "speculative")] = lambda x, r, s=s, p=params, d=dparams: s(p, d, x, r)
    # Warm-up: each length bucket once (a branch's first run pays one-time initialisation).
    warm = [
        {**batches[0], "encoder_input_tokens": e}
        for e in steps.warmup_sources(params, batches[0]["encoder_input_tokens"])
    ]
    for x in batches[:2] + warm:
        for fn in calls.values():
            jax.block_until_ready(fn(x, jax.random.PRNGKey(0)))
    order_rng = random.Random(seed)
    per_round = {k: [] for k in calls}
    outputs = {k: [] for k in calls}
    for r in range(rounds):
        total = dict.fromkeys(calls, 0.0)
        for i, x in enumerate(batches):
            keys = list(calls)
            order_rng.shuffle(keys)
            for k in keys:
                start = time.perf_counter()
                out = jax.block_until_ready(calls[k](x, jax.random.PRNGKey(i)))
                total[k] += time.perf_counter() - start
                if r == 0:
                    outputs[k].append(np.asarray(out))
        for k in calls:
            per_round[k].append(total[k] * 1e3 / len(batches))
    rows = []
    lengths = [steps.setup_length(params, x["encoder_input_tokens"]) for x in batches]
    for variant in variants:
        base_ms, spec_ms = per_round[(variant, "baseline")], per_round[(variant, "speculative")]
        rows.append(
            {
                "task": task,
                "temperature": temperature,
                "gamma": gamma,
                "variant": variant,
                "baseline_ms_per_source": statistics.median(base_ms),
                "speculative_ms_per_source": statistics.median(spec_ms),
                "speedup": statistics.median(b / s for b, s in zip(base_ms, spec_ms, strict=True)),
                "speedup_range": [
                    min(b / s for b, s in zip(base_ms, spec_ms, strict=True)),
                    max(b / s for b, s in zip(base_ms, spec_ms, strict=True)),
                ],
                "per_round_ms": {"baseline": base_ms, "speculative": spec_ms},
            }
        )
    same = lambda a, b: sum(
        bool((x == y).all()) for x, y in zip(outputs[a], outputs[b], strict=True)
    )  # noqa: E731
    on, off = variants
    agreement = {
        f"speculative_equals_baseline_{on}": same((on, "speculative"), (on, "baseline")),
        f"speculative_equals_baseline_{off}": same((off, "speculative"), (off, "baseline")),
        f"baseline_{on}_equals_{off}": same((on, "baseline"), (off, "baseline")),
    }
    return {
        "rows": rows,
        "agreement": {**agreement, "sources": len(batches)},
        "mean_source_tokens": float(np.mean([len(e["inputs"]) for e in examples])),
        "encoder_lengths": {str(n): lengths.count(n) for n in sorted(set(lengths))},
        "enc_len": enc_len,
        "switch": switch,
    }


def _table(result: dict) -> str:
    switch = result.get("switch", "buckets")
    env_name, variants, _, title = SWITCHES[switch]
    on, off = variants
    lines = [
        f"# {title}",
        "",
        "Shipped pairs, batch 1, validation sources, interleaved rounds (median over rounds); "
        f"the switch: `{env_name}`.",
        "",
        f"| task | T | γ | {'set-up at' if switch == 'buckets' else 'set-up projections on'} | baseline ms / source | speculative ms / source | speed-up (range over rounds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for row in run["rows"]:
            lo, hi = row["speedup_range"]
            at = {
                "buckets": "bucket",
                "padded": f"padded length {run['enc_len']}",
                "kernel": "the CPU kernel",
                "jnp_dot": "jnp.dot",
            }[row["variant"]]
            lines.append(
                f"| {row['task']} | {row['temperature']:g} | {row['gamma']} | "
                f"{at} | "
                f"{row['baseline_ms_per_source']:.2f} | {row['speculative_ms_per_source']:.2f} | "
                f"{row['speedup']:.3f}× ({lo:.3f}–{hi:.3f}) |"
            )
    lines += [
        "",
        f"| task | T | sources | mean source tokens | sources per encoder length | spec = baseline ({on} / {off}) | baseline {on} = {off} |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        a, row = run["agreement"], run["rows"][0]
        lengths = ", ".join(f"{k}: {v}" for k, v in run["encoder_lengths"].items())
        lines.append(
            f"| {row['task']} | {row['temperature']:g} | {a['sources']} | {run['mean_source_tokens']:.1f} | "
            f"{lengths} | {a[f'speculative_equals_baseline_{on}']} / "
            f"{a[f'speculative_equals_baseline_{off}']} | {a[f'baseline_{on}_equals_{off}']} |"
        )
    lines += [
        "",
        "At T = 1 the agreement columns compare samples drawn with the same key: equal outputs",
        f"are not expected from speculative vs baseline (different random draws), and {on} vs",
        f"{off} baselines agree unless float32 rounding moved a sample across a boundary.",
        "",
        *([f"- during the run: {result['note']}"] if result.get("note") else []),
        *(f"- {note}" for note in provenance.markdown_lines(result)),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_examples", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default="ende,sum")
    parser.add_argument("--note", default="", help="what else ran during the measurement")
    parser.add_argument("--switch", default="buckets", choices=sorted(SWITCHES))
    parser.add_argument("--out", default=None, help="default: results/<switch's output name>")
    args = parser.parse_args(argv)
    if args.num_examples < 1 or args.rounds < 1:
        raise SystemExit(
            f"--num_examples and --rounds must be >= 1; got {args.num_examples}, {args.rounds}."
        )
    runs = []
    for name in args.tasks.split(","):
        if name not in TASKS:
            raise SystemExit(f"unknown task {name!r}; expected one of {', '.join(TASKS)}.")
        for temperature in TASKS[name][-1]:
            runs.append(
                _measure(name, temperature, args.num_examples, args.rounds, args.seed, args.switch)
            )
            for row in runs[-1]["rows"]:
                print(
                    f"{row['task']} T={row['temperature']:g} {row['variant']}: baseline "
                    f"{row['baseline_ms_per_source']:.2f} ms, speculative "
                    f"{row['speculative_ms_per_source']:.2f} ms, {row['speedup']:.3f}x",
                    flush=True,
                )
    command = "python " + " ".join(sys.argv)
    result = {"runs": runs, "note": args.note, "switch": args.switch}
    name = SWITCHES[args.switch][2]
    out = args.out or f"results/{name}"
    path = provenance.write_results(result, out, name, command, _table)
    print(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
