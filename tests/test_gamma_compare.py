"""`benchmarks.gamma_compare`: the auto-γ comparison on the tiny random pair (row contents, not timings)."""

import json

import numpy as np
import pytest
from conftest import tiny_spec_pair

from benchmarks import gamma_compare


@pytest.fixture(scope="module")
def compared():
    spec_model, params = tiny_spec_pair()
    rng = np.random.RandomState(0)
    inputs = [rng.randint(3, 30, n).astype(np.int32) for n in (5, 9, 7)]
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    result = gamma_compare.compare(
        spec_model,
        params,
        inputs,
        settings=settings,
        gammas=(2,),
        gamma_max=1,
        max_decode_len=10,
        input_len=12,
        cost_repeats=2,
    )
    return result


def test_compare_reports_every_variant_with_its_counts(compared):
    rows = compared["rows"]
    assert list(rows) == ["γ=2", "block γ=2", "auto", "auto+exit", "auto+block"]
    assert compared["num_examples"] == 3
    for name in ("γ=2", "block γ=2"):
        row = rows[name]
        assert row["gamma"] == 2 and row["speedup"] > 0 and row["seconds"] > 0
        assert 1.0 <= row["tokens_per_iteration"] <= 3.0  # at most γ + 1 per iteration
        assert row["drafts_per_iteration"] == pytest.approx(2.0)  # no early exit
        assert 0.0 <= row["alpha"] <= 1.0 and row["predicted_speedup"] > 0
        q = row["example_speedup_quartiles"]
        assert q[0] <= q[1] <= q[2]
    for name in ("auto", "auto+exit", "auto+block"):
        chosen = rows[name]["gamma_chosen"]
        assert sum(chosen.values()) == 3 and set(chosen) <= {"0", "1"}
        assert 0 <= rows[name]["gamma_final"] <= 1
    assert set(compared["cost_curve"]["block_step_ms"]) == {"1", "2", "3"}


def test_block_verification_equals_token_verification_at_temperature_zero(compared):
    """Argmax mode: block and token verification are the same rule, so the same counts."""
    token, block = compared["rows"]["γ=2"], compared["rows"]["block γ=2"]
    assert block["tokens_per_iteration"] == token["tokens_per_iteration"]
    assert block["alpha"] == token["alpha"]


def test_markdown_and_write_give_one_line_per_variant(compared, tmp_path):
    text = gamma_compare.write(tmp_path, {"tiny T=0": compared}, "pytest")
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 5  # header + one row per variant
    assert any(line.startswith("| auto+exit | ") for line in lines)
    assert (tmp_path / "table.md").read_text() == text
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert set(record["results"]["tiny T=0"]["rows"]) == set(compared["rows"])
    assert record["provenance"]["command"] == "pytest"
