"""Rewrites the measured tables in README.md and results/README.md from the committed metrics.json.

  python scripts/update_readme_tables.py

Replaces the text between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers; the tables come
from results/demo, results/table2 and results/table3 (run the scripts that make them first).
"""

import json
import pathlib

from specdec_t5x.eval import tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def _metrics(path: pathlib.Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


def _table(dirs) -> str:
    """The rows' table and their provenance: one line, or one per commit when the rows differ."""
    files = [d / "metrics.json" for d in dirs]
    return tables.results_table(files) + "\n\n" + tables.provenance_footer(files)


def _sweep(m: dict) -> str:
    rows = [
        "| γ | α | tokens/iter | measured | Thm 3.8 (c only) | Thm 3.8 + measured verify "
        "| + output lengths |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, v in m["gamma_sweep"].items():
        lengths = v.get("predicted_speedup_output_lengths")  # absent in older metrics
        lengths = "–" if lengths is None else f"{lengths:.2f}X"
        rows.append(
            f"| {g} | {v['alpha_beta']:.2f} | {v['tokens_per_iteration']:.2f} | {v['speedup']:.2f}X "
            f"| {v['predicted_speedup_thm38']:.2f}X | {v['predicted_speedup_measured_verify']:.2f}X "
            f"| {lengths} |"
        )
    return "\n".join(rows)


def _replace(path: pathlib.Path, name: str, body: str) -> None:
    text = path.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start)
    _, tail = rest.split(end)
    path.write_text(f"{head}{start}\n{body.strip()}\n{end}{tail}")


def _existing(dirs):
    """The row folders that have a metrics.json (the summarization rows need its models)."""
    return [d for d in dirs if (d / "metrics.json").is_file()]


def main() -> None:
    demo = [RESULTS / "demo" / f"embedded_ende_model_t{t}" for t in (0, 1)]
    _replace(ROOT / "README.md", "demo", _table(demo))
    t2 = _existing(
        [
            RESULTS / "table2" / f"embedded_{task}_model_t{t}"
            for task in ("ende", "sum")
            for t in (0, 1)
        ]
    )
    rows3 = _existing(
        [
            RESULTS / "table3" / f"embedded_{task}_{d}_t{t}"
            for task in ("ende", "sum")
            for d in ("unigram", "bigram", "model", "source_copy")
            for t in (0, 1)
        ]
    )
    sweeps = []
    for d in t2:
        m = _metrics(d)
        sweeps.append(
            f"γ sweep, {m['task']} at T = {m['temperature']:g} (same run; c = {m['c_measured']:.3f}, "
            f"verify/step = {m['verify_cost_ratio']:.2f} measured at the headline γ):\n\n{_sweep(m)}"
        )
    body = "\n\n".join([_table(t2), *sweeps])
    _replace(RESULTS / "README.md", "table2", body)
    _replace(RESULTS / "README.md", "table3", _table(rows3))


if __name__ == "__main__":
    main()
