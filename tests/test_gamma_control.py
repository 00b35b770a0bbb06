"""γ control: choice from a cost curve (0 = off), online α, measured curve, auto decoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, perturbed

from specdec_t5x import drafts, gamma_control, models, speculative, theory


def curve(draft_ms, verify_growth=0.0, overhead_ms=0.0, gamma_max=6):
    """Synthetic curve: T(1) = 10 ms, T(k) grows by `verify_growth` ms per extra token."""
    return gamma_control.CostCurve(
        block_step_ms={k: 10.0 + verify_growth * (k - 1) for k in range(1, gamma_max + 2)},
        draft_step_ms=draft_ms,
        baseline_sampling_ms=0.0,
        sampling_ms={g: overhead_ms * g for g in range(1, gamma_max + 1)},
    )


def test_cost_curve_prediction_is_the_generalised_theorem():
    c = curve(draft_ms=1.0, verify_growth=2.0, overhead_ms=0.5)
    got = c.predicted_speedup(0.7, 3)
    want = theory.measured_walltime_improvement(0.7, 3, 0.1, 16.0 / 10.0, 1.5 / 10.0)
    assert got == pytest.approx(want)
    assert c.predicted_speedup(0.7, 0) == 1.0


def test_controller_picks_the_best_gamma_and_off_when_nothing_pays():
    cheap = gamma_control.GammaController(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, predicted = cheap.choose()
    best = max(range(1, 7), key=lambda g: theory.walltime_improvement(0.8, g, 0.02))
    assert gamma == best and predicted > 1.0
    # A draft as slow as the target with a growing verify cost: nothing predicts a speed-up.
    slow = gamma_control.GammaController(curve(draft_ms=10.0, verify_growth=3.0), prior_alpha=0.5)
    assert slow.choose() == (0, 1.0)
    # α = 1 is allowed (a draft equal to the target): the longest block wins with a free draft.
    exact = gamma_control.GammaController(curve(draft_ms=0.0), prior_alpha=1.0)
    assert exact.choose()[0] == 6


def test_controller_probes_then_learns_alpha_from_beta():
    controller = gamma_control.GammaController(curve(draft_ms=3.0, verify_growth=1.0))
    assert controller.choose() == (1, None)  # no α yet: probe with γ = 1
    stats = speculative.SpeculativeStats(
        *(jnp.zeros((2,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((2, 2), jnp.int32),
        beta_sum=jnp.array([1.0, 2.0]),
        num_beta=jnp.array([10, 10]),
        num_generated=jnp.zeros((2,), jnp.int32),
        num_proposed=jnp.zeros((2,), jnp.int32),
    )
    controller.update(stats)
    assert controller.alpha == pytest.approx(0.15)
    assert controller.choose() == (0, 1.0)  # α = 0.15 with c = 0.3: off


def test_controller_corrects_its_prediction_by_measured_speed():
    """γ > 0 predicted to pay but measured slower than the baseline: the controller switches off."""
    controller = gamma_control.GammaController(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, predicted = controller.choose()
    assert gamma > 0 and predicted > 1.2  # the cost curve alone says: speculate
    for _ in range(2):  # γ timed at 2 ms/token (after two calls it wants the baseline timed)
        controller.observe(gamma, 0.2, 100)
    assert controller.choose() == (0, 1.0)
    assert controller.calibration(controller.predictions(0.8)) is None
    for _ in range(2):  # baseline timed at 1 ms/token: γ measured at 0.5x, not the predicted gain
        controller.observe(0, 0.1, 100)
    kappa = controller.calibration(controller.predictions(0.8))
    assert kappa == pytest.approx(0.5 / predicted)
    assert controller.choose() == (0, 1.0)
    # The same γ measured 1.5x faster than the baseline: the controller keeps speculating.
    fast = gamma_control.GammaController(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, predicted = fast.choose()
    for _ in range(2):
        fast.observe(gamma, 0.1, 150)
        fast.observe(0, 0.1, 100)
    chosen, calibrated = fast.choose()
    assert chosen > 0 and calibrated > 1.0
    assert fast.calibration(fast.predictions(0.8)) == pytest.approx(1.5 / predicted)
    with pytest.raises(ValueError, match="num_tokens"):
        fast.observe(1, 0.1, 0)


BATCH, ENC_LEN, MAX_LEN = 2, 7, 10


@pytest.fixture(scope="module")
def pair(tiny_target):
    module, params = tiny_target
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 1))
    batch = {
        "encoder_input_tokens": encoder_inputs(BATCH, ENC_LEN, [7, 4]),
        "decoder_input_tokens": jnp.zeros((BATCH, MAX_LEN), jnp.int32),
    }
    return models.SpeculativeEncoderDecoderModel(module, draft), params, batch


def test_measured_curve_is_complete_and_cached(pair):
    spec_model, params, batch = pair
    settings = {"temperature": 1.0, "topk": 0, "topp": 0.0}
    args = (spec_model, params, spec_model.draft.params, batch["encoder_input_tokens"], MAX_LEN, 2)
    measured = gamma_control.measure_cost_curve(*args, settings, repeats=2)
    assert sorted(measured.block_step_ms) == [1, 2, 3] and sorted(measured.sampling_ms) == [1, 2]
    values = [*measured.block_step_ms.values(), *measured.sampling_ms.values()]
    assert all(v > 0 for v in values) and measured.draft_step_ms > 0
    assert gamma_control.measure_cost_curve(*args, settings, repeats=2) is measured


def test_auto_decoder_in_argmax_mode_equals_greedy_whatever_gamma(pair):
    spec_model, params, batch = pair
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    baseline = models.EncoderDecoderModel(spec_model.module)
    want = baseline.predict_batch_with_aux(params, batch, decoder_params=settings)[0]
    decoder = gamma_control.AutoGammaDecoder(
        spec_model, params, settings=settings, gamma_max=2, curve=curve(1.0, gamma_max=2)
    )
    rng = jax.random.PRNGKey(0)
    decodes, aux = decoder(batch, rng)  # first call: the γ = 1 probe
    np.testing.assert_array_equal(decodes, want)
    assert aux["gamma"] == 1 and int(np.sum(aux["stats"].num_beta)) > 0
    for forced in (0, 2):  # off (the baseline itself) and on
        decoder.compile(forced, batch)
        decodes, aux = decoder.decode(forced, batch, rng)
        np.testing.assert_array_equal(decodes, want)
        assert ("stats" in aux) == (forced > 0)
    gamma, predicted = decoder.choose(batch)
    assert 0 <= gamma <= 2 and predicted is not None


def test_summarise_auto_reports_off_and_the_choices():
    off = gamma_control.summarise_auto([1.0, 2.0], [1.0, 1.0], [None, None], [0, 0], [1.0, 1.0])
    assert off["alpha_display"] == "off" and off["alpha_beta"] is None
    assert off["gamma_chosen"] == {"0": 2} and off["speedup"] == pytest.approx(1.5)
    stats = speculative.SpeculativeStats(
        num_iterations=np.array([4]),
        num_draft_tokens=np.array([6]),
        num_accepted=np.array([3]),
        accept_histogram=np.array([[1, 2, 1]]),
        beta_sum=np.array([3.0]),
        num_beta=np.array([6]),
        num_generated=np.array([10]),
        num_proposed=np.array([8]),
    )
    on = gamma_control.summarise_auto([1.0, 1.0], [0.5, 1.0], [stats, None], [2, 0], [None, 1.0])
    assert on["alpha_display"] == "0.50" and on["tokens_per_iteration"] == 2.5
    assert on["gamma_chosen"] == {"0": 1, "2": 1} and on["predicted_speedup"] == 1.0
