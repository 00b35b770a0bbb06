"""Does the verify ratio T(6)/T(1) depend on the weights' values, or on how it is timed?

    python scripts/verify_weights_check.py --rounds 30 --out results/verify_cost

Session 16 left open why `profile_verify.py` (random weights) read the embedded target's
T(6)/T(1) at 1.08 on the AMD VM while the eval job's step timer on the shipped En→De pair read
1.19–1.47. Here both factors are crossed in one process, every call interleaved by
`clock.time_interleaved`:

* weights: the shipped En→De target (`trained`) and the same module with `module.init`'s weights
  (`random`), both packed for the CPU kernel, caches built from the same DDTP source;
* harness: `one logit` (what `clock.looped_steps` keeps live: `logits[:, -1, 0]`) and
  `all logits` (the max over every logit, as `profile_verify.py`); tokens depend on the loop carry
  in both, 8 steps per `fori_loop` call, block at decoder position 32;
* k = 1 and k = 6 tokens per step.

Writes <out>/verify_weights_check.{json,md}: ms per step (medians) and the median per-round ratio
T(6)/T(1) of each (weights, harness) pair, with command, commit, hardware and date.
"""

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import gin_utils, inputs, provenance, steps
from specdec_t5x.timing import clock, step_timer

SOURCE = "translate English to German: simple command-line image viewer for the X window system"
HARNESSES = {
    "one logit": lambda logits: logits[:, -1, 0].sum(),
    "all logits": jnp.max,
}
STEPS = 8


def _looped(module, reduce):
    step = step_timer.decoder_step(module)

    def run(params, enc, cache, tokens, positions):
        def body(_, carry):
            cache, acc = carry
            toks = tokens + (acc > 1e30).astype(jnp.int32)  # carry-dependent: nothing hoisted
            logits, cache = step(params, enc, toks, positions, cache)
            return cache, acc + reduce(logits)

        return jax.lax.fori_loop(0, STEPS, body, (cache, jnp.float32(0)))[1]

    return jax.jit(run)


def _table(result: dict) -> str:
    lines = [
        "# T(6) / T(1) of the embedded En→De target: trained vs random weights, two harnesses",
        "",
        "| weights | harness | T(1) ms | T(6) ms | T(6) / T(1) (median per round) |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['weights']} | {row['harness']} | {row['t1_ms']:.3f} | {row['t6_ms']:.3f} "
            f"| {row['ratio']:.2f} |"
        )
    lines += [
        "",
        f"- {result['rounds']} interleaved rounds, {STEPS} steps per `fori_loop` call, batch 1, "
        "source and cache length 64, block at decoder position 32, float32 weights packed for "
        "the CPU kernel.",
        *(f"- {note}" for note in provenance.markdown_lines(result)),
    ]
    return "\n".join(lines) + "\n"


def main(rounds: int, out: str) -> None:
    gin_utils.parse(
        [
            "models/embedded_ende_target.gin",
            "decoding/speculative.gin",
            "models/embedded_ende_draft.gin",
        ],
        ["gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS)"],
    )
    model, trained = gin_utils.build()
    module = model.module
    tokens = model.output_vocabulary.encode(SOURCE) + [model.eos_id]
    enc = jnp.asarray(inputs.pad_rows([tokens], 64))
    ones = jnp.ones((1, 4), jnp.int32)
    random = module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)["params"]
    pos = jnp.full((1,), 32, jnp.int32)
    calls = {}
    for weights, raw in (("trained", trained), ("random", random)):
        params = steps.pack_params(module, raw, "float32")
        cache = jax.jit(lambda p, e: steps.prepare_cache(module, p, e, 64))(params, enc)
        for harness, reduce in HARNESSES.items():
            fn = _looped(module, reduce)
            for k in (1, 6):
                block = jnp.full((1, k), 5, jnp.int32)
                calls[(weights, harness, k)] = lambda fn=fn, p=params, c=cache, b=block: fn(
                    p, enc, c, b, pos
                )
    times = clock.time_interleaved(calls, rounds, warmup=2)
    rows = []
    for weights in ("trained", "random"):
        for harness in HARNESSES:
            t1 = np.asarray(times[(weights, harness, 1)]) / STEPS
            t6 = np.asarray(times[(weights, harness, 6)]) / STEPS
            rows.append(
                {
                    "weights": weights,
                    "harness": harness,
                    "t1_ms": float(np.median(t1)),
                    "t6_ms": float(np.median(t6)),
                    "ratio": clock.paired_ratio(list(t6), list(t1)),
                }
            )
            print(rows[-1], flush=True)
    command = "python " + " ".join(sys.argv)
    path = provenance.write_results(
        {"rows": rows, "rounds": rounds}, out, "verify_weights_check", command, _table
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default="results/verify_cost")
    args = parser.parse_args()
    main(args.rounds, args.out)
