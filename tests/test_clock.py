"""`timing.clock.time_interleaved`'s time budget, and the eval job's setting of it."""

import time

import numpy as np
import pytest

from specdec_t5x.eval import config
from specdec_t5x.timing import clock


def _calls(seconds):
    def call():
        time.sleep(seconds)
        return np.zeros(())

    return {"a": call, "b": call}


def test_budget_stops_after_the_minimum_rounds_once_spent():
    spent = clock.time_interleaved(_calls(0.002), repeats=40, warmup=0, budget_s=0.0)
    assert {len(v) for v in spent.values()} == {clock.MIN_ROUNDS}
    whole = clock.time_interleaved(_calls(0.0), repeats=clock.MIN_ROUNDS + 5, warmup=0)
    assert {len(v) for v in whole.values()} == {clock.MIN_ROUNDS + 5}
    ample = clock.time_interleaved(_calls(0.0), repeats=clock.MIN_ROUNDS + 5, budget_s=60.0)
    assert {len(v) for v in ample.values()} == {clock.MIN_ROUNDS + 5}


def test_cost_seconds_is_a_number_at_least_zero():
    assert config.MeasureConfig(cost_seconds=0).cost_seconds == 0
    for bad in (-1, "30", True):
        with pytest.raises(ValueError, match="COST_SECONDS"):
            config.MeasureConfig(cost_seconds=bad)
