"""Auto γ's cost-curve cache (`cost_cache`) and its bounded, logged calibration (temporary cache
directories, injected clocks, no JAX decoding)."""

import logging
import time
import types

import numpy as np
import pytest
from test_speculation_gate import World, curve

from specdec_t5x.auto import auto_gamma, cost_cache
from specdec_t5x.timing import cost_curve

BATCH = {
    "encoder_input_tokens": np.ones((1, 16), np.int32),
    "decoder_input_tokens": np.zeros((1, 30), np.int32),
}
PAIR = types.SimpleNamespace(
    module=types.SimpleNamespace(config="tiny"),
    draft=types.SimpleNamespace(params={}),
    cpu_weight_dtype="float32",
)
PARAMS = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": {"c": np.ones(4, np.float32)}}


def key(params=PARAMS, shape=(1, 16), max_len=30, **measurement):
    return cost_cache.curve_key(PAIR, params, {}, shape, max_len, {"gamma_max": 4, **measurement})


def test_curve_round_trips_through_the_cache(tmp_path):
    c = cost_curve.calibrated(curve(), {0: [(0.31, 30, None)], 1: [(0.2, 30, 18)]})
    assert cost_cache.curve_from_dict(c.to_dict()) == c
    cache = cost_cache.CostCurveCache(tmp_path)
    k = key()
    assert cache.load(k) is None
    cache.store(k, c, 12.0)
    assert cache.load(k) == c and cache.load(k).call_scale == c.call_scale
    assert cache.path(k).parent == tmp_path and cache.path(k).name.endswith(".json")
    cache.path(k).write_text("{not json")
    assert cache.load(k) is None  # unreadable: measured again, never raised


def test_any_change_of_what_the_curve_depends_on_changes_the_key(monkeypatch):
    base = cost_cache.key_digest(key())
    assert cost_cache.key_digest(key()) == base  # deterministic
    changed = {**PARAMS, "a": PARAMS["a"] + 1}  # a retrained leaf among the checksummed ones
    others = [
        key(params=changed),
        key(params={**PARAMS, "a": PARAMS["a"].astype(np.float16)}),  # a dtype
        key(shape=(2, 16)),  # the batch size
        key(shape=(1, 32)),  # the input length
        key(max_len=64),
        key(gamma_max=6),
        key(settings=[("temperature", "1.0")]),
    ]
    monkeypatch.setattr(cost_cache, "code_hash", lambda: "edited")  # a timed module edited
    others.append(key())
    monkeypatch.undo()
    from specdec_t5x import cpu_kernel

    monkeypatch.setattr(cpu_kernel, "kernel_path", lambda: "portable")  # another kernel path
    others.append(key())
    digests = [cost_cache.key_digest(k) for k in others]
    assert base not in digests and len(set(digests)) == len(digests)


def test_open_cache_follows_the_argument_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_cache.ENV, "0")
    assert cost_cache.open_cache() is None
    monkeypatch.setenv(cost_cache.ENV, str(tmp_path / "env"))
    assert cost_cache.open_cache().directory == tmp_path / "env"
    assert cost_cache.open_cache(tmp_path / "arg").directory == tmp_path / "arg"
    assert cost_cache.open_cache(False) is None and cost_cache.open_cache("0") is None
    monkeypatch.delenv(cost_cache.ENV)
    assert cost_cache.open_cache().directory == cost_cache.DEFAULT_DIR


def decoder(world, **kwargs):
    d = auto_gamma.AutoGammaDecoder(
        PAIR, PARAMS, {}, settings={"temperature": 0.0}, gamma_max=4, clock=world.clock, **kwargs
    )
    d.decode = world.decode
    d.compile = lambda plan, batch: None
    return d


def test_a_second_run_reads_the_curve_back_and_skips_measuring_it(tmp_path, monkeypatch):
    measured = []

    def measure(*args, **kwargs):
        measured.append(args[8])  # the repeats
        kwargs["progress"]("step costs")
        return curve()

    monkeypatch.setattr(cost_curve, "measure_cost_curve", measure)
    world = World(curve())
    first = decoder(world, cost_cache=tmp_path, calibration_rounds=2, cost_repeats=20)
    first.choose(BATCH)
    assert measured == [20] and first.calibration["source"] == "measured"
    assert first.calibration["rounds"] == 2 and first.controller.curve.call_scale  # calibrated
    assert first.controller.curve.to_dict()["source"] == "measured"
    calls_before = world.i
    second = decoder(world, cost_cache=str(tmp_path), calibration_rounds=2, cost_repeats=20)
    second.choose(BATCH)
    assert measured == [20] and world.i == calls_before  # neither measured nor calibrated
    assert second.calibration["source"] == "cache" and second.calibration["rounds"] == 0
    assert second.controller.curve == first.controller.curve
    assert second.controller.curve.to_dict()["source"] == "cache"  # the row says so
    # Another batch size is another curve.
    third = decoder(world, cost_cache=tmp_path, calibration_rounds=2, cost_repeats=20)
    third.choose({k: np.repeat(v, 2, axis=0) for k, v in BATCH.items()})
    assert measured == [20, 20] and third.calibration["source"] == "measured"
    # Off: measured every time.
    decoder(world, cost_cache=False, calibration_rounds=0).choose(BATCH)
    assert len(measured) == 3


def test_calibration_is_bounded_to_a_share_of_the_run(monkeypatch):
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: curve())
    world = World(curve())
    # A short run: a quick curve, no calibration rounds.
    repeats = []
    monkeypatch.setattr(
        cost_curve, "measure_cost_curve", lambda *a, **k: repeats.append(a[8]) or curve()
    )
    short = decoder(world, cost_cache=False, expected_calls=5, cost_repeats=60)
    start = world.i
    short.choose(BATCH)
    assert repeats == [auto_gamma.SHORT_RUN_REPEATS] and short.calibration["rounds"] == 0
    assert world.i == start  # no calibration call at all (plans compile when first chosen)
    # 40 calls: rounds only while they fit 10 % of 40 baseline calls (one warm-up round of the
    # 5 plans costs ~4 baseline calls, so one round fits, not the 4 asked for).
    bounded = decoder(world, cost_cache=False, expected_calls=40, calibration_rounds=4)
    t0 = world.t
    bounded.choose(BATCH)
    base = curve().baseline_call_ms(30) / 1e3
    assert bounded.calibration["rounds"] == 1
    rounds_time = world.t - t0
    assert rounds_time <= 0.1 * 40 * base + 2 * 5 * base  # the budget plus the warm-up round
    unbounded = decoder(world, cost_cache=False, calibration_rounds=4)
    unbounded.choose(BATCH)
    assert unbounded.calibration["rounds"] == 4  # no expected length: the rounds asked for


def test_heartbeat_logs_progress_while_a_measurement_runs():
    lines = []
    with cost_cache.Heartbeat("measuring", every=0.02, log=lambda *a: lines.append(a)) as beat:
        beat.stage = "step costs"
        time.sleep(0.15)
    assert beat.beats >= 2 and (lines[0][0] % lines[0][1:]).startswith("measuring: ")
    assert any("step costs" in (line[0] % line[1:]) for line in lines)
    count = beat.beats
    time.sleep(0.05)
    assert beat.beats == count  # stopped with the block


def test_setup_logs_where_the_curve_came_from(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: curve())
    world = World(curve())
    with caplog.at_level(logging.INFO, logger="specdec_t5x"):
        decoder(world, cost_cache=tmp_path, calibration_rounds=1).choose(BATCH)
        decoder(world, cost_cache=tmp_path, calibration_rounds=1).choose(BATCH)
    text = caplog.text
    assert "cost curve measured" in text and "read from the cache" in text
    with pytest.raises(KeyError):
        cost_cache.curve_from_dict({"draft_step_ms": 1.0})  # missing fields: not a curve
