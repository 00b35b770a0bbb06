"""benchmarks.batch_sweep: the job commands it issues, its --smoke pipeline and the table."""

import json

import pytest

from benchmarks import batch_sweep


def test_job_command_binds_the_batch_the_gammas_and_the_target_shape(tmp_path):
    args = batch_sweep.parse_args(
        ["--gammas", "2,3,auto", "--num_examples", "8", "--target_shape", "base"]
    )
    cmd = batch_sweep.job_command(args, 0.0, 4, 1, str(tmp_path / "run"))
    assert cmd[1:3] == ["-m", "specdec_t5x.eval"]
    assert "--gin.BATCH_SIZE=4" in cmd and "--gin.NUM_EXAMPLES=8" in cmd
    assert "--gin.GAMMA=2" in cmd and "--gin.GAMMAS=[3, 'auto']" in cmd
    assert "--gin.TARGET_SHAPE='base'" in cmd and "--gin.SEED=1" in cmd
    assert batch_sweep.probe_gamma([2, 3, "auto"]) == 3 and batch_sweep.probe_gamma(["auto"]) == 6


def test_row_length_counts_the_eos():
    assert batch_sweep._row_length([5, 6, 1, 0, 0], 5) == 3
    assert batch_sweep._row_length([5, 6, 7], 3) == 3


def test_smoke_runs_the_job_at_two_batches_and_renders_the_table(data_dir, tmp_path):
    out = tmp_path / "batch"
    assert batch_sweep.main(["--smoke", "--out_dir", str(out)]) == 0
    for b in (1, 2):
        metrics = json.loads((out / "runs" / f"T0_b{b}_r0" / "metrics.json").read_text())
        assert metrics["task"]["batch_size"] == b
        assert metrics["exactness"]["identical_fraction"] == 1.0
        costs = json.loads((out / "costs" / f"b{b}.json").read_text())
        assert set(costs["T_ms"]) == {"1", "2", "3"} and costs["batch"] == b
    table = (out / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 0 | ")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    assert all(row.split("|")[-3].strip() == "1.00" for row in rows)  # identical at T = 0
    assert "busy machine" in table or "Load average" in table
    records = json.loads((out / "records.json").read_text())
    assert {r["batch"] for r in records} == {1, 2}
    assert all(r["loop_iterations"] >= r["row_iterations"] for r in records)
    # --render alone rebuilds the same table, also without records.jsonl (git-ignored).
    for run in (out / "runs").iterdir():
        (run / "records.jsonl").unlink()
    assert batch_sweep.main(["--render", "--out_dir", str(out)]) == 0
    assert (out / "table.md").read_text() == table


@pytest.mark.parametrize("gamma", ["auto"])
def test_predict_leaves_auto_rows_to_the_measurement(gamma):
    record = {"gamma": gamma, "alpha": 0.5, "lengths": [[3, 4]]}
    assert batch_sweep.predict(record, None)["predicted"] is None
