"""Run-to-run spread of eval runs of one setting: where "Predicted (measured verify)" parts from the
measured speed, run by run (`summary.run_to_run_table`; nothing is timed here).

  python scripts/run_to_run.py RESULTS_DIR [RESULTS_DIR ...] [--out table.md]

Each RESULTS_DIR is an eval output folder holding metrics.json (`python -m specdec_t5x.eval`).
"""

import argparse
import pathlib

from specdec_t5x.eval import summary, tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=pathlib.Path)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    missing = [str(d) for d in args.dirs if not (d / "metrics.json").is_file()]
    if missing:
        raise SystemExit(f"no metrics.json in {missing}")
    footer = tables.provenance_footer([d / "metrics.json" for d in args.dirs])
    text = summary.run_to_run_table(args.dirs) + "\n\n" + footer + "\n"
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
