"""Speculative loop work per iteration, old code path vs current, timed interleaved in one process.

The old `speculative_sample` (with its `sampling` and `verification`) is loaded from `--old`
(`git show`, `loop_work.sampler_at_commit`); the current one is the working tree's. Zero-cost
constant-logits models (`time_budget._constant_step`), every draft accepted. Writes
`<out_dir>/loop_ms.json` and `loop_ms.md` (table, command, commit, date, hardware).

  python scripts/loop_work.py --old main --repeats 20
"""

import argparse
import shlex
import sys

from specdec_t5x import loop_work, provenance, speculative

CONFIGS = [  # (temperature, γ); each at every --batch
    (0.0, 1),
    (0.0, 3),
    (0.0, 5),
    (1.0, 1),
    (1.0, 3),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="main", help="git revision of the old code path")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1, 10)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--max_len", type=int, default=64, help="max_decode_len")
    parser.add_argument("--eos_id", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out_dir", default="results/loop_work")
    args = parser.parse_args(argv)

    samplers = {
        f"old ({args.old})": loop_work.sampler_at_commit(args.old, provenance.REPO),
        "new": speculative.speculative_sample,
    }
    configs = [
        {"temperature": t, "gamma": g, "batch": b}
        for b in args.batch or [1, 10]
        for t, g in CONFIGS
    ]
    records = loop_work.compare(
        samplers,
        configs,
        vocab=args.vocab,
        max_decode_len=args.max_len,
        eos_id=args.eos_id,
        repeats=args.repeats,
    )
    names = list(samplers)
    command = shlex.join(
        ["python", "scripts/loop_work.py", *(sys.argv[1:] if argv is None else argv)]
    )
    result = {"records": records, "samplers": names, "vocab": args.vocab, "max_len": args.max_len}

    def table(res):
        notes = "\n".join(f"- {line}" for line in provenance.markdown_lines(res))
        return loop_work.markdown_table(res["records"], res["samplers"]) + "\n" + notes + "\n"

    path = provenance.write_results(result, args.out_dir, "loop_ms", command, table)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
