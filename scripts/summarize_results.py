"""Prints (and optionally writes) one Table-2-shaped markdown table of eval runs.

  python scripts/summarize_results.py RESULTS_DIR [RESULTS_DIR ...] [--out table.md]

Each RESULTS_DIR is an eval output folder holding metrics.json (or a parent of several).
"""

import argparse
import pathlib

from specdec_t5x.eval import tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    files = []
    for d in map(pathlib.Path, args.dirs):
        files += (
            [d / "metrics.json"]
            if (d / "metrics.json").exists()
            else sorted(d.glob("*/metrics.json"))
        )
    if not files:
        raise SystemExit(f"no metrics.json under {args.dirs}")
    table = tables.results_table(files)
    footer = "\n" + tables.provenance_footer(files)
    print(table + footer)
    if args.out:
        pathlib.Path(args.out).write_text(table + "\n" + footer + "\n")


if __name__ == "__main__":
    main()
