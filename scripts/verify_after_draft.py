"""T(k) of the shipped En→De target timed after a draft step and after a target step.

    python scripts/verify_after_draft.py --positions 8,32 --out results/verify_cost

`step_timer.step_costs` times, in each round and in this order: the one-token target step, the
draft step, the γ + 1 = 6-token verify step (so right after the draft), then T(k) for k in
`block_sizes` (each right after the previous target call). `verify` and `block 6` therefore run
the same call, once after the draft and once after the target. The gap between them is what the
draft running first costs the verify step on this machine's caches (results/verify_cost/README.md,
"Session 16"). Writes <out>/verify_after_draft.{json,md}: the medians in ms per position, with
command, commit, hardware and date.
"""

import argparse
import sys

import jax.numpy as jnp

from specdec_t5x import gin_utils, inputs, provenance
from specdec_t5x.timing import step_timer

SOURCE = "translate English to German: simple command-line image viewer for the X window system"


def _table(result: dict) -> str:
    lines = [
        "# T(6) after a draft step vs after a target step (shipped En→De pair)",
        "",
        "| position | T(1) ms | T(6) after a target step, ms | T(6) after the draft, ms "
        "| ratio after target | ratio after draft | c |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['position']} | {row['block_step_ms']['1']:.3f} | "
            f"{row['block_step_ms']['6']:.3f} | {row['verify_step_ms']:.3f} | "
            f"{row['block_step_ms']['6'] / row['block_step_ms']['1']:.2f} | "
            f"{row['verify_cost_ratio']:.2f} | {row['c']:.3f} |"
        )
    lines += ["", *(f"- {note}" for note in provenance.markdown_lines(result))]
    return "\n".join(lines) + "\n"


def main(positions: list[int], out: str) -> None:
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
    enc = jnp.asarray(inputs.pad_rows([tokens], 64))
    rows = []
    for pos in positions:
        r = step_timer.step_costs(
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
        rows.append(
            {
                "position": pos,
                "block_step_ms": {str(k): v for k, v in r["block_step_ms"].items()},
                **{k: r[k] for k in ("target_step_ms", "verify_step_ms", "verify_cost_ratio", "c")},
            }
        )
    command = "python " + " ".join(sys.argv)
    path = provenance.write_results({"rows": rows}, out, "verify_after_draft", command, _table)
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", default="8,32", help="decoder positions, comma-separated")
    parser.add_argument("--out", default="results/verify_cost")
    args = parser.parse_args()
    main([int(a) for a in args.positions.split(",")], args.out)
