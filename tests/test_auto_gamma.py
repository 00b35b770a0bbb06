"""γ control: choice from a cost curve (0 = off), online α, measured curve, auto decoder."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, perturbed

from specdec_t5x import drafts, models, speculative, theory
from specdec_t5x.auto import auto_gamma, gamma_controller
from specdec_t5x.auto import row as auto_row
from specdec_t5x.eval import tables
from specdec_t5x.timing import cost_curve, loops


def new_controller(c, prior_alpha=None, **knobs):
    """A `GammaController` on curve `c` with `GammaConfig(**knobs)`."""
    config = gamma_controller.GammaConfig(**knobs)
    return gamma_controller.GammaController(c, prior_alpha, config)


def curve(draft_ms, verify_growth=0.0, overhead_ms=0.0, gamma_max=6):
    """Synthetic curve: T(1) = 10 ms, T(k) grows by `verify_growth` ms per extra token."""
    return cost_curve.CostCurve(
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
    cheap = new_controller(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, predicted = cheap.choose()
    best = max(range(1, 7), key=lambda g: theory.walltime_improvement(0.8, g, 0.02))
    assert gamma == best and predicted > 1.0
    # A draft as slow as the target with a growing verify cost: nothing predicts a speed-up.
    slow = new_controller(curve(draft_ms=10.0, verify_growth=3.0), prior_alpha=0.5)
    assert slow.choose() == (0, 1.0)
    # α = 1 is allowed (a draft equal to the target): the longest block wins with a free draft.
    exact = new_controller(curve(draft_ms=0.0), prior_alpha=1.0)
    assert exact.choose()[0] == 6


def test_controller_probes_then_learns_alpha_from_beta():
    controller = new_controller(curve(draft_ms=3.0, verify_growth=1.0))
    assert controller.choose() == (1, None)  # no α yet: probe with γ = 1
    stats = speculative.SpeculativeStats(
        *(jnp.zeros((2,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((2, 2), jnp.int32),
        beta_sum=jnp.array([1.0, 2.0]),
        num_beta=jnp.array([10, 10]),
        num_generated=jnp.zeros((2,), jnp.int32),
        num_proposed=jnp.zeros((2,), jnp.int32),
        log_prob=jnp.zeros((2,), jnp.float32),
    )
    controller.update(stats)
    assert controller.alpha == pytest.approx(0.15)
    assert controller.predictions(0.15)[1] < 1.0  # α = 0.15 with c = 0.3 does not pay, but
    assert controller.optimistic_alpha == pytest.approx(0.15 + 1.645 * 0.2)  # one call is thin
    gamma, predicted = controller.choose()
    assert gamma == 1 and predicted == pytest.approx(controller.predictions(0.15)[1])  # explore
    for _ in range(8):  # more calls at the same α: the margin shrinks and speculation goes off
        controller.update(stats)
    # Nine calls of α = 0.15 each: the measured spread 0 is shrunk toward 0.2 with 4 calls' weight.
    spread = np.sqrt(4 * 0.2**2 / (4 + 8))
    assert controller.alpha_spread_estimate == pytest.approx(spread)
    assert controller.optimistic_alpha == pytest.approx(0.15 + 1.645 * spread / 3)
    assert controller.choose() == (0, 1.0)


def test_two_unlucky_first_calls_do_not_switch_a_paying_pair_off():
    # The Table-2 failure: α̂ = 0.46 after two calls (the run's α was 0.56) predicted no gain.
    c = curve(draft_ms=3.0, verify_growth=2.0)
    controller = new_controller(c)
    low = speculative.SpeculativeStats(
        *(jnp.zeros((1,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((1, 2), jnp.int32),
        beta_sum=jnp.array([4.6]),
        num_beta=jnp.array([10]),
        num_generated=jnp.zeros((1,), jnp.int32),
        num_proposed=jnp.zeros((1,), jnp.int32),
        log_prob=jnp.zeros((1,), jnp.float32),
    )
    for _ in range(2):
        controller.update(low)
    assert max(controller.predictions(0.46).values()) == 1.0  # at α̂ alone: off for good
    assert max(controller.predictions(0.56).values()) > 1.0  # at the true α: it pays
    assert controller.choose()[0] > 0


def test_call_prediction_adds_setup_and_fixed_work_to_both_sides():
    c = dataclasses.replace(
        curve(draft_ms=1.0, verify_growth=2.0, overhead_ms=0.5),
        target_setup_ms=30.0,
        draft_setup_ms=5.0,
        baseline_fixed_ms=1.0,
        speculative_fixed_ms={3: 2.0},
    )
    e = theory.expected_tokens_per_iteration(0.7, 3)
    want = (30.0 + 1.0 + 12 * 10.0) / (30.0 + 5.0 + 2.0 + (12 / e) * (3 * 1.0 + 16.0 + 1.5))
    assert c.predicted_speedup(0.7, 3, tokens_per_call=12) == pytest.approx(want)
    # Long outputs: the per-call parts vanish and the steady state (the theorem) remains.
    assert c.predicted_speedup(0.7, 3, 1e9) == pytest.approx(c.predicted_speedup(0.7, 3), rel=1e-6)
    # α = 1 is allowed (a draft equal to the target): γ + 1 tokens per iteration.
    assert c.predicted_speedup(1.0, 3, 8) == pytest.approx(
        (31.0 + 80.0) / (37.0 + 2 * (3.0 + 16.0 + 1.5))
    )


def test_short_outputs_of_long_inputs_switch_speculation_off():
    """Summarization-like calls: 10 tokens after long encoder passes; the steady state says on."""
    c = dataclasses.replace(curve(draft_ms=0.5), target_setup_ms=90.0, draft_setup_ms=60.0)
    controller = new_controller(c, prior_alpha=0.6)
    assert max(controller.predictions(0.6).values()) > 1.2  # no call seen yet: steady state
    controller.observe(0, c.baseline_call_ms(10) / 1e3, 10)  # one call of 10 tokens seen
    assert controller.tokens_per_call == 10
    assert controller.choose() == (0, 1.0)


def test_controller_corrects_its_model_by_each_calls_own_counts():
    """Timed calls are compared with the model of the same call, not with other examples."""
    controller = new_controller(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, predicted = controller.choose()
    assert gamma > 0 and predicted > 1.2  # the cost curve alone says: speculate
    spec_ms = controller.curve.speculative_call_ms(gamma, 20)
    for _ in range(2):  # γ timed at 5x its modelled time (20 counted iterations, 60 tokens)
        controller.observe(gamma, 5 * spec_ms / 1e3, 60, iterations=20)
    assert controller.choose() == (0, None)  # now time the baseline (a measurement)
    for _ in range(2):  # the baseline on much shorter examples, exactly as modelled
        controller.observe(0, controller.curve.baseline_call_ms(6) / 1e3, 6)
    k = controller.corrections()
    assert k["speculative"] == pytest.approx(5.0) and k["baseline"] == pytest.approx(1.0)
    assert k["iterations"] == pytest.approx(20 / theory.expected_iterations([60], 0.8, gamma)[0])
    assert controller.tokens_per_call == pytest.approx(33.0)
    assert controller.choose() == (0, 1.0)
    # The same γ measured as modelled, the baseline on other lengths: the controller speculates,
    # and its prediction is the model's for the mean call length (per-token speeds never mixed).
    fast = new_controller(curve(draft_ms=0.2), prior_alpha=0.8)
    gamma, _ = fast.choose()
    n = lambda tokens, g=gamma: theory.expected_iterations([tokens], 0.8, g)[0]  # noqa: E731
    for tokens in (40, 80):
        fast.observe(
            gamma, fast.curve.speculative_call_ms(gamma, n(tokens)) / 1e3, tokens, n(tokens)
        )
        fast.observe(0, fast.curve.baseline_call_ms(3) / 1e3, 3)
    assert fast.corrections() == pytest.approx(
        {"baseline": 1.0, "speculative": 1.0, "iterations": 1.0}
    )
    chosen, predicted = fast.choose()
    # The baseline at the mean length (linear in L); the iterations at each observed length.
    iterations = np.mean([n(t, chosen) for t in (40, 80, 3, 3)])
    assert chosen > 0 and predicted == pytest.approx(
        fast.curve.baseline_call_ms(31.5) / fast.curve.speculative_call_ms(chosen, iterations)
    )
    with pytest.raises(ValueError, match="longest_tokens"):
        fast.observe(1, 0.1, 0, 1)
    with pytest.raises(ValueError, match="iterations"):
        fast.observe(2, 0.1, 5)


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
    measured = cost_curve.measure_cost_curve(*args, settings, repeats=2)
    assert sorted(measured.block_step_ms) == [1, 2, 3] and sorted(measured.sampling_ms) == [1, 2]
    assert sorted(measured.speculative_fixed_ms) == [1, 2]
    assert all(v > 0 for v in measured.block_step_ms.values()) and measured.draft_step_ms > 0
    loop_work = [*measured.sampling_ms.values(), *measured.speculative_fixed_ms.values()]
    assert all(v >= 0 for v in loop_work)  # slopes/intercepts of timings: 0 when below noise
    assert measured.target_setup_ms > 0 and measured.draft_setup_ms > 0
    assert cost_curve.measure_cost_curve(*args, settings, repeats=2) is measured


def test_auto_decoder_in_argmax_mode_equals_greedy_whatever_gamma(pair):
    spec_model, params, batch = pair
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    baseline = models.EncoderDecoderModel(spec_model.module)
    want = baseline.predict_batch_with_aux(params, batch, decoder_params=settings)[0]
    decoder = auto_gamma.AutoGammaDecoder(  # no gate: the controller's probe runs first
        spec_model, params, settings=settings, gamma_max=2, curve=curve(1.0, gamma_max=2), gate=None
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
    off = auto_row.summarise_auto([1.0, 2.0], [1.0, 1.0], [None, None], [0, 0], [1.0, 1.0])
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
        log_prob=np.array([0.0]),
    )
    on = auto_row.summarise_auto([1.0, 1.0], [0.5, 1.0], [stats, None], [2, 0], [None, 1.0])
    assert on["alpha_display"] == "0.50" and on["tokens_per_iteration"] == 2.5
    assert on["gamma_chosen"] == {"0": 1, "2": 1} and on["predicted_speedup"] == 1.0
    assert on["probe_examples"] == 1 and on["baseline_timing_examples"] == 0
    # γ = 0 with no prediction is a baseline timing, reported apart from "off" decisions.
    timed = auto_row.summarise_auto(
        [1.0] * 3, [1.0] * 3, [stats, None, None], [2, 0, 0], [1.2, None, 1.0]
    )
    assert timed["baseline_timing_examples"] == 1 and timed["gamma_chosen"] == {"0": 2, "2": 1}
    assert tables.auto_choices(timed) == "off×1, baseline timing×1, 2×1"


def test_bootstrap_interval_brackets_the_ratio_and_rejects_mismatched_runs():
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 2.0, 200)
    low, high = auto_row.bootstrap_interval(base, base / 1.25)
    assert low == pytest.approx(1.25) and high == pytest.approx(1.25)  # paired: exact ratio
    noisy = base / 1.25 * rng.uniform(0.8, 1.2, 200)
    low, high = auto_row.bootstrap_interval(base, noisy)
    ratio = base.sum() / noisy.sum()
    assert low < ratio < high and high - low < 0.1
    with pytest.raises(ValueError, match="equal non-empty"):
        auto_row.bootstrap_interval(base, base[:-1])


def test_baseline_is_retimed_while_speculating_and_corrects_a_slow_first_timing():
    """Two slow first baseline calls made ρ_b too high (γ = 2 kept at 0.88×): re-timing fixes it."""
    c = curve(draft_ms=1.0, verify_growth=1.0)
    controller = new_controller(c, prior_alpha=0.6, baseline_every=4)
    gamma = controller.choose()[0]
    assert gamma > 0
    tokens = 30
    iterations = tokens / theory.expected_tokens_per_iteration(0.6, gamma)
    spec_s = 1.8 * c.speculative_call_ms(gamma, iterations) / 1e3  # γ really 1.8x its model
    base_s = c.baseline_call_ms(tokens) / 1e3  # the baseline really as modelled
    for _ in range(2):
        controller.observe(gamma, spec_s, tokens, iterations)
    assert controller.choose() == (0, None)
    for _ in range(2):  # the two first baseline timings ran 2x slow (cold caches, noise)
        controller.observe(0, 2.0 * base_s, tokens)
    assert controller.choose()[0] > 0  # ρ_b too high: speculation predicted to pay
    seen = []
    for _ in range(40):
        g, _ = controller.choose()
        seen.append(g)
        controller.observe(g, base_s if g == 0 else spec_s, tokens, None if g == 0 else iterations)
    assert 0 in seen[:4]  # the baseline was re-timed within baseline_every calls
    assert controller.corrections()["baseline"] < 1.15  # and ρ_b moved toward the truth
    assert seen[-8:] == [0] * 8  # so speculation (truly slower here) went off
    assert max(controller.predictions(0.6)[g] for g in range(1, 7)) < 1.0
    never = new_controller(c, prior_alpha=0.6, baseline_every=0)
    for _ in range(2):
        never.observe(gamma, spec_s / 1.8, tokens, iterations)
        never.observe(0, base_s, tokens)
    assert [never.choose()[0] > 0 for _ in range(3)] == [True] * 3


def _retimings(controller, c, gamma_factor, base_noise, calls=96):
    """Runs `calls` choices against a world where speculation costs `gamma_factor` × its model and
    the baseline call its model × (1 ± base_noise, alternating); returns the γ chosen per call."""
    tokens, seen = 30, []
    for i in range(calls):
        g, _ = controller.choose()
        seen.append(g)
        if g == 0:
            noise = 1 + base_noise * (1 if i % 2 else -1)
            controller.observe(0, noise * c.baseline_call_ms(tokens) / 1e3, tokens)
        else:
            iterations = tokens / theory.expected_tokens_per_iteration(0.6, g)
            ms = gamma_factor * c.speculative_call_ms(g, iterations)
            controller.observe(g, ms / 1e3, tokens, iterations)
    return seen


def test_baseline_retiming_is_skipped_while_speculation_safely_pays():
    """A clear win re-times the baseline only every max_baseline_every calls; a marginal one, where
    ρ_b's uncertainty could flip the decision, every baseline_every calls."""
    c = curve(draft_ms=0.5, verify_growth=0.5)
    kw = dict(prior_alpha=0.6, baseline_every=8, max_baseline_every=32, retime_min_calls=4)
    clear = new_controller(c, **kw)
    assert clear.choose()[1] > 1.5
    seen = _retimings(clear, c, gamma_factor=1.0, base_noise=0.02)
    assert clear.baseline_standard_error() < 0.02
    # 2 after the first speculative timings, 2 more at baseline_every while n_b < 4, then one
    # per max_baseline_every calls.
    assert 5 <= seen.count(0) <= 7, seen
    assert all(g > 0 for g in seen[-30:-2]) or seen[-30:].count(0) <= 1
    # The rule itself: ρ_b from 4 baseline calls of ratio 1.0, 1.0, 1.2, 0.8 (relative standard
    # error 0.0816), 7 speculative calls since the last one: re-time unless the prediction stays
    # above 1 at ρ_b's lower bound (1 - 1.645 · 0.0816 = 0.866), or 32 calls have passed.
    rule = new_controller(c, **kw)
    for ratio in (1.0, 1.0, 1.2, 0.8):
        rule.observe(0, ratio * c.baseline_call_ms(30) / 1e3, 30)
    for _ in range(7):
        rule.observe(2, 0.1, 30, 15)
    assert rule.baseline_standard_error() == pytest.approx(0.0816, abs=1e-3)
    assert not rule.retime_baseline(1.2) and not rule.retime_baseline(1.16)  # 1.16 · 0.866 > 1
    assert rule.retime_baseline(1.14) and rule.retime_baseline(1.05) and rule.retime_baseline(None)
    for _ in range(24):
        rule.observe(2, 0.1, 30, 15)
    assert rule.retime_baseline(3.0)  # 32 calls since: drift
    few = new_controller(c, **kw)
    for ratio in (1.0, 1.0, 1.0):  # fewer than retime_min_calls: not trusted
        few.observe(0, ratio * c.baseline_call_ms(30) / 1e3, 30)
    for _ in range(7):
        few.observe(2, 0.1, 30, 15)
    assert few.baseline_standard_error() is None and few.retime_baseline(3.0)


def test_speculative_correction_is_per_gamma_shrunk_toward_the_pooled_one():
    c = curve(draft_ms=1.0, verify_growth=1.0)
    controller = new_controller(c, prior_alpha=0.6, gamma_prior_calls=4.0)
    assert controller.speculative_correction(2) == 1.0  # nothing timed
    for g, factor, n in ((1, 2.0, 4), (2, 1.0, 12)):
        ms = c.speculative_call_ms(g, 10)
        for _ in range(n):
            controller.observe(g, factor * ms / 1e3, 20, 10)
    pooled = controller.corrections()["speculative"]
    assert 1.0 < pooled < 2.0
    assert controller.speculative_correction(1) == pytest.approx((4 * 2.0 + 4 * pooled) / 8)
    assert controller.speculative_correction(2) == pytest.approx((12 * 1.0 + 4 * pooled) / 16)
    assert controller.speculative_correction(5) == pytest.approx(pooled)  # never timed


def _stats(alpha, num_beta=10):
    return speculative.SpeculativeStats(
        *(jnp.zeros((1,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((1, 2), jnp.int32),
        beta_sum=jnp.array([alpha * num_beta]),
        num_beta=jnp.array([num_beta]),
        num_generated=jnp.zeros((1,), jnp.int32),
        num_proposed=jnp.zeros((1,), jnp.int32),
        log_prob=jnp.zeros((1,), jnp.float32),
    )


def test_alpha_margin_uses_the_measured_spread_of_per_call_alpha():
    """Per-call α spread by 0.05 (summaries at T = 1 spread by 0.07): the margin is sized from it,
    shrunk toward the assumed 0.2 with spread_prior_calls' weight, not from 0.2 alone."""
    controller = new_controller(curve(draft_ms=1.0), spread_prior_calls=4.0)
    alphas = [0.55, 0.65] * 10
    for a in alphas:
        controller.update(_stats(a))
    s2 = np.var(alphas, ddof=1)
    want = np.sqrt((4 * 0.2**2 + 19 * s2) / (4 + 19))
    assert controller.alpha_spread_estimate == pytest.approx(want)
    assert 0.05 < want < 0.1
    assert controller.optimistic_alpha == pytest.approx(0.6 + 1.645 * want / np.sqrt(20))
    # Widely spread α keeps a wide margin; a call without β (all rows done) adds no α sample.
    wide = new_controller(curve(draft_ms=1.0), spread_prior_calls=4.0)
    for a in [0.2, 0.9] * 10:
        wide.update(_stats(a))
    wide.update(_stats(0.0, num_beta=0))
    assert wide.alpha_calls == 20 and wide.alpha_spread_estimate > 0.3


def _explore_world(controller, c, loss, calls=100, tokens=30, alpha=0.6):
    """Each speculative call costs `loss` × the modelled baseline call of its tokens (± 5 %,
    alternating), the baseline call exactly its model; every call's α is `alpha`. Returns the γ
    chosen per call."""
    seen = []
    for i in range(calls):
        g, _ = controller.choose()
        seen.append(g)
        if g == 0:
            controller.observe(0, c.baseline_call_ms(tokens) / 1e3, tokens)
            continue
        iterations = theory.expected_iterations([tokens], alpha, g)[0]  # Section 3.1's model
        controller.update(_stats(alpha))
        noise = 1.05 if i % 2 else 0.95
        ms = noise * loss * c.baseline_call_ms(tokens)
        controller.observe(g, ms / 1e3, tokens, iterations)
    return seen


def test_a_gamma_whose_own_calls_lose_is_refuted_whatever_the_optimism():
    """Optimism on α could explore losing γ for ever; a γ whose own timed calls lose with
    confidence is not chosen again."""
    c = curve(draft_ms=1.0, verify_growth=1.0)
    # A margin that never closes (spread 2.0 trusted over 1e6 calls) and no exploration budget:
    # only refutation ends it.
    kw = dict(alpha_spread=2.0, spread_prior_calls=1e6, baseline_every=0, max_explore_calls=10**9)
    refuting = new_controller(c, **kw)
    seen = _explore_world(refuting, c, loss=1.15)
    explored = [g for g in seen if g > 0]
    assert len(explored) <= 3 * 6 + 2  # each γ: refute_min_calls timed calls, then refuted
    assert seen[-50:] == [0] * 50 and refuting.choose() == (0, 1.0)
    assert all(refuting.refuted(g) for g in set(explored))
    speedup, se = refuting.measured_speedup(explored[0])
    assert speedup == pytest.approx(1 / 1.15, rel=0.03) and 0 < se < 0.05
    blind = new_controller(c, refute_min_calls=10**9, **kw)
    assert sum(g > 0 for g in _explore_world(blind, c, loss=1.15)) > 60
    # Calls that pay are never refuted: speculation stays on.
    paying = new_controller(c, **kw)
    seen = _explore_world(paying, c, loss=0.8)
    assert seen[-50:].count(0) == 0
    assert not any(paying.refuted(g) for g in range(1, 7))
    # Before refute_min_calls timed calls, or before the baseline was timed: no verdict.
    early = new_controller(c, **kw)
    early.observe(2, 0.5, 30, 15)
    early.observe(2, 0.5, 30, 15)
    assert early.measured_speedup(2) is None and not early.refuted(2)


def test_exploration_is_bounded_by_a_budget_of_calls():
    """α̂ a little below break-even with a wide per-call spread keeps the margin open for many
    calls. Exploring spends at most `max_explore_calls` calls; calls chosen at α̂ itself are not
    limited."""
    c = curve(draft_ms=1.0, verify_growth=1.0)
    # A margin that never closes, no refutation and no re-timing while off: only the budget ends
    # the exploring.
    kw = dict(
        alpha_spread=2.0,
        spread_prior_calls=1e6,
        baseline_every=0,
        refute_min_calls=10**9,
        speculate_every=0,
    )
    bounded = new_controller(c, max_explore_calls=12, **kw)
    seen = _explore_world(bounded, c, loss=1.05)
    # The probe, 12 explored calls, and a few γ whose point prediction was still above the margin
    # before their own calls corrected it.
    assert bounded.explore_calls == 12 and sum(g > 0 for g in seen) < 25
    assert seen[-50:] == [0] * 50
    assert bounded.choose() == (0, 1.0) and not bounded.exploring
    unbounded = new_controller(c, max_explore_calls=10**9, **kw)
    assert sum(g > 0 for g in _explore_world(unbounded, c, loss=1.05)) > 60
    never = new_controller(c, max_explore_calls=0, **kw)
    assert sum(g > 0 for g in _explore_world(never, c, loss=1.05)) < 12 and never.explore_calls == 0
    # Calls that pay are chosen at α̂ (not exploring) and go on past the budget.
    paying = new_controller(c, max_explore_calls=3, **kw)
    seen = _explore_world(paying, c, loss=0.8)
    assert sum(g > 0 for g in seen) > 90 and paying.explore_calls <= 3


def test_calibrated_curve_scales_each_gamma_by_its_real_calls():
    """Real loops cost more per draft step than the composed model (γ = 2+ over-predicted by ~10 %
    in every Table-2 row): the median measured / modelled of each γ's real calls rescales it."""
    c = curve(draft_ms=1.0, verify_growth=1.0, gamma_max=3)
    base_ms = c.baseline_call_ms(20)
    calls = {
        0: [(base_ms / 1e3, 20, None)] * 3,  # the baseline as modelled
        1: [(1.0 * c.speculative_call_ms(1, 12) / 1e3, 20, 12)] * 3,
        2: [(f * c.speculative_call_ms(2, 10) / 1e3, 20, 10) for f in (1.2, 1.25, 9.0)],
    }
    cal = cost_curve.calibrated(c, calls)
    assert cal.call_scale[0] == pytest.approx(1.0) and cal.call_scale[1] == pytest.approx(1.0)
    assert cal.call_scale[2] == pytest.approx(1.25)  # the median: one outlier call ignored
    assert 3 not in cal.call_scale and cal.speculative_call_ms(3, 5) == c.speculative_call_ms(3, 5)
    assert cal.speculative_call_ms(2, 10) == pytest.approx(1.25 * c.speculative_call_ms(2, 10))
    for tokens in (20, None):  # per call and steady state alike
        assert cal.predicted_speedup(0.6, 2, tokens) == pytest.approx(
            c.predicted_speedup(0.6, 2, tokens) / 1.25
        )
    # The composed curve preferred γ = 2 at α = 0.6; calibrated, γ = 1 wins.
    assert c.predicted_speedup(0.6, 2, 20) > c.predicted_speedup(0.6, 1, 20)
    assert cal.predicted_speedup(0.6, 1, 20) > cal.predicted_speedup(0.6, 2, 20)
    assert cal.to_dict()["call_scale"]["2"] == pytest.approx(1.25)
    with pytest.raises(ValueError, match="γ in 0..3"):
        cost_curve.calibrated(c, {4: calls[1]})
    with pytest.raises(ValueError, match="iterations >= 1"):
        cost_curve.calibrated(c, {2: [(0.01, 20, None)]})


def test_auto_decoder_calibrates_its_curve_on_real_calls_of_every_gamma(pair, monkeypatch):
    spec_model, params, batch = pair
    settings = {"temperature": 1.0, "topk": 0, "topp": 0.0}
    composed = curve(1.0, gamma_max=2)
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: composed)
    decoder = auto_gamma.AutoGammaDecoder(  # no gate: the controller's probe runs first
        spec_model, params, settings=settings, gamma_max=2, calibration_rounds=2, gate=None
    )
    seen = []
    real_decode = decoder.decode
    monkeypatch.setattr(
        decoder, "decode", lambda g, b, rng: seen.append(g) or real_decode(g, b, rng)
    )
    real_calibration, captured = decoder._calibration_calls, []
    monkeypatch.setattr(
        decoder,
        "_calibration_calls",
        lambda b: captured.append(real_calibration(b)) or captured[-1],
    )
    assert decoder.choose(batch) == (1, None)
    assert sorted(seen) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # warm-up + two rounds of γ = 0, 1, 2
    calls = decoder._calibration_calls(batch)  # the warm-up round is not recorded
    assert {g: len(v) for g, v in calls.items()} == {0: 2, 1: 2, 2: 2}
    scale = decoder.controller.curve.call_scale
    assert sorted(scale) == [0, 1, 2] and all(v > 0 for v in scale.values())
    # The calibration's two baseline calls time the baseline for the controller: no call of the
    # run is spent on it (the probe is followed by a prediction, not by (0, None)).
    # Its speculative calls time each γ for ρ_s the same way (`time_speculative`).
    controller = decoder.controller
    assert controller.timed_calls == {0: 2, 1: 2, 2: 2}
    assert controller.calls == 0 and not controller.history and controller.alpha is None
    assert not controller.measured_ms.get("speculative")  # refutation: the run's calls alone
    assert controller.corrections()["speculative"] == pytest.approx(
        1e3
        * sum(s for g in (1, 2) for s, _, _ in captured[0][g])
        / sum(
            controller.curve.speculative_call_ms(g, n) for g in (1, 2) for _, _, n in captured[0][g]
        ),
        rel=1e-6,
    )
    assert controller.baseline_standard_error() is None  # 2 < retime_min_calls
    assert controller.corrections()["baseline"] == pytest.approx(
        1e3
        * sum(s for s, _, _ in captured[0][0])
        / sum(controller.curve.baseline_call_ms(t) for _, t, _ in captured[0][0]),
        rel=1e-6,
    )
    controller.update(_stats(0.6))
    for _ in range(2):
        controller.observe(1, 0.01, 8, 4)
    controller.choose()
    assert controller.last_choice["reason"] not in ("probe", "time_baseline")
    off = auto_gamma.AutoGammaDecoder(
        spec_model, params, settings=settings, gamma_max=2, calibration_rounds=0
    )
    off.choose(batch)
    assert off.controller.curve is composed
    with pytest.raises(ValueError, match="calibration_rounds"):
        auto_gamma.AutoGammaDecoder(spec_model, params, settings=settings, calibration_rounds=-1)


def test_a_break_even_prediction_does_not_switch_speculation_on():
    """Predicted 1.00-1.04 (inside the model's error) is "off"; above the margin it speculates;
    the optimistic α must clear the same margin to explore."""
    c = curve(draft_ms=2.0, verify_growth=1.0)
    alphas = np.linspace(0.3, 0.9, 601)
    best = [max(new_controller(c, prior_alpha=a).predictions(a).values()) for a in alphas]
    near = float(alphas[np.argmax((np.asarray(best) > 1.01) & (np.asarray(best) < 1.03))])
    paying = float(alphas[np.argmax(np.asarray(best) > 1.08)])
    controller = new_controller(c, prior_alpha=near)
    assert 1.01 < max(controller.predictions(near).values()) < 1.03
    assert controller.choose() == (0, 1.0)
    assert new_controller(c, prior_alpha=near, min_speedup=1.0).choose()[0] > 0
    gamma, predicted = new_controller(c, prior_alpha=paying).choose()
    assert gamma > 0 and predicted > 1.08
    # Exploring: α̂ just below break-even from one call; the optimistic α clears the margin.
    controller = new_controller(c)
    one_call = speculative.SpeculativeStats(
        *(jnp.zeros((1,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((1, 2), jnp.int32),
        beta_sum=jnp.array([10 * near]),
        num_beta=jnp.array([10]),
        num_generated=jnp.zeros((1,), jnp.int32),
        num_proposed=jnp.zeros((1,), jnp.int32),
        log_prob=jnp.zeros((1,), jnp.float32),
    )
    controller.update(one_call)
    assert max(controller.predictions(controller.optimistic_alpha).values()) > 1.04
    assert controller.choose()[0] > 0
    controller.config = dataclasses.replace(controller.config, min_speedup=10.0)  # too high
    assert controller.choose() == (0, 1.0)
    with pytest.raises(ValueError, match="min_speedup"):
        auto_gamma.AutoGammaDecoder(
            None, None, None, settings={}, config=gamma_controller.GammaConfig(min_speedup=0.0)
        )


def test_calibration_smooths_the_per_gamma_scatter_by_a_line_in_gamma():
    """Three or more γ: the per-γ medians are replaced by their least-squares line in γ, so one
    γ's unlucky calls move its scale by part of their deviation and the trend stays."""
    c = curve(draft_ms=1.0, verify_growth=1.0, gamma_max=4)
    medians = {1: 1.10, 2: 1.05, 3: 1.00, 4: 0.80}  # γ = 4's calls ran 0.15 below the trend
    calls = {0: [(c.baseline_call_ms(20) / 1e3, 20, None)] * 3}
    for g, f in medians.items():
        calls[g] = [(f * c.speculative_call_ms(g, 10) / 1e3, 20, 10)] * 3
    cal = cost_curve.calibrated(c, calls)
    slope, intercept = np.polyfit([1, 2, 3, 4], list(medians.values()), 1)
    for g in medians:
        assert cal.call_scale[g] == pytest.approx(intercept + slope * g)
    assert medians[4] < cal.call_scale[4] < 1.0  # pulled toward the trend (~0.95), not to 1
    assert cal.call_scale[1] > cal.call_scale[4]  # the trend itself is kept
    assert cal.call_scale[0] == pytest.approx(1.0)  # the baseline keeps its own median


def _drift_world(controller, c, factor, calls=140, tokens=30, alpha=0.6, spread=0.15):
    """Speculative call i costs factor(i) × its model × (1 ± spread, alternating over the
    speculative calls); the baseline call its model (± 2 %). Returns the γ chosen per call."""
    seen, k = [], 0
    for i in range(calls):
        g, _ = controller.choose()
        seen.append(g)
        if g == 0:
            noise = 1.02 if i % 2 else 0.98
            controller.observe(0, noise * c.baseline_call_ms(tokens) / 1e3, tokens)
            continue
        noise, k = (1 + spread if k % 2 else 1 - spread), k + 1
        iterations = theory.expected_iterations([tokens], alpha, g)[0]  # Section 3.1's model
        controller.update(_stats(alpha))
        ms = noise * factor(i) * c.speculative_call_ms(g, iterations)
        controller.observe(g, ms / 1e3, tokens, iterations)
    return seen


def test_a_gamma_whose_own_calls_pay_is_chosen_below_the_margin():
    """A γ predicted below the margin whose own calls pay at their lower bound is chosen
    whatever the prediction: a measured speed-up has no model error to guard against."""
    c = curve(draft_ms=1.0, verify_growth=0.5)
    # No prediction clears this margin, no exploring, no re-timing: only confirmation can speculate.
    kw = dict(
        prior_alpha=0.6, min_speedup=10.0, max_explore_calls=0, baseline_every=0, speculate_every=0
    )
    iterations = theory.expected_iterations([30], 0.6, 2)[0]

    def controller(speedup, spread, calls=10):
        ctrl = new_controller(c, **kw)
        for i in range(4):
            ctrl.observe(0, (1.02 if i % 2 else 0.98) * c.baseline_call_ms(30) / 1e3, 30)
        for i in range(calls):
            noise = 1 + spread if i % 2 else 1 - spread
            ctrl.observe(2, noise * c.baseline_call_ms(30) / speedup / 1e3, 30, iterations)
        return ctrl

    paying = controller(1.10, 0.05)
    speedup, se = paying.measured_speedup(2)
    assert speedup == pytest.approx(1.10, rel=0.01) and 0 < se < 0.03
    assert paying.confirmed(2) == (speedup, se) and paying.confirmed(3) is None
    gamma, predicted = paying.choose()
    assert gamma == 2 and predicted == paying.predictions(0.6)[2] and predicted < 10.0
    assert paying.last_choice["reason"] == "confirmed"
    # Too noisy to be sure (lower bound below 1), losing, or too few calls: off.
    for ctrl in (controller(1.10, 0.6), controller(0.98, 0.05), controller(1.10, 0.05, calls=2)):
        assert not any(ctrl.confirmed(g) for g in range(1, 7))
        assert ctrl.choose() == (0, 1.0) and ctrl.last_choice["reason"] == "off"
    # Two confirmed γ: the one whose calls paid more.
    both = controller(1.10, 0.05)
    for i in range(10):
        noise = 1.05 if i % 2 else 0.95
        both.observe(3, noise * c.baseline_call_ms(30) / 1.2 / 1e3, 30, iterations)
    assert both.choose()[0] == 3


def test_baseline_timed_before_the_run_skips_the_timing_calls():
    c = curve(draft_ms=1.0, verify_growth=0.5)
    seeded = new_controller(c, prior_alpha=0.6)
    for ratio in (1.0, 1.1):
        seeded.time_baseline(ratio * c.baseline_call_ms(30) / 1e3, 30)
    assert seeded.corrections()["baseline"] == pytest.approx(1.05)
    assert seeded.calls == 0 and seeded.tokens_per_call is None and not seeded.history
    plain = new_controller(c, prior_alpha=0.6)
    for ctrl in (seeded, plain):
        for _ in range(2):
            g = ctrl.choose()[0]
            ctrl.observe(g, 0.5 * c.speculative_call_ms(g, 10) / 1e3, 30, 10)
    assert plain.choose() == (0, None) and plain.last_choice["reason"] == "time_baseline"
    assert seeded.choose()[0] > 0 and seeded.last_choice["reason"] == "best"
    with pytest.raises(ValueError, match="time_baseline needs"):
        seeded.time_baseline(-1.0, 30)


def test_speculation_is_retimed_while_off_and_comes_back_when_the_machine_speeds_up():
    """The VM drifts between slow and fast phases; once off, speculation was never measured
    again. While off near break-even, every speculate_every-th call re-times the best γ."""
    c = curve(draft_ms=1.0, verify_growth=0.5)
    # 40 calls where speculation costs 1.46x its model (about break-even: off), then 100 where it
    # costs 1.27x (γ = 3 pays ~1.15x; 30-token calls, iterations from Section 3.1's model with
    # the last block cut, `_drift_world`).
    phases = lambda i: 1.46 if i < 40 else 1.27  # noqa: E731
    retiming = new_controller(c, speculate_every=8)
    seen = _drift_world(retiming, c, phases)
    assert seen[25:40].count(0) >= 12  # off in the slow phase, a re-timing per 8 calls
    assert sum(g > 0 for g in seen[-50:]) >= 45  # back on in the fast phase
    reasons = [h["reason"] for h in retiming.history]
    assert "retime_speculative" in reasons[20:100]
    never = new_controller(c, speculate_every=0)
    assert _drift_world(never, c, phases)[-100:] == [0] * 100
    # A γ that clearly loses (predicted below retime_min_predicted) is not re-timed.
    losing = new_controller(c, speculate_every=8)
    assert _drift_world(losing, c, lambda i: 1.7)[-100:] == [0] * 100
    # At break-even the re-timings cost one call in speculate_every.
    even = new_controller(c, speculate_every=8)
    assert 10 <= sum(g > 0 for g in _drift_world(even, c, lambda i: 1.5)[40:]) <= 100 // 8 + 1


def test_iterations_correction_is_per_gamma_shrunk_toward_the_pooled_one():
    """On ~10-token outputs EOS cuts γ = 6's blocks more (η 1.2) than γ = 3's (1.0); a pooled η
    from mostly γ = 6 calls would under-predict γ = 3."""
    c = curve(draft_ms=1.0, verify_growth=0.5)
    controller = new_controller(c, prior_alpha=0.6, gamma_prior_calls=4.0)
    assert controller.iterations_correction(3) == 1.0  # nothing timed
    # N: expected iterations of a 20-token call (the i.i.d. model, last block cut).
    n20 = {g: theory.expected_iterations([20], 0.6, g)[0] for g in (3, 6)}
    for g, eta, n in ((6, 1.2, 12), (3, 1.0, 4)):
        for _ in range(n):
            controller.observe(g, 0.03, 20, eta * n20[g])
    pooled = controller.corrections()["iterations"]
    assert pooled == pytest.approx((12 * 1.2 * n20[6] + 4 * n20[3]) / (12 * n20[6] + 4 * n20[3]))
    assert controller.iterations_correction(3) == pytest.approx((4 * 1.0 + 4 * pooled) / 8)
    assert controller.iterations_correction(6) == pytest.approx((12 * 1.2 + 4 * pooled) / 16)
    assert controller.iterations_correction(2) == pytest.approx(pooled)  # never timed
    # The prediction of γ uses its own η: γ = 3's is above what the pooled η would give.
    L = controller.tokens_per_call
    rho = controller.speculative_correction(3)
    base = controller.corrections()["baseline"] * c.baseline_call_ms(L)
    own = base / (rho * c.speculative_call_ms(3, controller.iterations_correction(3) * n20[3]))
    assert L == 20 and controller.predictions(0.6)[3] == pytest.approx(own)
    assert own > base / (rho * c.speculative_call_ms(3, pooled * n20[3]))


def test_predicted_iterations_price_the_last_block_cut_at_eos():
    """Before any correction (η = 1) the prediction counts iterations at the observed lengths
    (`theory.expected_iterations`), not L / Eq. 1: on ~8-token outputs γ = 6's last block is cut
    more than γ = 2's, so a larger γ gains less than Eq. 1 says."""
    c = curve(draft_ms=0.5, verify_growth=0.1)
    controller = new_controller(c, prior_alpha=0.7)
    for tokens in (6, 8, 10):  # baseline calls: L and the lengths, no speculative correction yet
        controller.observe(0, 0.02, tokens)
    for g in (2, 6):
        expected = np.mean([theory.expected_iterations([t], 0.7, g)[0] for t in (6, 8, 10)])
        assert controller.iterations_per_call(0.7, g) == pytest.approx(expected)
        assert expected > 8 / theory.expected_tokens_per_iteration(0.7, g)
    # The cut weighs more at γ = 6 (relative to Eq. 1's count) than at γ = 2.
    excess = {
        g: controller.iterations_per_call(0.7, g) * theory.expected_tokens_per_iteration(0.7, g) / 8
        for g in (2, 6)
    }
    assert excess[6] > excess[2] > 1.0
    predicted = controller.predictions(0.7)
    k = controller.corrections()
    for g in (2, 6):
        iterations = controller.iterations_per_call(0.7, g)
        want = k["baseline"] * c.baseline_call_ms(8) / c.speculative_call_ms(g, iterations)
        assert predicted[g] == pytest.approx(want)
    with pytest.raises(ValueError, match="at least one observed call"):
        new_controller(c).iterations_per_call(0.7, 2)


def test_loop_costs_times_the_real_loops_by_slope(pair):
    spec_model, params, batch = pair
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    enc = batch["encoder_input_tokens"]
    timer = {"draft_step_ms": 0.01}
    costs = loops.loop_costs(
        spec_model, params, spec_model.draft.params, enc, MAX_LEN, 2, settings, timer, repeats=2
    )
    # The tiny random target emits no EOS: units are counted, and where the real EOS leaves too
    # few of them the loops run to a timing EOS the baseline does not emit.
    assert costs["sources"] == 1
    if costs["timing_eos_id"] is None:
        assert costs["decode_steps"] == [2, MAX_LEN]
    else:
        assert costs["decode_steps"] == [MAX_LEN // 4, MAX_LEN]
        assert costs["timing_eos_id"] != spec_model.eos_id
    lo, hi = costs["units"]["baseline"]
    assert (
        lo < hi <= MAX_LEN and costs["units"]["verify_only"][0] < costs["units"]["verify_only"][1]
    )
    assert costs["units"]["speculative"][0] < costs["units"]["speculative"][1] <= MAX_LEN
    assert costs["target_step_ms"] > 0 and costs["verify_cost_ratio"] > 0 and costs["c"] >= 0
    assert costs["draft_step_ms"] >= 0 and costs["iteration_ms"] > 0
    # Theorem 3.8 with (c, verify) is E T(1) / iteration: the verify call is capped at it.
    assert costs["verify_step_ms"] <= costs["iteration_ms"]
    if not costs["verify_capped"]:
        assert costs["verify_step_ms"] == costs["verify_only_ms"]
    assert costs["c_alone"] == pytest.approx(0.01 / costs["target_step_ms"])
    assert costs["step_timer"] == timer
    # Several sources of one shape are pooled: units add up over them.
    two = loops.loop_costs(
        spec_model, params, spec_model.draft.params, [enc, enc], MAX_LEN, 2, settings, repeats=2
    )
    assert two["sources"] == 2 and "c_alone" not in two
    if two["timing_eos_id"] == costs["timing_eos_id"]:
        assert two["units"]["baseline"] == [2 * u for u in costs["units"]["baseline"]]
    with pytest.raises(ValueError, match="one shape"):
        loops.loop_costs(
            spec_model, params, spec_model.draft.params, [enc, enc[:, :-1]], MAX_LEN, 2, settings
        )
    with pytest.raises(ValueError, match="gamma >= 1"):
        loops.loop_costs(spec_model, params, spec_model.draft.params, enc, MAX_LEN, 0, settings)


def test_calibration_calls_time_speculation_so_two_slow_first_calls_do_not_switch_it_off():
    """The calibration times the baseline at its model; then the probe and one γ = 2 call run
    slow (1.55x their model, a slow phase of the machine) with a low α. Without the
    calibration's speculative calls in ρ_s those two calls switch speculation off for the rest
    of the run; counted toward ρ_s as its baseline calls count toward ρ_b, they no longer do."""
    c = curve(draft_ms=1.0, verify_growth=0.5)
    tokens, alpha = 30, 0.6

    def run(calibrated_speculation: bool):
        ctrl = new_controller(c)
        for _ in range(4):  # the calibration: every γ at its model, on the first batch
            ctrl.time_baseline(c.baseline_call_ms(tokens) / 1e3, tokens)
            if calibrated_speculation:
                for g in range(1, c.gamma_max + 1):
                    n = theory.expected_iterations([tokens], alpha, g)[0]
                    ctrl.time_speculative(g, c.speculative_call_ms(g, n) / 1e3, tokens, n)
        seen = []
        for i in range(100):
            g, _ = ctrl.choose()
            seen.append(g)
            if g == 0:
                ctrl.observe(0, c.baseline_call_ms(tokens) / 1e3, tokens)
                continue
            a = 0.3 if i < 2 else alpha  # two unlucky first calls ...
            n = theory.expected_iterations([tokens], a, g)[0]
            ctrl.update(_stats(a))
            slow = 1.55 if i < 2 else 1.0  # ... in a slow phase
            ctrl.observe(g, slow * c.speculative_call_ms(g, n) / 1e3, tokens, n)
        return ctrl, seen

    before, seen = run(calibrated_speculation=False)
    assert seen[:2] == [1, 1] or seen[0] == 1
    assert seen[10:] == [0] * 90  # the failure: off for good
    after, seen = run(calibrated_speculation=True)
    assert sum(g > 0 for g in seen[10:]) >= 80  # speculation comes back and stays
    # The calibration's calls count toward ρ_s and γ's timed calls, not toward α, L or history.
    fresh = new_controller(c)
    fresh.time_speculative(2, 0.05, tokens, 12)
    assert fresh.timed_calls == {2: 1} and fresh.alpha is None and fresh.calls == 0
    assert fresh.calibration_ms[2] == pytest.approx((50.0, c.speculative_call_ms(2, 12)))
    assert not fresh.measured_ms and not fresh.modelled_ms and not fresh.history
    fresh.time_speculative(3, 0.05, tokens, 10)
    fresh.time_baseline(c.baseline_call_ms(tokens) / 1e3, tokens)
    fresh.time_baseline(c.baseline_call_ms(tokens) / 1e3, tokens)
    pooled = 100.0 / (c.speculative_call_ms(2, 12) + c.speculative_call_ms(3, 10))
    assert fresh.corrections()["speculative"] == pytest.approx(pooled)  # ρ_s from them alone
    # Refutation and confirmation rest on the run's own calls: the calibration's ms is not in them.
    for _ in range(3):
        fresh.observe(2, 0.02, tokens, 12)
    speedup, _ = fresh.measured_speedup(2)
    assert speedup == pytest.approx(c.baseline_call_ms(tokens) / 20.0)
    for bad in ((0, 0.05, tokens, 12), (2, -1.0, tokens, 12), (2, 0.05, 0, 12), (2, 0.05, 9, 0)):
        with pytest.raises(ValueError, match="time_speculative needs"):
            fresh.time_speculative(*bad)
