"""Re-renders every committed table from the committed metrics.json files; re-runs nothing.

  python scripts/render_tables.py                    # README.md, results/README.md, table.md files
  python scripts/render_tables.py DIR [DIR ...] [--out table.md]   # one table of eval run folders
  python scripts/render_tables.py --repeated DIR    # DIR/<row>/run<k>/: medians table, DIR/table.md

Without arguments: every committed table (`benchmarks/render_tables.py` says which). With
folders: one table of those runs (each DIR holds metrics.json, or is a parent of several).
"""

import argparse
import pathlib
import sys

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import render_tables


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("dirs", nargs="*", help="eval run folders (default: every committed table)")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument(
        "--repeated", default=None, help="a folder of repeated runs (repeat_rows.py)"
    )
    args = parser.parse_args()
    if args.repeated:
        text = render_tables.repeated_table(pathlib.Path(args.repeated))
        (pathlib.Path(args.repeated) / "table.md").write_text(text + "\n")
        print(text)
        return
    if not args.dirs:
        render_tables.render_all()
        return
    files = render_tables.metrics_files(args.dirs)
    if not files:
        raise SystemExit(f"no metrics.json under {args.dirs}")
    text = render_tables.table(files)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
