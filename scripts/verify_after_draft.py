"""T(k) of the shipped En→De target timed after a draft step and after a target step.

    python scripts/verify_after_draft.py 8,32     # decoder positions; prints one line each

`cost_curve.step_costs` times, in each round and in this order: the one-token target step, the
draft step, the γ + 1 = 6-token verify step (so right after the draft), then T(k) for k in
`block_sizes` (each right after the previous target call). `verify` and `block 6` therefore run
the same call, once after the draft and once after the target. The gap between them is what the
draft running first costs the verify step on this machine's caches (results/verify_cost/README.md,
"Session 16"). Prints the medians in ms; writes nothing.
"""

import sys

import jax.numpy as jnp

from specdec_t5x import cost_curve, eval_inputs, gin_utils

SOURCE = "translate English to German: simple command-line image viewer for the X window system"


def main(positions: list[int]) -> None:
    gin_utils.parse(
        [
            "models/embedded_ende_target.gin",
            "decoding/speculative.gin",
            "models/embedded_ende_draft.gin",
        ],
        ["gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS)"],
    )
    model, params = gin_utils.build()
    tokens = model.output_vocabulary.encode(SOURCE) + [model.eos_id]
    enc = jnp.asarray(eval_inputs.pad_rows([tokens], 64))
    for pos in positions:
        r = cost_curve.step_costs(
            model,
            params,
            model.draft.params,
            enc,
            64,
            5,
            position=pos,
            repeats=30,
            block_sizes=(1, 2, 3, 4, 6, 8),
        )
        blocks = {k: round(v, 3) for k, v in r["block_step_ms"].items()}
        print(
            f"position {pos}: T(k) ms {blocks}; target {r['target_step_ms']:.3f}, "
            f"verify (6 tokens, after the draft) {r['verify_step_ms']:.3f}, "
            f"ratio {r['verify_cost_ratio']:.3f}, c {r['c']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main([int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "8,32").split(",")])
