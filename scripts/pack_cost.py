"""Cost of packing inside a user's jitted `predict_batch_with_aux` over raw parameters.

  python scripts/pack_cost.py --rounds 30      # -> results/verify_cost/pack_cost_wall.{json,md}
  python scripts/pack_cost.py --rounds 30 --clock cpu   # -> pack_cost_cpu.{json,md}

A user who jits `model.predict_batch_with_aux(params, batch)` over the raw T5X tree gets the CPU
kernel without calling anything: the decoder projections are packed inside that call, every call.
Issue 9 accepts this if it costs <= 5% of a 64-token decode. This times, on the shipped embedded
target (and its T5 draft for the speculative rows), batch 1, one jitted call per variant:

* `raw` (kernel on, raw params: packs inside the call), `packed` (kernel on, params packed once
  outside: what the eval job does), `xla` (`SPECDEC_CPU_KERNEL=0` at trace time: jnp.dot);
* `pack_only`: the jitted `steps.pack_params` of the same tree alone;

for the greedy baseline and greedy speculative decoding (γ = --gamma), decoding exactly --length
tokens (EOS set to an id the model never emits, so every call runs the full length) on DDTP test sentences.
Variants are interleaved round by round in rotating order; per round, `raw - packed` is the packing
overhead; medians over rounds are reported, with IQRs. Writes command, commit, hardware and date.
"""

import argparse
import json
import pathlib
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, drafts, gin_utils, models, provenance, steps

GIN_FILE = "gin/experiments/embedded_ende_model_t0.gin"


class _NoEos:
    eos_id = 8191  # the last id of the 8192-entry vocabulary: never emitted (checked below)


def _inputs(n: int, input_len: int) -> list[np.ndarray]:
    from specdec_t5x import eval_inputs

    examples, _ = eval_inputs.load_examples("ddtp_ende", "test", n, input_len, 64)
    rows = []
    for ex in examples:
        row = np.zeros((1, input_len), np.int32)
        row[0, : len(ex["inputs"])] = ex["inputs"][:input_len]
        rows.append(row)
    return rows


def _q(xs, q):
    return float(np.percentile(xs, q))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--length", type=int, default=64, help="decoded tokens per call")
    p.add_argument("--gamma", type=int, default=5)
    p.add_argument("--input_len", type=int, default=64)
    p.add_argument("--sentences", type=int, default=5, help="DDTP test inputs, one per round")
    p.add_argument("--out", default="results/verify_cost")
    p.add_argument("--note", default="", help="conditions (e.g. other jobs running)")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter; cpu: this process's CPU time, all threads (less sensitive to "
        "other jobs taking the cores, still sensitive to their cache and memory traffic)",
    )
    args = p.parse_args(argv)
    if cpu_kernel.disabled_reason() is not None:
        sys.exit(f"the CPU kernel is off here: {cpu_kernel.disabled_reason()}")

    gin_utils.parse(
        [GIN_FILE],
        ["gin_utils.build.obj = (%TARGET_MODULE, %DRAFT_MODULE, %TARGET_PARAMS, %DRAFT_PARAMS)"],
        finalize=False,
    )
    target, draft_module, raw, draft_raw = gin_utils.build()  # raw T5X trees
    packed = steps.pack_params(target, raw)
    draft_packed = steps.pack_params(draft_module, draft_raw)
    greedy = {"temperature": 0.0}
    base = models.EncoderDecoderModel(target, output_vocabulary=_NoEos())
    spec = models.SpeculativeEncoderDecoderModel(
        target, drafts.T5Draft(draft_module, draft_raw), output_vocabulary=_NoEos()
    )

    def base_fn(tp, b):
        return base.predict_batch_with_aux(tp, b, decoder_params=greedy)[0]

    def spec_fn(tp, dp, b):
        decoder_params = {**greedy, "gamma": args.gamma}
        return spec.predict_batch_with_aux(tp, b, decoder_params=decoder_params, draft_params=dp)[0]

    batches = [
        {
            "encoder_input_tokens": jnp.asarray(x),
            "decoder_input_tokens": jnp.zeros((1, args.length), jnp.int32),
        }
        for x in _inputs(args.sentences, args.input_len)
    ]
    calls = {}  # name -> (jitted fn, args builder)
    for name, fn, params in (
        ("baseline", base_fn, {"raw": (raw,), "packed": (packed,), "xla": (raw,)}),
        (
            "speculative",
            spec_fn,
            {"raw": (raw, draft_raw), "packed": (packed, draft_packed), "xla": (raw, draft_raw)},
        ),
    ):
        for variant, ps in params.items():
            jitted = jax.jit(fn)
            with cpu_kernel.env_setting(variant != "xla"):  # read when traced
                tokens = jax.block_until_ready(jitted(*ps, batches[0]))
            assert tokens.shape == (1, args.length) and not np.any(tokens == _NoEos.eos_id)
            calls[(name, variant)] = (jitted, ps)
    pack_target = jax.jit(lambda p: steps.pack_params(target, p))
    jax.block_until_ready(pack_target(raw))
    calls[("pack_only", "target")] = (pack_target, (raw,))

    # Greedy tokens of every variant equal (exactness; the kernel only changes summation order).
    for name in ("baseline", "speculative"):
        outs = [
            np.asarray(calls[(name, v)][0](*calls[(name, v)][1], batches[1 % len(batches)]))
            for v in ("raw", "packed", "xla")
        ]
        assert all(np.array_equal(outs[0], o) for o in outs), name

    keys = list(calls)
    times = {k: [] for k in keys}
    for r in range(args.rounds):
        batch = batches[r % len(batches)]
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            fn, ps = calls[key]
            call_args = ps if key[0] == "pack_only" else (*ps, batch)
            start, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(*call_args))
            clock = (
                time.process_time() - cpu if args.clock == "cpu" else time.perf_counter() - start
            )
            times[key].append(1e3 * clock)

    rows = {}
    for name in ("baseline", "speculative"):
        raw_t, packed_t, xla_t = (np.asarray(times[(name, v)]) for v in ("raw", "packed", "xla"))
        overhead = raw_t - packed_t
        rows[name] = {
            "ms": {v: statistics.median(times[(name, v)]) for v in ("raw", "packed", "xla")},
            "iqr_ms": {
                v: [_q(times[(name, v)], 25), _q(times[(name, v)], 75)]
                for v in ("raw", "packed", "xla")
            },
            "pack_overhead_ms": float(np.median(overhead)),
            "pack_overhead_iqr_ms": [_q(overhead, 25), _q(overhead, 75)],
            "pack_overhead_fraction": float(np.median(overhead / packed_t)),
            "raw_over_xla": float(np.median(raw_t / xla_t)),
            "packed_over_xla": float(np.median(packed_t / xla_t)),
        }
    result = {
        "rounds": args.rounds,
        "clock": args.clock,
        "length": args.length,
        "gamma": args.gamma,
        "input_len": args.input_len,
        "pack_only_ms": statistics.median(times[("pack_only", "target")]),
        "target_projection_bytes": int(sum(x.nbytes for x in cpu_kernel.packed_arrays(packed))),
        "rows": rows,
        "note": args.note,
        **provenance.record(
            shlex.join(["python", "scripts/pack_cost.py", *(argv or sys.argv[1:])])
        ),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pack_cost_{args.clock}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Packing inside a jitted predict call over raw parameters ({args.length}-token decodes)",
        "",
        *(f"* {line}" for line in provenance.markdown_lines(result)),
        f"* clock: {args.clock}; {args.rounds} interleaved rounds, batch 1, embedded target (+ T5 draft, γ = {args.gamma}); "
        f"{result['target_projection_bytes'] / 2**20:.1f} MiB of target projections packed per call.",
        f"* Conditions: {args.note or '-'}",
        "",
        "| decode | raw params (packs inside) | packed once | XLA (`SPECDEC_CPU_KERNEL=0`) | "
        "pack overhead | overhead / decode | raw / XLA | packed / XLA |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        ms = row["ms"]
        lines.append(
            f"| {name} | {ms['raw']:.1f} ms | {ms['packed']:.1f} ms | {ms['xla']:.1f} ms | "
            f"{row['pack_overhead_ms']:.1f} ms (IQR {row['pack_overhead_iqr_ms'][0]:.1f}–"
            f"{row['pack_overhead_iqr_ms'][1]:.1f}) | {100 * row['pack_overhead_fraction']:.1f}% | "
            f"{row['raw_over_xla']:.3f} | {row['packed_over_xla']:.3f} |"
        )
    lines += [
        "",
        f"`steps.pack_params` of the target alone, jitted: {result['pack_only_ms']:.1f} ms.",
    ]
    (out / f"pack_cost_{args.clock}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
