"""Theorem 3.8's prediction one way for every row: fixed and auto rows from one function with the
α, c and verify/step the table shows, named in the legend; the plot draws every row."""

import json

import pytest
from test_eval import _cells

from specdec_t5x import theory
from specdec_t5x.eval import summary, tables

ALPHA, C, VERIFY = 0.62, 0.41, 1.3


def _record(**changes):
    """A flat fixed-γ record with an auto row and a tree row beside the chain (γ = 3)."""
    step_costs = {"c": C, "verify_cost_ratio": VERIFY, "target_step_ms": 1.0}
    sweep = {
        "1": {"speedup": 1.05, "alpha_beta": ALPHA, "accept_histogram": [3, 4]},
        "3": {"speedup": 0.7, "alpha_beta": ALPHA, "accept_histogram": [3, 2, 1, 1]},
    }
    auto = {
        "gamma": "auto",
        "gamma_chosen": {"0": 2, "1": 1, "3": 7, "tree(2,1)": 1},
        "baseline_timing_examples": 1,
        "speedup": 0.9,
        "alpha_beta": ALPHA,
        "alpha_display": f"{ALPHA:.2f}",
        "tokens_per_iteration": 1.8,
        "predicted_speedup": 1.26,  # the controller's own cost curve: not the table's
        "identical_fraction": 1.0,
    }
    m = {
        "task": "ddtp_ende",
        "draft": "model",
        "temperature": 0.0,
        "gamma": 3,
        "alpha_beta": ALPHA,
        "c_measured": C,
        "c_alone": 0.3,
        "verify_cost_ratio": VERIFY,
        "step_costs": step_costs,
        "tokens_per_iteration": 2.0,
        "speedup": 0.7,
        "identical_fraction": 1.0,
        "accept_histogram": [3, 2, 1, 1],
        "predicted_speedup_measured_verify": float(
            theory.measured_walltime_improvement(ALPHA, 3, C, VERIFY)
        ),
        "gamma_sweep": sweep,
        "auto": auto,
        "tree_sweep": {
            "tree(2,1)": {
                "speedup": 0.8,
                "tokens_per_iteration": 1.9,
                "alpha_beta": ALPHA,
                "depth_acceptance": [0.6, 0.5],
                "identical_fraction": 1.0,
            }
        },
    }
    return {**m, **changes}


def test_one_function_prices_a_fixed_and_an_auto_row():
    one = summary.thm38_prediction(ALPHA, {3: 1}, C, VERIFY)
    assert one == pytest.approx(float(theory.measured_walltime_improvement(ALPHA, 3, C, VERIFY)))
    # An auto row all at γ = 3 is the fixed row; γ = 0 is the baseline (1X).
    assert summary.thm38_prediction(ALPHA, {3: 9}, C, VERIFY) == pytest.approx(one)
    assert summary.thm38_prediction(None, {0: 4}, C, VERIFY) == 1.0
    assert summary.thm38_prediction(None, {0: 1, 2: 1}, C, VERIFY) is None
    assert summary.thm38_prediction(ALPHA, {}, C, VERIFY) is None
    # Combined as the speed-up is: total time, each example's baseline time alike.
    mix = summary.thm38_prediction(ALPHA, {0: 1, 3: 1}, C, VERIFY)
    assert mix == pytest.approx(2 / (1 + 1 / one))


def test_fixed_and_auto_rows_show_the_same_functions_value_for_the_same_inputs():
    m = _record()
    header = tables.TABLE_HEADER.splitlines()[0]
    fixed, tree, auto = tables.rows(m)
    cells = {
        name: dict(zip(_cells(header), _cells(row), strict=True))
        for name, row in (("fixed", fixed), ("tree", tree), ("auto", auto))
    }
    expected_fixed = summary.thm38_prediction(ALPHA, {3: 1}, C, VERIFY)
    assert cells["fixed"]["Predicted (Thm 3.8)"] == f"{expected_fixed:.2f}X"
    assert expected_fixed == pytest.approx(m["predicted_speedup_measured_verify"])
    expected_auto = summary.thm38_prediction(ALPHA, {0: 2, 1: 1, 3: 7}, C, VERIFY)
    assert cells["auto"]["Predicted (Thm 3.8)"] == f"{expected_auto:.2f}X"
    assert cells["auto"]["Predicted (Thm 3.8)"] != "1.26X"  # not the controller's cost curve
    # The same α, c and verify/step on both rows as the table shows them.
    for row in ("fixed", "auto"):
        assert cells[row]["α"] == f"{ALPHA:.2f}"
        assert cells[row]["c"].startswith(f"{C:.3f}")
        assert cells[row]["verify/step"] == f"{VERIFY:.2f}"
    assert cells["tree"]["Predicted (Thm 3.8)"] == "–"
    # An auto row that is all γ = 3 predicts exactly what the fixed γ = 3 row does.
    same = {**m, "auto": {**m["auto"], "gamma_chosen": {"3": 5}}}
    assert tables.predicted_thm38(tables.auto_row_record(same)) == pytest.approx(expected_fixed)


def test_the_legend_names_the_costs_the_column_uses(tmp_path):
    for word in ("Thm 3.8", "α", "c", "verify/step", "auto", "γ = 0"):
        assert word in tables.THM38_LEGEND
    f = tmp_path / "run" / "metrics.json"
    f.parent.mkdir()
    f.write_text(json.dumps(summary.group(_record())))
    table = tables.results_table([f])
    assert table.splitlines()[0] == tables.TABLE_HEADER.splitlines()[0]
    assert table.endswith("\n\n" + tables.THM38_LEGEND)


def test_the_plot_draws_every_row_with_the_tables_own_costs(tmp_path):
    m = _record()
    series = tables.plot_series(m, [1, 3])
    assert set(series) == {"Thm 3.8", "measured", "auto (measured)", "auto (Thm 3.8)", "tree(2,1)"}
    grid, curve = series["Thm 3.8"]
    assert grid[:3] == [1, 2, 3] and len(grid) == 10
    for g, y in zip(grid, curve, strict=True):  # the table's c at every γ, not another c
        assert y == pytest.approx(summary.thm38_prediction(ALPHA, {g: 1}, C, VERIFY))
    assert curve[2] == pytest.approx(m["predicted_speedup_measured_verify"])
    assert series["measured"] == ([1, 3], [1.05, 0.7])
    (x,), (y,) = series["auto (Thm 3.8)"]
    assert x == pytest.approx((1 + 3 * 7) / 10)
    assert y == pytest.approx(tables.predicted_thm38(tables.auto_row_record(m)))
    assert series["auto (measured)"][1] == [0.9]
    assert series["tree(2,1)"] == ([2], [0.8])
    tables.speedup_plot(tmp_path / "speedup.png", m, [1, 3])
    assert (tmp_path / "speedup.png").stat().st_size > 1000


def test_an_auto_headline_is_plotted_too(tmp_path):
    m = _record()
    auto = m.pop("auto")
    for key in ("accept_histogram", "predicted_speedup_measured_verify", "alpha_beta"):
        m.pop(key)
    headline = {**m, **auto, "auto": auto}
    series = tables.plot_series(headline, [1, 3])
    assert {"Thm 3.8", "measured", "auto (measured)", "auto (Thm 3.8)"} <= set(series)
    tables.speedup_plot(tmp_path / "speedup.png", headline, [1, 3])
    assert (tmp_path / "speedup.png").exists()
