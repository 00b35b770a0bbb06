"""Auto γ among token trees: trees timed on their own calls, chosen only when measured faster."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, perturbed, tiny_spec_pair

from specdec_t5x import drafts, models, sampling, speculative, theory, tree
from specdec_t5x.auto import auto_gamma, auto_trees, gamma_controller
from specdec_t5x.auto import row as auto_row
from specdec_t5x.eval import config, job, summary, tables
from specdec_t5x.timing import cost_curve

L = 20  # tokens of every simulated call's longest row
ALPHA = 0.6


def curve(draft_ms=1.0, verify_growth=1.0, gamma_max=4):
    """Synthetic curve: T(1) = 10 ms, T(k) grows by `verify_growth` ms per extra token."""
    return cost_curve.CostCurve(
        block_step_ms={k: 10.0 + verify_growth * (k - 1) for k in range(1, gamma_max + 2)},
        draft_step_ms=draft_ms,
        baseline_sampling_ms=0.0,
        sampling_ms={g: 0.0 for g in range(1, gamma_max + 1)},
    )


def chain_stats(alpha=ALPHA, num_beta=10):
    return speculative.SpeculativeStats(
        *(jnp.zeros((1,), jnp.int32) for _ in range(3)),
        accept_histogram=jnp.zeros((1, 2), jnp.int32),
        beta_sum=jnp.array([alpha * num_beta]),
        num_beta=jnp.array([num_beta]),
        num_generated=jnp.zeros((1,), jnp.int32),
        num_proposed=jnp.zeros((1,), jnp.int32),
        log_prob=jnp.zeros((1,), jnp.float32),
    )


def timed_controller(c, baseline_ratio=1.0, **knobs):
    """A `GammaController` as after a calibration: α known, the baseline timed 4 times at
    `baseline_ratio` × its modelled time."""
    config = gamma_controller.GammaConfig(**knobs)
    controller = gamma_controller.GammaController(c, ALPHA, config)
    for _ in range(4):
        controller.time_baseline(baseline_ratio * c.baseline_call_ms(L) / 1e3, L)
    return controller


def timed_chooser(c, tree_speedups, baseline_ratio=1.0, **knobs):
    """A `TreeChooser` on `timed_controller`, each tree timed 4 times at the baseline's modelled
    time / `tree_speedups[shape]`."""
    controller = timed_controller(c, baseline_ratio, **knobs)
    chooser = auto_trees.TreeChooser(controller, tuple(tree_speedups))
    for shape, speedup in tree_speedups.items():
        for _ in range(4):
            chooser.time_tree(shape, c.baseline_call_ms(L) / speedup / 1e3, L)
    return chooser


def simulate(chooser, tree_speedups, calls=40, controller=None):
    """Runs `calls` choices of `chooser` (None: of `controller` alone, no trees); each call takes
    its model's time (a tree: the baseline's modelled time / `tree_speedups[shape]`). Returns
    [(plan, reason)]."""
    controller = chooser.controller if chooser is not None else controller
    c = controller.curve
    out = []
    for _ in range(calls):
        plan, _ = (chooser or controller).choose()
        out.append((plan, controller.last_choice["reason"]))
        if isinstance(plan, tuple):
            chooser.observe(plan, c.baseline_call_ms(L) / tree_speedups[plan] / 1e3, L, 5)
        elif plan == 0:
            controller.observe(0, c.baseline_call_ms(L) / 1e3, L)
        else:
            controller.update(chain_stats())
            n = max(1, round(float(theory.expected_iterations([L], ALPHA, plan)[0])))
            controller.observe(plan, c.speculative_call_ms(plan, n) / 1e3, L, n)
    return out


def best_chain(c):
    """The chains' predicted speed-up once the run's calls are observed (L, η, ρ_s learnt)."""
    controller = timed_controller(c)
    simulate(None, {}, calls=6, controller=controller)
    predicted = controller.history[-1]["predicted"]
    assert predicted == pytest.approx(max(controller.predictions(ALPHA).values()))
    return predicted


def test_measured_speedup_is_the_baselines_time_over_the_trees_own_calls():
    c = curve()
    chooser = timed_chooser(c, {(2, 2): 2.0}, baseline_ratio=1.25)
    # ρ_b = 1.25: the baseline really takes 1.25× its model, so the tree's speed-up is 1.25 × 2.
    assert chooser.measured_speedup((2, 2)) == pytest.approx(2.5)
    chooser.time_tree((2, 2), 2 * c.baseline_call_ms(40) / 1e3, 40)  # a slow long call: 0.5×
    base = 4 * c.baseline_call_ms(L) + c.baseline_call_ms(40)
    wall = 4 * c.baseline_call_ms(L) / 2.0 + 2 * c.baseline_call_ms(40)
    assert chooser.measured_speedup((2, 2)) == pytest.approx(1.25 * base / wall)
    assert chooser.best_tree() == ((2, 2), pytest.approx(1.25 * base / wall))
    untimed = auto_trees.TreeChooser(chooser.controller, ((3, 1),))
    assert untimed.measured_speedup((3, 1)) is None and untimed.best_tree() is None


def test_a_tree_is_chosen_when_measured_faster_than_the_best_chain():
    c = curve()
    fast = {(2, 2): 1.5 * best_chain(c), (3, 2, 1): 1.2 * best_chain(c)}
    calls = simulate(timed_chooser(c, fast), fast)
    reasons = [r for _, r in calls]
    trees = [p for p, r in calls if r == "tree"]
    assert len(trees) >= 30 and set(trees) == {(2, 2)}  # the faster of the two
    # The rest are measurements: the chain re-timed every speculate_every-th call (its α and ρ_s
    # stay current) and the baseline re-timed.
    assert set(reasons) <= {"tree", "retime_speculative", "retime_baseline"}
    assert "retime_speculative" in reasons
    # The controller's history names the tree calls; they count toward L, not toward α or ρ_s.
    chooser = timed_chooser(c, fast)
    simulate(chooser, fast, calls=3)
    assert [h["gamma"] for h in chooser.controller.history] == ["tree(2,2)"] * 3
    assert chooser.controller.calls == 3 and chooser.controller.beta_calls == 0
    assert 0 not in chooser.terms and chooser.terms[(2, 2)][0] == 4 + 3


def test_a_tree_is_never_chosen_when_measured_slower():
    c = curve()
    chains = best_chain(c)
    for speedup in (0.5, 0.9 * chains, chains, 1.01 * chains):  # 1.01: inside tree_margin
        slow = {(2, 2): speedup}
        calls = simulate(timed_chooser(c, slow), slow)
        assert all(not isinstance(p, tuple) for p, _ in calls), speedup
        # ... and the choices are the controller's own, as without trees.
        alone = timed_controller(c)
        assert calls == simulate(None, {}, controller=alone)


def test_when_off_a_tree_must_beat_the_baseline_itself():
    slow_draft = curve(draft_ms=10.0, verify_growth=3.0)  # no chain pays
    assert best_chain(slow_draft) == 1.0  # off: the baseline itself
    losing = {(2, 2): 0.95}
    calls = simulate(timed_chooser(slow_draft, losing), losing)
    assert {p for p, _ in calls} == {0}
    paying = {(2, 2): 1.3}
    calls = simulate(timed_chooser(slow_draft, paying), paying)
    assert sum(p == (2, 2) for p, _ in calls) >= 30


def test_a_tree_timed_too_fast_is_dropped_once_its_own_calls_say_so():
    c = curve()
    chains = best_chain(c)
    chooser = timed_chooser(c, {(2, 2): 2.0 * chains})  # calibration: twice the chains' speed
    really = {(2, 2): 0.7 * chains}  # every call of the run: slower than the chains
    calls = simulate(chooser, really, calls=60)
    plans = [p for p, _ in calls]
    assert plans[0] == (2, 2)
    assert all(not isinstance(p, tuple) for p in plans[-20:])


def test_plan_names_and_bad_input():
    assert [auto_trees.plan_name(p) for p in (0, 3, (3, 2, 1), [2, 2], "tree(2,2)")] == [
        "0",
        "3",
        "tree(3,2,1)",
        "tree(2,2)",
        "tree(2,2)",
    ]
    assert config.SpeculationConfig("auto", trees=[(3, 2, 1)]).tree_rows == {
        auto_trees.plan_name((3, 2, 1)): (3, 2, 1)
    }  # the auto row's names are the tree rows'
    for bad in (-1, True, (), (2, "a"), 1.5):
        with pytest.raises(ValueError, match="auto plan"):
            auto_trees.plan_name(bad)
    controller = gamma_controller.GammaController(curve(), ALPHA)
    with pytest.raises(ValueError, match="at least one tree"):
        auto_trees.TreeChooser(controller, ())
    chooser = auto_trees.TreeChooser(controller, ((2, 2),))
    with pytest.raises(ValueError, match="unknown tree"):
        chooser.time_tree((3, 1), 0.01, 5)
    with pytest.raises(ValueError, match="longest_tokens >= 1"):
        chooser.time_tree((2, 2), 0.01, 0)
    with pytest.raises(ValueError, match="tree_margin"):
        gamma_controller.GammaConfig(tree_margin=0.0)
    with pytest.raises(ValueError, match="AUTO_TREES.*needs tree shapes"):
        config.SpeculationConfig("auto", auto_trees=True)
    with pytest.raises(ValueError, match="AUTO_TREES"):
        config.SpeculationConfig("auto", trees=[(2, 2)], auto_trees="yes")


def test_summarise_auto_names_the_trees_and_takes_alpha_from_chains_only():
    chain = speculative.SpeculativeStats(
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
    trees = tree.TreeStats(
        num_iterations=np.array([2]),
        num_draft_tokens=np.array([4]),
        num_accepted=np.array([4]),
        accept_histogram=np.array([[0, 0, 2]]),
        beta_sum=np.array([4.0]),  # a tree's β: not the chains' α
        num_beta=np.array([4]),
        num_generated=np.array([6]),
        num_proposed=np.array([12]),
        depth_tested=np.array([[2, 2]]),
        depth_accepted=np.array([[2, 2]]),
        rank_tested=np.array([[[2, 0], [2, 0]]]),
        rank_accepted=np.array([[[2, 0], [2, 0]]]),
        node_accepted=np.array([[2, 2, 0, 2, 0, 0, 0]]),
    )
    row = auto_row.summarise_auto(
        [1.0] * 4,
        [0.5, 0.5, 1.0, 1.0],
        [chain, trees, None, None],
        [2, (3, 2, 1), 0, "0"],
        [1.2, 1.6, None, 1.0],
    )
    assert row["gamma_chosen"] == {"0": 2, "2": 1, "tree(3,2,1)": 1}
    assert row["alpha_display"] == "0.50"  # the chain's 3 / 6
    assert row["tokens_per_iteration"] == pytest.approx(16 / 6)  # chains and trees
    assert row["baseline_timing_examples"] == 1 and row["probe_examples"] == 0
    assert tables.auto_choices(row) == "off×1, baseline timing×1, 2×1, tree(3,2,1)×1"


# ---------------------------------------------------------------------------------------------
# The decoder on a tiny pair: every plan greedy-exact; trees chosen on a fake clock.

BATCH, ENC_LEN, MAX_LEN = 2, 7, 10
GREEDY = {"temperature": 0.0, "topk": 0, "topp": 0.0}


@pytest.fixture(scope="module")
def pair(tiny_target):
    module, params = tiny_target
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 1))
    batch = {
        "encoder_input_tokens": encoder_inputs(BATCH, ENC_LEN, [7, 4]),
        "decoder_input_tokens": jnp.zeros((BATCH, MAX_LEN), jnp.int32),
    }
    return models.SpeculativeEncoderDecoderModel(module, draft), params, batch


def clocked(decoder, seconds_of, seen):
    """Puts a fake clock on `decoder`: each `decode` of a plan advances it by seconds_of(plan);
    every call's (plan, decodes) is appended to `seen`."""
    now = [0.0]
    real_decode = decoder.decode

    def decode(plan, batch, rng):
        out = real_decode(plan, batch, rng)
        seen.append((plan, np.asarray(out[0])))
        now[0] += seconds_of(plan)
        return out

    decoder.decode = decode
    decoder.clock = lambda: now[0]
    return decoder


MS = 2.0**-10  # about a millisecond; the fake clock's sums of its multiples are exact


def chain_seconds(plan):
    return {0: 20 * MS, 1: 16 * MS, 2: 15 * MS}[plan]


def run(decoder, batch, calls):
    choices = []
    for i in range(calls):
        _, aux = decoder(batch, jax.random.PRNGKey(i))
        choices.append((auto_trees.plan_name(aux["gamma"]), aux["predicted_speedup"]))
    return choices


def test_auto_with_trees_in_argmax_mode_equals_greedy_and_runs_the_faster_tree(pair, monkeypatch):
    spec_model, params, batch = pair
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: curve(gamma_max=2))
    want = models.EncoderDecoderModel(spec_model.module).predict_batch_with_aux(
        params, batch, decoder_params=GREEDY
    )[0]
    seen = []
    tree_seconds = {(2, 2): 6 * MS, (3, 1): 9 * MS}  # faster than every chain
    decoder = auto_gamma.AutoGammaDecoder(
        spec_model,
        params,
        settings=GREEDY,
        gamma_max=2,
        calibration_rounds=2,
        trees=((2, 2), [3, 1]),
        gate=None,  # the chooser's own choices (the gate: test_speculation_gate)
    )
    assert decoder.plans == [0, 1, 2, (2, 2), (3, 1)]
    clocked(decoder, lambda p: tree_seconds.get(p) or chain_seconds(p), seen)
    choices = run(decoder, batch, 6)
    # Calibration: the warm-up and two rounds of every plan, trees included.
    calibration = [p for p, _ in seen[: 3 * len(decoder.plans)]]
    assert sorted(map(auto_trees.plan_name, calibration)) == sorted(
        3 * ["0", "1", "2", "tree(2,2)", "tree(3,1)"]
    )
    assert decoder.chooser.terms[(2, 2)][0] == 2 + sum(c == "tree(2,2)" for c, _ in choices)
    assert all(np.array_equal(decodes, want) for _, decodes in seen)  # every plan is exact
    names = [c for c, _ in choices]
    assert names[0] == "1"  # the probe measures α first
    assert names.count("tree(2,2)") >= 4 and "tree(3,1)" not in names
    assert all(p > 1.0 for c, p in choices if c.startswith("tree"))
    measured = decoder.tree_speedups()
    assert sorted(measured) == ["tree(2,2)", "tree(3,1)"] and measured["tree(2,2)"] > 1.0
    with pytest.raises(ValueError, match="calibration"):
        auto_gamma.AutoGammaDecoder(
            spec_model, params, settings=GREEDY, trees=((2, 2),), calibration_rounds=0
        )
    with pytest.raises(ValueError, match="tree_rule"):
        auto_gamma.AutoGammaDecoder(spec_model, params, settings=GREEDY, tree_rule="nope")
    with pytest.raises(ValueError, match="branching"):
        auto_gamma.AutoGammaDecoder(spec_model, params, settings=GREEDY, trees=((0, 2),))


def test_slow_trees_leave_the_chain_choices_as_without_trees(pair, monkeypatch):
    spec_model, params, batch = pair
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: curve(gamma_max=1))
    runs = {}
    for trees in ((), ((2, 2),)):
        seen = []
        decoder = auto_gamma.AutoGammaDecoder(
            spec_model,
            params,
            settings=GREEDY,
            gamma_max=1,
            calibration_rounds=1,
            trees=trees,
            gate=None,
        )
        clocked(decoder, lambda p: 50 * MS if isinstance(p, tuple) else chain_seconds(p), seen)
        runs[trees] = (run(decoder, batch, 10), decoder.controller)
        assert (decoder.chooser is None) == (not trees)
    (alone, alone_controller), (with_trees, controller) = runs.values()
    assert with_trees == alone and not any(c.startswith("tree") for c, _ in with_trees)
    assert controller.history == alone_controller.history
    assert controller.timed_calls == alone_controller.timed_calls


@pytest.mark.slow
def test_eval_job_reports_auto_tree_choices_by_name(data_dir, tmp_path, monkeypatch):
    """AUTO_TREES wiring of the eval job: with the tree's measured speed-up forced high (the
    choice itself is tested above), the auto row names it and stays exact at T = 0."""
    # 3 calls: the chooser's own choices, after the full calibration (no gate, not a short run).
    monkeypatch.setattr(auto_gamma, "DEFAULT_GATE", None)
    monkeypatch.setattr(auto_gamma, "SHORT_RUN_CALLS", 0)
    monkeypatch.setattr(auto_gamma, "CALIBRATION_SHARE", 1e9)
    real_best = auto_trees.TreeChooser.best_tree
    monkeypatch.setattr(
        auto_trees.TreeChooser,
        "best_tree",
        lambda self: None if (b := real_best(self)) is None else (b[0], 100.0),
    )
    spec_model, params = tiny_spec_pair()
    out = tmp_path / "out"
    metrics = job.evaluate(
        spec_model,
        params,
        str(out),
        data=config.DataConfig("ddtp_ende", "test", 3, 1, 32, 12),
        speculation=config.SpeculationConfig(
            1, ["auto"], 1, "draft", [(2, 2)], "without_replacement", auto_trees=True
        ),
        sampling_settings=sampling.SamplingSettings(0.0, 0, 0.0),
        measure=config.MeasureConfig(0, 2, False, False),
    )
    auto = summary.flat(metrics)["auto"]
    assert auto["gamma_chosen"] == {"1": 1, "tree(2,2)": 2}  # the probe, then the tree
    assert [c["gamma"] for c in auto["calls"]] == [1, "tree(2,2)", "tree(2,2)"]
    assert auto["identical_fraction"] == 1.0 and set(auto["tree_measured_speedup"]) == {"tree(2,2)"}
    assert "auto (1×1, tree(2,2)×2)" in (out / "table_row.md").read_text()
