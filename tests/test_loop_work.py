"""`loop_work`: the old-vs-new loop-work comparison's plumbing (no timings asserted)."""

import numpy as np
import pytest

from specdec_t5x import loop_work, provenance, speculative, time_budget

SHAPES = dict(batch=2, vocab=64, max_decode_len=12, eos_id=1)


def test_sampler_at_commit_decodes_like_the_current_sampler_in_argmax_mode():
    old = loop_work.sampler_at_commit("HEAD", provenance.REPO)
    assert old is not speculative.speculative_sample
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    decode = lambda fn: time_budget.zero_cost_decode(  # noqa: E731
        fn, 3, max_decode_steps=12, settings=settings, **SHAPES
    )()
    want = time_budget.zero_cost_decode(None, max_decode_steps=12, settings=settings, **SHAPES)()
    want = want[:, 0]  # [batch, num_decodes = 1, length]
    np.testing.assert_array_equal(decode(old), want)  # greedy: the baseline's tokens
    np.testing.assert_array_equal(decode(speculative.speculative_sample), want)


@pytest.mark.parametrize(
    "samplers, max_decode_len, match",
    [
        ({"baseline": speculative.speculative_sample}, 12, "reserved|names the baseline"),
        ({"new": speculative.speculative_sample}, 3, "too short"),
    ],
)
def test_measure_per_iteration_ms_rejects_bad_arguments(samplers, max_decode_len, match):
    with pytest.raises(ValueError, match=match):
        loop_work.measure_per_iteration_ms(
            samplers,
            batch=1,
            vocab=64,
            max_decode_len=max_decode_len,
            gamma=3,
            settings={"temperature": 0.0, "topk": 0, "topp": 0.0},
            eos_id=1,
        )


def test_markdown_table_has_one_row_per_record():
    timing = {"median_ms": 0.5, "q25_ms": 0.4, "q75_ms": 0.6}
    record = {"temperature": 1.0, "gamma": 3, "batch": 1}
    record["ms"] = {"old": timing, "new": dict(timing, median_ms=0.25), "baseline": timing}
    table = loop_work.markdown_table([record, record], ["old", "new"])
    rows = [line for line in table.splitlines() if line.startswith("| 1 | 3 | 1 |")]
    assert len(rows) == 2 and "| 0.50 |" in rows[0]
