"""How stable the decode loops' step costs are on this machine, source by source and minute by minute.

  python scripts/loop_costs_check.py --sources 4 --repeats 3   # -> results/verify_cost/loop_costs_check.{json,md}

Runs `loops.loop_costs` (the real baseline loop, the real speculative loop and that loop with
a zero-cost draft, each timed by its slope between two lengths, decoding to the real EOS) on each of
the experiment's first `--sources` test inputs alone, then on all of them pooled, `--repeats` times
in turn. Reports T(1), the verify call (the zero-cost-draft loop's reading, `verify_only_ms`, before
the cap at the iteration), one iteration, and their ratios. What it shows on the 2-core VM (session
22): T(1) of the same loop moves by tens of percent between sources and between passes minutes
apart, and with a near-free draft (unigram) the zero-cost-draft loop reads more per iteration than
the real loop with the draft in it. This is why the eval job prices its steps from its own calls
(`loops.run_costs`).

Writes command, commit, hardware, date and load with the table. `--pause_pid_file` SIGSTOPs a
background job (e.g. training) while timing.
"""

import argparse
import pathlib
import shlex
import sys

from specdec_t5x import gin_utils, provenance
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.timing import clock, loops

KEYS = ("target_step_ms", "verify_only_ms", "iteration_ms")


def measure(gin_file: str, gamma: int, temperature: float, sources: int, repeats: int, rounds: int):
    """[{'pass', 'sources', 'target_step_ms', 'verify_only_ms', 'iteration_ms', ...}]."""
    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK)"
    gin_utils.parse([gin_file], [what], finalize=False)
    spec_model, target_params, task = gin_utils.build()
    examples, _ = inputs_lib.load_examples(
        task, "test", sources, 64, 64, spec_model.output_vocabulary
    )
    encs = [b["encoder_input_tokens"] for _, b in inputs_lib.example_batches(examples, 1, 64, 64)]
    settings = {"temperature": temperature, "topk": 0, "topp": 0.0}
    rows = []
    for p in range(repeats):
        for name, chosen in [*((str(i), [e]) for i, e in enumerate(encs)), ("pooled", encs)]:
            costs = loops.loop_costs(
                spec_model,
                target_params,
                spec_model.draft.params,
                chosen,
                64,
                gamma,
                settings,
                repeats=rounds,
            )
            rows.append(
                {
                    "pass": p,
                    "sources": name,
                    **{k: costs[k] for k in KEYS},
                    "verify_cost_ratio": costs["verify_cost_ratio"],
                    "verify_capped": costs["verify_capped"],
                    "units": costs["units"],
                    "timing_eos_id": costs["timing_eos_id"],
                }
            )
            print(rows[-1], flush=True)
    return rows


def table(result: dict) -> str:
    lines = [
        "# The decode loops' step costs, source by source and pass by pass (`loops.loop_costs`)",
        "",
        "| pass | source | T(1) ms | verify call ms (zero-cost draft) | iteration ms (real draft) "
        "| verify / T(1) (capped) | verify > iteration | units (baseline, speculative, verify-only) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        units = ", ".join(f"{a}→{b}" for a, b in r["units"].values())
        lines.append(
            f"| {r['pass']} | {r['sources']} | {r['target_step_ms']:.3f} | "
            f"{r['verify_only_ms']:.3f} | {r['iteration_ms']:.3f} | "
            f"{r['verify_cost_ratio']:.2f} | {'yes' if r['verify_capped'] else 'no'} | {units} |"
        )
    lines += [
        "",
        f"- gin file `{result['gin_file']}`, γ = {result['gamma']}, T = {result['temperature']:g}, "
        f"batch 1, the test split's first {result['sources']} inputs, {result['rounds']} "
        "interleaved rounds per measurement; loops to the real EOS unless `timing_eos_id` is set "
        "in the JSON.",
        f"- conditions: {result['note']}",
    ]
    lines += [f"- {line}" for line in provenance.markdown_lines(result)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", default="gin/experiments/embedded_ende_unigram_t0.gin")
    parser.add_argument("--gamma", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pause_pid_file", default=None)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default="results/verify_cost")
    args = parser.parse_args(argv)
    if args.sources < 1 or args.repeats < 1 or args.rounds < 1:
        raise ValueError(
            f"need --sources, --repeats and --rounds >= 1; got {args.sources}, {args.repeats}, "
            f"{args.rounds}."
        )
    with clock.paused(args.pause_pid_file):
        rows = measure(
            args.gin_file, args.gamma, args.temperature, args.sources, args.repeats, args.rounds
        )
    keys = ("gin_file", "gamma", "temperature", "sources", "repeats", "rounds", "note")
    result = {"rows": rows, **{k: getattr(args, k) for k in keys}}
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "scripts/loop_costs_check.py", *argv])
    path = provenance.write_results(result, args.out, "loop_costs_check", command, table)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
