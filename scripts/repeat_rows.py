"""Headline rows as medians of repeated runs: each row run REPEATS times as separate processes.

  python scripts/repeat_rows.py demo --out results/demo_repeated              # the demo's rows
  python scripts/repeat_rows.py paper_regime --out results/paper_regime       # widened targets
  python scripts/repeat_rows.py paper_regime --rows ende_base_t0 --repeats 3 --gin.NUM_EXAMPLES=20
  python scripts/repeat_rows.py correction --out results/correction                # copy drafts
  python scripts/repeat_rows.py optimal_trees --out results/trees/optimal     # measured trees
  python scripts/repeat_rows.py auto_check --out results/auto_check/loaded --busy 2  # auto γ, loaded

Round r runs every row once, in an order shuffled with seed r; each run is `python -m
specdec_t5x.eval` into OUT/<row>/run<r>/, then OUT/table.md holds the medians. The row sets and the
runner: `benchmarks/repeat_rows.py`.
"""

import argparse
import pathlib
import sys

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import repeat_rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("row_set", choices=sorted(repeat_rows.ROW_SETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default=None, help="comma-separated row names (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--busy", type=int, default=0, help="spin this many processes during every run (load)"
    )
    args, gin_flags = parser.parse_known_args()
    repeat_rows.run(args.row_set, args.out, args.rows, args.repeats, gin_flags, busy=args.busy)


if __name__ == "__main__":
    main()
