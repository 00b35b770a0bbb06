"""Step-cost benchmark: scripts/measure_c.py end to end on CPU (tiny vs tiny) and its validation."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest
from conftest import init_params, tiny_config

from benchmarks import random_pair
from specdec_t5x import models, network
from specdec_t5x.timing import clock, step_timer

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "measure_c.py"


def load_script():
    spec = importlib.util.spec_from_file_location("measure_c", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_c_script_tiny_vs_tiny(tmp_path):
    args = ["--target", "tiny", "--draft", "tiny", "--repeats", "3", "--enc_len", "4"]
    args += ["--max_len", "8", "--gamma", "2", "--out_dir", str(tmp_path)]
    path = load_script().main(args)
    assert path == tmp_path / "tiny_vs_tiny_float32_b1.json"
    result = json.loads(path.read_text())
    for key in ("target_step_ms", "draft_step_ms", "verify_step_ms"):
        assert result[key] > 0 and len(result[f"{key}_iqr"]) == 2
    assert result["c"] >= 0 and result["c_alone"] > 0 and result["verify_cost_ratio"] > 0
    assert result["target_params"] == result["draft_params"]
    assert result["target_config"]["dtype"] == "float32" and result["target_config"]["emb_dim"] == 8
    assert result["command"].startswith("python scripts/measure_c.py --target tiny")
    assert result["hardware"]["nproc"] >= 1 and result["hardware"]["jax_devices"]
    assert result["commit"] and result["date"]
    table = (tmp_path / "tiny_vs_tiny_float32_b1.md").read_text()
    assert "| c | verify_cost_ratio |" in table and "| tiny (" in table
    assert "network.T5Config" in path.with_suffix(".target.gin").read_text()


def test_paired_ratio_is_the_median_of_per_round_ratios():
    # Round 2 is slow for both calls: the ratio within each round is 2, 2, 2, 4, 2.
    numerator = [2.0, 4.0, 20.0, 8.0, 2.0]
    denominator = [1.0, 2.0, 10.0, 2.0, 1.0]
    assert clock.paired_ratio(numerator, denominator) == 2.0
    # Per-round ratios 3, 1, 2 -> 2, where the ratio of the separate medians is 3 / 1.
    assert clock.paired_ratio([3.0, 1.0, 10.0], [1.0, 1.0, 5.0]) == 2.0
    with pytest.raises(ValueError, match="equally long"):
        clock.paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="equally long"):
        clock.paired_ratio([], [])
    with pytest.raises(ValueError, match="positive denominators"):
        clock.paired_ratio([1.0, 1.0], [1.0, 0.0])


def test_time_decoder_steps_slopes_paired_by_round(monkeypatch):
    # Per-step times where the medians' ratio (1.5 / 1.0) differs from every round's own ratio
    # (2.0 / 1.1), and a fixed cost per call that the slope must remove.
    per_step = {
        "target": [1.0, 3.0, 0.5, 1.0, 2.0],
        "draft": [0.2, 0.6, 0.1, 0.2, 0.4],
        "verify": [2.0, 6.0, 1.0, 2.2, 4.0],
        # 2 draft steps + verify, plus 0.5 target steps of interference per iteration.
        "iteration": [2.9, 8.7, 1.45, 3.1, 5.8],
    }
    fixed = {"target": 0.7, "draft": 0.5, "verify": 0.9, "iteration": 1.3}
    steps = {"short": 8, "long": 8 * clock.LONG_LOOP}

    def fake_interleaved(calls, repeats, warmup=3, shuffle=False, budget_s=None):
        assert set(calls) == {(k, n) for k in per_step for n in steps} and shuffle
        return {(k, n): [fixed[k] + steps[n] * v for v in per_step[k]] for k, n in calls}

    monkeypatch.setattr(clock, "time_interleaved", fake_interleaved)
    module = network.Transformer(tiny_config())
    params = init_params(module, 0)
    state = models.EncoderDecoderModel(module).decoder_state(params, np.ones((1, 4), np.int32), 8)
    step = lambda args, tokens, positions, cache: state[1](tokens, positions, cache)  # noqa: E731
    result = step_timer.time_decoder_steps(
        step, (), state[0], step, (), state[0], batch=1, position=0, gamma=2, repeats=5
    )
    assert result["c_alone"] == pytest.approx(0.2)
    assert result["c"] == pytest.approx(0.45)  # (iteration - verify) / (γ target): 0.9 / 2
    assert result["interference_ms"] == pytest.approx(0.5)  # rounds: 0.5, 1.5, 0.25, 0.5, 1.0
    assert result["verify_cost_ratio"] == pytest.approx(2.0)  # medians: 2.2 / 1.0
    assert result["verify_step_ms"] == pytest.approx(2.2)
    assert result["target_step_ms"] == pytest.approx(1.0)
    assert result["fixed_call_ms"] == pytest.approx(fixed)
    with pytest.raises(ValueError, match="gamma >= 1"):
        step_timer.time_decoder_steps(
            step, (), state[0], step, (), state[0], batch=1, position=0, gamma=0
        )


def test_measure_step_costs_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_len >= gamma"):
        random_pair.measure_step_costs(tiny_config(), tiny_config(), max_len=4, gamma=3)


def test_call_order_is_a_seeded_permutation_independent_of_example_parity():
    names = ["baseline", 1, 2, 3, "auto"]
    orders = [clock.call_order(names, i, seed=0) for i in range(2000)]
    assert all(sorted(map(str, o)) == sorted(map(str, names)) for o in orders)
    assert clock.call_order(names, 7, seed=0) == orders[7]  # same on every process / rerun
    assert clock.call_order(names, 7, seed=1) != orders[7] or orders[7] != orders[8]
    # Who goes first must not follow the examples' parity (DDTP alternates short and long rows):
    # each name leads ~1/5 of the even examples and ~1/5 of the odd ones.
    for name in names:
        even = np.mean([o[0] == name for o in orders[0::2]])
        odd = np.mean([o[0] == name for o in orders[1::2]])
        assert abs(even - 0.2) < 0.05 and abs(odd - 0.2) < 0.05, (name, even, odd)
