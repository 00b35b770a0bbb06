"""Re-renders every committed table from the committed metrics.json files (`scripts/render_tables.py`).

`render_all()`: the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in README.md
(headline: medians of repeated runs) and results/README.md (table2, table3), and each
results/<table>/table.md, from the run folders under results/, and every folder of repeated runs
(`scripts/repeat_rows.py`: results/<name>/<row>/run<k>/metrics.json) as a medians table.
`table(files)`: one table of eval run folders; `repeated_table(root)`: one medians table.
"""

import pathlib

from benchmarks import repeat_rows
from specdec_t5x.eval import summary, tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
TABLES = {  # results/<name>/table.md and its marker in results/README.md: its row folders, in order
    "table2": [f"embedded_{task}_model_t{t}" for task in ("ende", "sum") for t in (0, 1)],
    "table3": [
        f"embedded_{task}_{draft}_t{t}"
        for task in ("ende", "sum")
        for draft in ("unigram", "bigram", "model", "source_copy")
        for t in (0, 1)
    ],
}
DEMO = [RESULTS / "demo" / f"embedded_ende_model_t{t}" for t in (0, 1)]
DEMO_NOTE = (  # results/demo/README.md says more
    "> Superseded: one run at `a771745-dirty`; † = T = 1 speed against T5X's Gumbel sampler alone,"
    " not\n> the fair baseline (this row's fair figure: 1.23X, `results/demo_repeated/`)."
    " See `README.md` here.\n\n"
)
HEADLINE = ("demo_repeated", "paper_regime", "correction")  # repeat_rows.py folders: the headline


def metrics_files(dirs) -> list[pathlib.Path]:
    """The metrics.json of each folder (or of its sub-folders), skipping folders without runs."""
    files = []
    for d in map(pathlib.Path, dirs):
        files += (
            [d / "metrics.json"]
            if (d / "metrics.json").exists()
            else sorted(d.glob("*/metrics.json"))
        )
    return files


def table(files, headline: bool = False) -> str:
    """The rows' table and where they came from (one line, or one per commit)."""
    if headline:
        rows = [r for f in files for r in tables.rows(_load(f), tables.headline_row)]
        body = "\n".join([tables.HEADLINE_HEADER, *rows])
    else:
        body = tables.results_table(files)
    return body + "\n\n" + tables.provenance_footer(files)


def _load(path: pathlib.Path) -> dict:
    import json

    return json.loads(path.read_text())


def replace(path: pathlib.Path, name: str, body: str) -> None:
    """Replaces the text between the `name` markers of `path` (ValueError if they are missing)."""
    text = path.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"{path} needs exactly one {start} and one {end}.")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    path.write_text(f"{head}{start}\n{body.strip()}\n{end}{tail}")


def repeated_table(*roots: pathlib.Path, headline: bool = False) -> str:
    """The medians table of `scripts/repeat_rows.py`'s folders (one row per <row>/ with runs)."""
    rows, sweeps, files = [], [], []
    for root in roots:
        for row in sorted(p for p in root.iterdir() if p.is_dir()):
            runs = sorted(row.glob("run*/metrics.json"))
            if runs:
                records = [_load(f) for f in runs]
                path = tables.kernel_path(summary.flat(records[0]))  # median_row checks all agree
                label = repeat_rows.target_label(row.name)
                if path != "unrecorded":  # runs before the path was recorded: no suffix
                    label += f"; {path} path"
                swept = row.name in repeat_rows.SWEPT_ROWS  # every chain of its runs a row
                if swept or any(summary.flat(m).get("tree_sweep") for m in records):
                    sweeps += tables.sweep_median_rows(records, label)
                else:
                    rows.append(tables.median_row(records, label, headline))
                files += runs
    if not files:
        raise SystemExit(f"no <row>/run<k>/metrics.json under {roots}")
    if sweeps and not headline:  # a folder of sweeps: every chain and tree of its runs
        body = "\n".join([tables.SWEEP_MEDIAN_HEADER, *sweeps])
        if rows:
            body += "\n\n" + "\n".join([tables.MEDIAN_HEADER, *rows])
        return body + "\n\n" + tables.provenance_footer(files)
    header = tables.MEDIAN_HEADLINE_HEADER if headline else tables.MEDIAN_HEADER
    return "\n".join([header, *rows]) + "\n\n" + tables.provenance_footer(files)


def render_all() -> None:
    """Every committed table, from what the runs recorded."""
    if metrics_files(DEMO):  # the committed demo run's own table, labelled where it stands
        (RESULTS / "demo" / "table.md").write_text(DEMO_NOTE + table(metrics_files(DEMO)) + "\n")
    headline = [RESULTS / name for name in HEADLINE if (RESULTS / name).is_dir()]
    if headline:  # medians of repeated runs: the README's headline
        replace(ROOT / "README.md", "headline", repeated_table(*headline, headline=True))
    for name, folders in TABLES.items():
        files = metrics_files(
            [RESULTS / name / f for f in folders if (RESULTS / name / f).is_dir()]
        )
        if files:
            text = table(files)
            (RESULTS / name / "table.md").write_text(text + "\n")
            replace(RESULTS / "README.md", name, text)
    for root in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        if any(root.glob("*/run*/metrics.json")):
            (root / "table.md").write_text(repeated_table(root) + "\n")
