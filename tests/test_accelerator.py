"""benchmarks.accelerator: the --smoke run (without gin/seqio/TF importable), its cost model, configs."""

import json
import os
import pathlib
import subprocess
import sys

import gin
import numpy as np
import pytest

from benchmarks import accelerator
from specdec_t5x import gin_utils
from specdec_t5x.data import export_tokens

REPO = pathlib.Path(__file__).resolve().parents[1]
BLOCKED = ("gin", "seqio", "tensorflow", "tensorflow_datasets", "t5", "tqdm", "matplotlib")


def test_smoke_runs_without_gin_seqio_tf_and_writes_results(tmp_path):
    """The device machine has no gin/seqio/TF: the whole --smoke run must work with them blocked."""
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # any import of it raises ImportError\n"
        "from benchmarks import accelerator\n"
        f"accelerator.main(['--out_dir', {str(tmp_path)!r}, '--smoke'])\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {BLOCKED!r} and sys.modules[m]]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[budget]" in run.stdout
    result = json.loads((tmp_path / "cpu.json").read_text())
    assert result["smoke"] and result["jax_version"] and result["commit"]
    assert result["target"]["config"]["dtype"] == "bfloat16"
    assert result["target"]["config"]["scan_layers"] is True
    costs = result["step_costs"]["1"]
    assert set(costs["target_step_ms"]) == {"1", "2"} and costs["verify_cost_ratio"]["1"] == 1.0
    assert all(c > 0 for c in costs["c"].values())
    floor = result["floor"]
    assert floor["copy_bandwidth_gb_s"] > 0 and floor["decoder_step_bytes"] > 0
    assert floor["logits_32128_ms"] > 0 and floor["logits_8192_ms"] > 0
    rows = result["end_to_end"]["rows"]
    assert {(r["temperature"], r["gamma"]) for r in rows} == {(0.0, 2), (1.0, 2)}
    greedy = next(r for r in rows if r["temperature"] == 0.0)
    # bfloat16 end to end, widened models: greedy speculative output == greedy baseline output.
    assert greedy["identical_fraction"] == 1.0
    for row in rows:
        assert 0.0 <= row["alpha"] <= 1.0 and row["tokens_per_iteration"] >= 1.0
        assert row["speculative_s"] > 0 and row["baseline_s"] > 0
    # Token trees beside the chains: one tree row per temperature, timed in the same run.
    trees = result["end_to_end"]["tree_rows"]
    assert {(r["temperature"], r["name"]) for r in trees} == {
        (0.0, "tree(2,1)"),
        (1.0, "tree(2,1)"),
    }
    assert not result["end_to_end"]["cost_model"].get("skipped_for_budget")
    for row in trees:
        assert row["nodes"] == 5 and row["tree"] == [2, 1] and row["tokens_per_iteration"] >= 1.0
        assert row["speculative_s"] > 0 and row["baseline_s"] > 0
        assert len(row["depth_acceptance"]) == 2 and len(row["rank_acceptance"]) == 2
        assert all(0.0 <= a <= 1.0 for a in row["depth_acceptance"] + row["rank_acceptance"])
        assert 0 < row["depth_tested"][0] <= row["target_calls"]  # depth 1: at most once a call
    # Greedy tree decoding is greedy decoding: every example identical to the baseline.
    assert next(r for r in trees if r["temperature"] == 0.0)["identical_fraction"] == 1.0
    table = (tmp_path / "cpu.md").read_text()
    assert "| Task | M_q | Temp | γ | nodes | α |" in table and "command:" in table
    for temperature in (0, 1):
        assert f"| small_smoke | {temperature} | tree(2,1) | 5 |" in table  # the Table 2 rows
        assert f"| {temperature} | tree(2,1) | 5 |" in table  # acceptance per depth and rank
    assert "T(2)" in table and "per depth | per rank |" in table
    # (d) the batch sweep: batches 1 and 2 on the same 3 examples (a ragged last call at 2).
    sweep = result["batch_sweep"]
    assert [r["batch"] for r in sweep["rows"]] == [1, 2] and not sweep["skipped_for_budget"]
    for row in sweep["rows"]:
        assert row["identical_fraction"] == 1.0 and row["num_examples"] == 3
        assert row["loop_iterations"] >= row["row_iterations"] >= 1.0
        assert row["speedup"] > 0 and row["predicted_speedup"] > 0
        assert row["T_ms"]["1"] > 0 and row["baseline_tokens_per_s"] > 0
    assert "## (d) Batches (T = 0, γ = " in table and "| 2 | 3 |" in table


def test_cost_model_gamma_uses_measured_verify_cost():
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
    # Flat verify cost: Thm 3.8 exactly (theory.optimal_gamma agrees).
    from specdec_t5x import theory

    assert accelerator.cost_model_gamma(0.8, 0.05, flat) == theory.optimal_gamma(
        0.8, 0.05, max_gamma=15
    )
    # A verify cost growing with k pushes γ down.
    steep = {1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5, 16: 8.5}
    assert accelerator.cost_model_gamma(0.8, 0.05, steep) < (
        accelerator.cost_model_gamma(0.8, 0.05, flat)
    )
    assert accelerator.verify_ratio(steep, 2) == pytest.approx(2.0)  # k = 3
    assert accelerator.verify_ratio(steep, 20) == pytest.approx(8.5 + 0.5 * 5)
    noisy = {1: 1.0, 2: 0.8}  # CPU noise: never extrapolate below the last point
    assert accelerator.verify_ratio(noisy, 5) == pytest.approx(0.8)


@pytest.mark.parametrize("name", sorted(accelerator.EMBEDDED))
def test_embedded_configs_match_gin(name):
    gin.clear_config(clear_constants=True)
    try:
        gin_utils.parse(
            [f"gin/models/{name}.gin"],
            [f"gin_utils.build.obj = @{name.split('_')[-1]}/network.T5Config()"],
            finalize=False,
        )
        want = gin_utils.build()
    finally:
        gin.clear_config(clear_constants=True)
    got = accelerator.EMBEDDED[name]
    for field in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim"):
        assert getattr(got, field) == getattr(want, field), field
    assert got.num_encoder_layers == want.num_encoder_layers
    assert got.num_decoder_layers == want.num_decoder_layers
    assert tuple(got.mlp_activations) == tuple(want.mlp_activations)


def test_token_file_round_trip_and_errors(tmp_path):
    path = export_tokens.write_tokens(
        tmp_path / "t.npz", [np.array([5, 6, 1])], [np.array([7, 1])], 4, 3, {"task": "x"}
    )
    data = export_tokens.read_tokens(path)
    np.testing.assert_array_equal(data["inputs"], [[5, 6, 1, 0]])
    np.testing.assert_array_equal(data["targets"], [[7, 1, 0]])
    assert data["meta"]["task"] == "x" and data["meta"]["input_len"] == 4
    with pytest.raises(ValueError, match="inputs\\[0\\] has 3 tokens > inputs_len=2"):
        export_tokens.write_tokens(tmp_path / "u.npz", [np.array([5, 6, 1])], [[1]], 2, 3, {})
    with pytest.raises(FileNotFoundError, match="export_tokens"):
        export_tokens.read_tokens(tmp_path / "missing.npz")


def test_shipped_token_file_is_readable():
    data = export_tokens.read_tokens(accelerator.TOKENS_FILE)
    assert data["inputs"].shape[0] >= 32 and data["meta"]["task"] == "ddtp_ende"
    assert data["inputs"].dtype == np.int32 and np.all(data["inputs"][:, 0] > 0)


def test_step_costs_handle_k_beyond_max_decode_len():
    """The paper setting times T(64) with max_decode_len 64: the cache grows as a 64-node tree's."""
    shape = accelerator.SETTINGS["smoke"]["drafts"]["small_smoke"]
    model = accelerator.widened_params("embedded_ende_draft", shape)
    s = {"max_decode_len": 6, "ks": (1, 8), "batches": (1,), "steps_per_call": 1, "repeats": 1}
    enc = export_tokens.read_tokens(accelerator.TOKENS_FILE)["inputs"][:1, :16]
    costs = accelerator.measure.step_costs(
        {"target": model, "d": model}, enc, s, accelerator.Budget(60)
    )["1"]
    assert set(costs["target_step_ms"]) == {"1", "8"} and costs["verify_cost_ratio"]["1"] == 1.0
    assert all(ms > 0 for ms in costs["target_step_ms"].values()) and costs["c"]["d"] > 0
    assert accelerator.measure.tree_name((4, 2, 2, 1)) == "tree(4,2,2,1)"
    layout = accelerator.measure.step_cost_layout
    assert layout(64, (1, 16)) == (47, 64)  # chains alone: the cache stays max_decode_len
    assert layout(64, (1, 64)) == (32, 96)  # a 64-token call fits past the limit
    assert layout(6, (1, 8)) == (3, 11)
    with pytest.raises(ValueError, match="ks >= 1"):
        layout(64, (0, 2))


def test_batch_sweep_only_writes_its_own_table(tmp_path):
    result = accelerator.main(["--out_dir", str(tmp_path), "--smoke", "--batch_sweep_only"])
    rows = result["batch_sweep"]["rows"]
    assert [r["batch"] for r in rows] == [1, 2] and result["batch_sweep"]["gamma"] == 2
    assert all(r["identical_fraction"] == 1.0 for r in rows)
    saved = json.loads((tmp_path / "cpu_batch.json").read_text())
    assert saved["batch_sweep"]["rows"][1]["batch"] == 2
    table = (tmp_path / "cpu_batch.md").read_text()
    assert "## (d) Batches (T = 0, γ = 2" in table and "| 1 | 3 |" in table
