"""Tables render from what the runs recorded: medians of repeated runs, and the committed tables."""

import json
import pathlib
import subprocess
import sys

import pytest
from test_eval_outputs import _record

from specdec_t5x.eval import summary, tables

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(speedup, **kw):
    return summary.group({**_record(), "speedup": speedup, **kw})


def test_median_row_is_the_median_with_the_range_over_runs():
    row = tables.median_row([_run(1.5), _run(1.2), _run(1.9)], "T5 1.1 base shape")
    assert (
        "| 1.50X (1.20–1.90) |" in row and "| T5 1.1 base shape |" in row and row.endswith("| 3 |")
    )
    t1 = [_run(s, temperature=1.0, speedup_vs_t5x_sampler=s + 0.2) for s in (1.1, 1.3, 1.2)]
    assert "1.20X (1.10–1.30); vs T5X sampler 1.40X" in tables.median_row(t1)
    with pytest.raises(ValueError, match="different configurations"):
        tables.median_row([_run(1.0), _run(1.0, gamma=3)])


def test_median_row_of_auto_runs_that_never_speculated():
    """An auto run whose gate kept the baseline records no tokens per call: the cell reads '–'."""
    runs = [_run(s, gamma="auto", tokens_per_iteration=None) for s in (0.97, 1.0, 0.99)]
    row = tables.median_row(runs)
    assert "| 0.99X (0.97–1.00) |" in row and row.split(" | ")[8] == "–", row
    mixed = tables.median_row([*runs[:2], _run(1.1, gamma="auto", tokens_per_iteration=1.8)])
    assert mixed.split(" | ")[8] == "1.80", mixed  # the median of the runs that recorded it


def test_busy_loops_stop_by_themselves():
    from benchmarks import repeat_rows

    spinners = repeat_rows.busy_loops(2, 0.5)
    assert all(p.wait(timeout=30) == 0 for p in spinners)


def _sweep_run(chain_speeds, tree_speed, tree_tokens):
    sweep = {str(g): {"speedup": s, "tokens_per_iteration": 1.5 + 0.2 * g, "alpha_beta": 0.57,
                      "identical_fraction": 1.0} for g, s in chain_speeds.items()}  # fmt: skip
    trees = {"tree(2,1)": {"speedup": tree_speed, "tokens_per_iteration": tree_tokens,
                           "alpha_beta": 0.57, "identical_fraction": 1.0}}  # fmt: skip
    return summary.group({**_record(), "gamma_sweep": sweep, "tree_sweep": trees})


def test_tree_rows_of_any_tree_name_leave_the_chains_verify_cost_out():
    run = _sweep_run({1: 1.2}, 1.3, 2.0)
    run["tree_sweep"]["tree[0,1,00]"] = run["tree_sweep"]["tree(2,1)"]
    rows = tables.rows(summary.group({**summary.flat(run), "verify_cost_ratio": 1.44}))
    trees = [r for r in rows if "| tree" in r]
    assert len(trees) == 2 and all(r.split(" | ")[6] == "–" for r in trees), trees
    assert "| 1.44 |" in rows[0]  # the chain's own row keeps it
    median = {r.split(" | ")[4]: r for r in tables.sweep_median_rows([run])}
    assert "| 4 |" in median["tree[0,1,00]"]  # rows verified: read back from the name


def test_sweep_median_rows_compare_each_run_with_its_own_fastest_chain():
    runs = [
        _sweep_run({1: 1.2, 2: 1.5}, 1.65, 2.3),  # fastest chain γ = 2 (tokens 1.9): tree 1.10×
        _sweep_run({1: 1.6, 2: 1.4}, 1.60, 2.3),  # fastest chain γ = 1 (tokens 1.7): tree 1.00×
        _sweep_run({1: 1.0, 2: 1.2}, 1.44, 2.3),  # fastest chain γ = 2: tree 1.20×
    ]
    rows = {r.split(" | ")[4]: r for r in tables.sweep_median_rows(runs, "T5 1.1 base shape")}
    assert set(rows) == {"γ = 1", "γ = 2", "tree(2,1)"}
    tree = rows["tree(2,1)"]
    assert "| 5 |" in tree  # rows verified: root + 2 + 2
    assert "| 1.60X (1.44–1.65) | 1.10 (1.00–1.20) |" in tree
    assert "| 2.30 | 1.21 |" in tree  # tokens per call, over the fastest chain's (median of 3)
    with pytest.raises(ValueError, match="different configurations"):
        tables.sweep_median_rows(
            [runs[0], summary.group({**summary.flat(runs[1]), "temperature": 1.0})]
        )


def test_a_recorded_auto_over_trees_row_still_renders():
    """Runs recorded with the removed `AUTO_TREES` option (results/trees): their auto row names the
    trees it chose and is labelled apart from a chains-only auto row."""
    auto = {
        "gamma": "auto",
        "gamma_chosen": {"0": 2, "2": 1, "tree(3,2,1)": 1},
        "baseline_timing_examples": 1,
        "speedup": 1.4,
        "tokens_per_iteration": 2.0,
        "alpha_beta": 0.5,
        "identical_fraction": 1.0,
        "tree_measured_speedup": {"tree(3,2,1)": 1.3},
    }
    assert tables.auto_choices(auto) == "off×1, baseline timing×1, 2×1, tree(3,2,1)×1"
    run = summary.flat(_sweep_run({1: 1.2, 2: 1.5}, 1.65, 2.3))
    rows = {r.split(" | ")[4]: r for r in tables.sweep_median_rows([{**run, "auto": auto}])}
    assert set(rows) == {"γ = 1", "γ = 2", "tree(2,1)", "auto (chains, trees, off)"}


def test_repeated_runs_render_from_their_records(tmp_path):
    for row, speeds in (("ende_base_t0", (1.7, 1.8, 1.6)), ("ende_large_t0", (1.9, 2.0, 1.8))):
        for r, s in enumerate(speeds):
            run = tmp_path / row / f"run{r}"
            run.mkdir(parents=True)
            record = {**_run(s), "provenance": {"commit": "abc", "date": f"d{r}", "hardware": "hw"}}
            (run / "metrics.json").write_text(json.dumps(record))
    out = subprocess.run(
        [sys.executable, "scripts/render_tables.py", "--repeated", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "| T5 1.1 base shape |" in table and "| 1.70X (1.60–1.80) |" in table
    assert "| T5 1.1 large shape |" in table and "| 1.90X (1.80–2.00) |" in table


def test_every_committed_table_regenerates_from_committed_records(tmp_path):
    """`render_tables.py` re-renders README and results tables without re-running anything."""
    from benchmarks import render_tables

    files = render_tables.metrics_files(render_tables.DEMO)
    assert files and "| ddtp_ende |" in render_tables.table(files, headline=True)
    for name, folders in render_tables.TABLES.items():
        committed = [ROOT / "results" / name / f for f in folders]
        rendered = render_tables.table(render_tables.metrics_files(committed))
        assert rendered.strip() in (ROOT / "results" / name / "table.md").read_text(), name
