"""The zero-cost loops `overheads.measure_loop_ms` times, and the prediction at output lengths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import decoding, models, speculative, theory
from specdec_t5x.eval import summary
from specdec_t5x.timing import clock, overheads

LOOP = {
    "baseline_per_token_ms": 0.1,
    "baseline_fixed_ms": 0.3,
    "speculative_per_iteration_ms": 0.4,
    "speculative_fixed_ms": 0.6,
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_zero_cost_loops_run_the_lengths_measure_loop_ms_assumes(temperature):
    """Constant logits: the baseline draws no EOS for n tokens, the speculative loop accepts all."""
    vocab, eos, n, gamma = 16, 1, 7, 3
    step = clock.constant_step(vocab, eos)
    inputs, cache = jnp.zeros((1, 12), jnp.int32), jnp.zeros((), jnp.float32)
    settings = {"temperature": temperature, "topk": 0, "topp": 0.0}
    rng = jax.random.PRNGKey(0)
    base = decoding.temperature_sample(
        inputs, cache, models.one_token_logits_fn(step), eos, rng, max_decode_steps=n, **settings
    )[0][:, -1]
    base = np.asarray(base)[0]
    assert eos not in base[:n] and not base[n:].any()  # n tokens, no EOS (token 0 may be drawn)
    _, stats = speculative.speculative_sample(
        inputs,
        cache,
        step,
        cache,
        step,
        eos,
        gamma=gamma,
        decode_rng=rng,
        max_decode_steps=n,
        **settings,
    )
    assert int(stats.num_generated[0]) == n
    assert int(stats.num_iterations[0]) == -(-n // (gamma + 1))
    ms = overheads.measure_loop_ms(1, vocab, 12, gamma, settings, eos, repeats=2)
    assert set(ms) == set(LOOP) and all(v >= 0 for v in ms.values())


def test_prediction_at_output_lengths_tends_to_thm_3_8_and_counts_calls():
    alpha, gamma, c, verify = 0.6, 4, 0.15, 1.2
    thm = theory.measured_walltime_improvement(alpha, gamma, c, verify)
    # Long outputs, one row per call: Theorem 3.8 with the measured verify cost.
    long = summary.predicted_at_output_lengths(
        [3000] * 2, [3000] * 2, [1, 1], alpha, gamma, c, verify
    )
    assert long == pytest.approx(thm, rel=2e-3)
    # 8-token outputs: each last block is cut, so fewer tokens per iteration than Eq. 1.
    short = summary.predicted_at_output_lengths([8] * 4, [8] * 4, [1] * 4, alpha, gamma, c, verify)
    expected = 32 / (4 * theory.expected_iterations([8], alpha, gamma)[0] * (gamma * c + verify))
    assert short == pytest.approx(expected) and short < 0.95 * thm
    # Two rows per call: the baseline runs to its longer row, the speculative call to its slower.
    batched = summary.predicted_at_output_lengths([8, 3], [8, 3], [2], alpha, gamma, c, verify)
    iterations = theory.expected_iterations([[8, 3]], alpha, gamma)[0]
    assert batched == pytest.approx(8 / (iterations * (gamma * c + verify)))
    with pytest.raises(ValueError, match="rows_per_call adds up to 3 rows for 2"):
        summary.predicted_at_output_lengths([8, 3], [8, 3], [2, 1], alpha, gamma, c, verify)
    assert summary.group_by_call([5, 6, 7], [2, 1]).tolist() == [[5, 6], [7, 0]]
