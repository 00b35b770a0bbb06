"""`eval.diagnostics`: the composition of measured component costs, and the zero-cost loops it times."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import decoding, models, speculative, theory
from specdec_t5x.eval import diagnostics, summary
from specdec_t5x.timing import clock, overheads

SETUP = {"target_setup_ms": 2.0, "draft_setup_ms": 0.5}
LOOP = {
    "baseline_per_token_ms": 0.1,
    "baseline_fixed_ms": 0.3,
    "speculative_per_iteration_ms": 0.4,
    "speculative_fixed_ms": 0.6,
}


def test_compose_adds_every_component_with_the_counted_calls():
    out = diagnostics.compose(
        gamma=3,
        num_calls=2,
        baseline_tokens=40,
        iterations=16,
        target_step_ms=1.0,
        draft_step_ms=0.2,
        verify_step_ms=1.5,
        setup=SETUP,
        loop=LOOP,
        baseline_seconds=0.1,
        speculative_seconds=0.05,
    )
    base = 2 * 2.0 + 2 * 0.3 + 40 * 1.0 + 40 * 0.1  # 48.6 ms
    spec = 2 * 2.0 + 2 * 0.5 + 2 * 0.6 + 16 * 3 * 0.2 + 16 * 1.5 + 16 * 0.4  # 46.2 ms
    assert out["baseline_ms"] == pytest.approx(base)
    assert out["speculative_ms"] == pytest.approx(spec)
    assert out["predicted_speedup"] == pytest.approx(base / spec)
    assert out["speculative"]["draft_steps"] == pytest.approx(9.6)
    assert out["baseline_residual_ms"] == pytest.approx(100.0 - base)
    assert out["speculative_residual_ms"] == pytest.approx(50.0 - spec)


def test_compose_refuses_negative_costs_naming_them():
    with pytest.raises(ValueError, match="draft_step_ms"):
        diagnostics.compose(
            gamma=3,
            num_calls=1,
            baseline_tokens=1,
            iterations=1,
            target_step_ms=1.0,
            draft_step_ms=-0.1,
            verify_step_ms=1.0,
            setup=SETUP,
            loop=LOOP,
        )


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


def test_per_call_counts_take_the_longest_row_of_each_call():
    stats = lambda it, gen: speculative.SpeculativeStats(  # noqa: E731
        num_iterations=np.int32(it),
        num_draft_tokens=np.int32(0),
        num_accepted=np.int32(0),
        accept_histogram=np.zeros(4, np.int32),
        beta_sum=np.float32(0),
        num_beta=np.int32(0),
        num_generated=np.int32(gen),
        num_proposed=np.int32(0),
        log_prob=np.float32(0.0),
    )
    eos = 1
    runs = {
        "baseline": summary.Run(
            tokens=[np.array([5, 5, 1, 0]), np.array([5, 1, 0, 0]), np.array([5, 5, 5, 1])]
        ),
        3: summary.Run(stats=[stats(2, 3), stats(1, 2), stats(3, 4)]),
    }
    counts = diagnostics.per_call_counts(runs, 3, eos, [2, 1])
    assert counts == {"baseline_tokens": 3 + 4, "iterations": 2 + 3, "speculative_tokens": 3 + 4}


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
