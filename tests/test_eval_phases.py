"""Every phase of the eval job visible: heartbeat lines while a phase runs, progress with an ETA
while decoding, and each phase's wall time in metrics.json."""

import json
import logging
import threading
import time

import pytest
from conftest import tiny_spec_pair
from test_eval import configs

from specdec_t5x.eval import job, progress


def _heartbeats(caplog, name):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{name}: still")]


def test_a_long_phase_logs_a_heartbeat_and_its_time(caplog):
    caplog.set_level(logging.INFO, logger="specdec_t5x.eval")
    times = {}
    with progress.phase("compile and warm up 3 rows", times, "compile", heartbeat_s=0.05):
        time.sleep(0.3)
    beats = _heartbeats(caplog, "compile and warm up 3 rows")
    assert len(beats) >= 2
    assert beats[0].startswith("compile and warm up 3 rows: still running, ")
    assert beats[0].endswith(" s")
    assert times["compile"] >= 0.3
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "compile and warm up 3 rows ..."
    assert messages[-1].startswith("compile and warm up 3 rows: done in ")
    assert not any(t.name.startswith("phase heartbeat") for t in threading.enumerate())


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_heartbeat_stops_when_the_phase_fails(caplog, error):
    caplog.set_level(logging.INFO, logger="specdec_t5x.eval")
    times = {}
    with pytest.raises(error):
        with progress.phase("decode", times, heartbeat_s=0.02):
            time.sleep(0.05)
            raise error()
    assert not any(t.name.startswith("phase heartbeat") for t in threading.enumerate())
    n = len(_heartbeats(caplog, "decode"))
    time.sleep(0.1)
    assert len(_heartbeats(caplog, "decode")) == n  # nothing after the phase ended
    assert caplog.records[-1].getMessage().startswith("decode: stopped after ")
    assert "decode" in times


def test_a_short_phase_logs_no_heartbeat(caplog):
    caplog.set_level(logging.INFO, logger="specdec_t5x.eval")
    with progress.phase("inputs"):
        pass
    assert not _heartbeats(caplog, "inputs")


def test_decode_progress_names_examples_elapsed_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="specdec_t5x.eval")
    progress.log_progress(2, 8, 4, 16, 10.0)
    assert caplog.records[-1].getMessage() == (
        "decoded 2/8 batches (25%): 4/16 examples, 10 s elapsed, ETA 30 s"
    )


def test_a_tiny_jobs_metrics_name_every_phases_wall_time(data_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="specdec_t5x.eval")
    spec_model, params = tiny_spec_pair()
    out = tmp_path / "out"
    kwargs = configs(gamma=2, num_examples=2, batch_size=1, cost_repeats=2, loop_costs=False)
    job.evaluate(spec_model, params, str(out), **kwargs)
    phases = json.loads((out / "metrics.json").read_text())["provenance"]["phases_s"]
    assert {"inputs", "parameters", "compile", "decode", "costs"} <= set(phases)
    assert {"report_summary", "report_exactness"} <= set(phases)
    assert all(isinstance(s, float) and s >= 0 for s in phases.values())
    assert phases["compile"] > 0 and phases["decode"] > 0
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decoded ")]
    assert progress[-1].startswith("decoded 2/2 batches (100%): 2/2 examples")
    assert "ETA 0 s" in progress[-1]
