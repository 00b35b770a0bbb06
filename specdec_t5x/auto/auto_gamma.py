"""`gamma='auto'`: speculative decoding with γ chosen before every call, 0 = plain decoding.

`AutoGammaDecoder` is the Python API of `gamma='auto'`: it measures the cost curve on the first
batch (`cost_curve.measure_cost_curve`), calibrates it with real calls of every γ, keeps one
jitted decoder per γ (γ = 0: the baseline) and asks a `gamma_controller.GammaController` for γ
before every call (γ is static under `jit`, so the choice is made outside it). With token trees
among the plans, `auto_trees.TreeChooser` runs a tree instead when its measured speed-up beats
the chains'. `summarise_auto` and `bootstrap_interval` make the eval job's row of such a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import models, steps
from specdec_t5x import tree as tree_lib
from specdec_t5x.auto import auto_trees, gamma_controller
from specdec_t5x.timing import cost_curve

Array = jax.Array


def call_counts(decodes, aux: Mapping[str, Any] | None = None) -> tuple[int, int | None]:
    """(longest row's generated tokens, counted iterations or None) of one decode call.

    Args:
      decodes: int32 [batch, max_decode_len], 0 = padding after EOS.
      aux: the call's aux; its 'stats' (`SpeculativeStats`) give the iterations (max over rows).
    """
    longest = int(np.max(np.count_nonzero(np.asarray(decodes), axis=-1), initial=0))
    stats = (aux or {}).get("stats")
    iterations = None if stats is None else int(np.max(np.asarray(stats.num_iterations)))
    return max(longest, 1), iterations


class AutoGammaDecoder:
    """`gamma='auto'`: speculative decoding with γ chosen per call, 0 = the baseline alone.

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel` (target + draft).
      target_params, draft_params: parameters (draft default: `spec_model.draft.params`).
      settings: {'temperature', 'topk', 'topp'} for both decoders.
      gamma_max: largest γ considered (>= 1).
      verification, draft_confidence_threshold: passed to `speculative.speculative_sample`.
      prior_alpha: α before the first call (None: the first call probes with γ = 1).
      cost_repeats: timing rounds of the cost curve.
      calibration_rounds: rounds of real decode calls of every γ in 0..gamma_max on the first
        batch (interleaved, after compiling each γ), whose measured / modelled times calibrate
        the curve per γ (`cost_curve.calibrated`); 0: the composed curve alone.
      curve: a `CostCurve` to use instead of measuring one on the first batch (not calibrated).
      config: the controller's tuning knobs (`gamma_controller.GammaConfig`; None: defaults).
      baseline_sampler: the γ = 0 decoder's draw (`decoding.SAMPLERS`; the eval job passes its
        fair baseline's at T > 0).
      trees: token trees also considered, each its per-depth branching factors (e.g. ((2, 2),
        (3, 2, 1))) or child-rank paths (`tree.parse_tree`): calibrated with the chains, timed on their own calls and
        chosen when measured faster than the chains (`auto_trees.TreeChooser`). Empty: chains
        only, exactly as without this argument.
      tree_rule: the trees' acceptance rule at T > 0 (`tree.TREE_RULES`).
      clock: wall-clock seconds (None: `time.perf_counter`; tests inject a fake one to set
        timings).

    Raises:
      ValueError: gamma_max < 1 or calibration_rounds < 0 (or not ints); a bad tree shape or
        rule; trees with calibration_rounds = 0 or a given curve (a tree is only ever timed by
        its own calls, the first ones in the calibration).

    A plan is γ (an int, 0 = off) or a tree shape (a tuple). Use `decoder(batch, rng)`, or, to
    keep compilation out of a timed region, `choose()`, `compile(plan, batch)`, then the timed
    `decode(plan, batch, rng)`, `update(aux)` and `observe(plan, ...)`.
    """

    def __init__(
        self,
        spec_model,
        target_params,
        draft_params=None,
        *,
        settings: Mapping[str, Any],
        gamma_max: int = 8,
        verification: str = "token",
        draft_confidence_threshold: float = 0.0,
        prior_alpha: float | None = None,
        cost_repeats: int = 20,
        calibration_rounds: int = 4,
        curve: cost_curve.CostCurve | None = None,
        config: gamma_controller.GammaConfig | None = None,
        baseline_sampler: str = "t5x",
        trees: Sequence[Sequence[int]] = (),
        tree_rule: str = "without_replacement",
        clock: Callable[[], float] | None = None,
    ):
        if not isinstance(gamma_max, int) or gamma_max < 1:
            raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
        if not isinstance(calibration_rounds, int) or calibration_rounds < 0:
            raise ValueError(f"calibration_rounds must be an int >= 0; got {calibration_rounds!r}.")
        self.trees = tuple(tree_lib.parse_tree(s).spec for s in trees or ())
        if self.trees and (not calibration_rounds or curve is not None):
            raise ValueError(
                f"trees {self.trees} need the calibration (calibration_rounds >= 1, no given "
                f"curve): their only timings are their own calls; got calibration_rounds="
                f"{calibration_rounds}, curve {'given' if curve is not None else 'None'}."
            )
        if tree_rule not in tree_lib.TREE_RULES:
            raise ValueError(f"tree_rule must be one of {tree_lib.TREE_RULES}; got {tree_rule!r}.")
        self.tree_rule, self.clock = tree_rule, clock
        self.chooser: auto_trees.TreeChooser | None = None
        self.calibration_rounds = calibration_rounds
        self.config = gamma_controller.GammaConfig() if config is None else config
        self.spec_model, self.target_params = spec_model, target_params
        self.draft_params = spec_model.draft.params if draft_params is None else draft_params
        self.settings = dict(settings)
        self.gamma_max, self.verification = gamma_max, verification
        self.threshold, self.prior_alpha = draft_confidence_threshold, prior_alpha
        self.cost_repeats = cost_repeats
        self.controller = None if curve is None else self._controller(curve)
        self._fns: dict[Any, Any] = {}
        self._compiled: set[tuple] = set()
        self.baseline_sampler = baseline_sampler
        self._baseline = models.EncoderDecoderModel(
            spec_model.module,
            cpu_weight_dtype=getattr(spec_model, "cpu_weight_dtype", "float32"),
            sampler=baseline_sampler,
        )

    def _controller(self, curve: cost_curve.CostCurve) -> gamma_controller.GammaController:
        controller = gamma_controller.GammaController(curve, self.prior_alpha, self.config)
        if self.trees:
            self.chooser = auto_trees.TreeChooser(controller, self.trees)
        return controller

    def _now(self) -> float:
        return time.perf_counter() if self.clock is None else self.clock()

    @property
    def plans(self) -> list:
        """The candidate plans: γ = 0..gamma_max, then the tree shapes."""
        return [*range(self.gamma_max + 1), *self.trees]

    def tree_speedups(self) -> dict[str, float | None]:
        """{tree name: its measured speed-up so far (`auto_trees.TreeChooser.measured_speedup`;
        None before it was timed)}; {} without trees."""
        if self.chooser is None:
            return {}
        return {auto_trees.plan_name(s): self.chooser.measured_speedup(s) for s in self.trees}

    def _fn(self, gamma):
        if gamma not in self._fns:
            if isinstance(gamma, tuple):  # a tree: one target call verifies all its nodes
                params = {**self.settings, "tree": gamma, "tree_rule": self.tree_rule}
                self._fns[gamma] = jax.jit(
                    lambda tp, dp, b, rng: self.spec_model.predict_batch_with_aux(
                        tp, b, rng, decoder_params=params, draft_params=dp
                    )
                )
            elif gamma == 0:
                params = dict(self.settings)
                fn = jax.jit(
                    lambda tp, b, rng: (
                        self._baseline.predict_batch_with_aux(tp, b, rng, decoder_params=params)[0],
                        {},
                    )
                )
                # The draft's parameters are not passed to the baseline's jitted function (each
                # argument leaf costs dispatch time in every call).
                self._fns[0] = lambda tp, dp, b, rng: fn(tp, b, rng)
            else:
                params = {
                    **self.settings,
                    "gamma": gamma,
                    "verification": self.verification,
                    "draft_confidence_threshold": self.threshold,
                }
                self._fns[gamma] = jax.jit(
                    lambda tp, dp, b, rng: self.spec_model.predict_batch_with_aux(
                        tp, b, rng, decoder_params=params, draft_params=dp
                    )
                )
        return self._fns[gamma]

    def choose(self, batch: Mapping[str, Array]) -> tuple[int | tuple[int, ...], float | None]:
        """(plan, predicted speedup) for the next call: γ, or a tree shape with its measured
        speed-up (`auto_trees.TreeChooser.choose`); measures the cost curve on the first batch."""
        if self.controller is None:
            curve = cost_curve.measure_cost_curve(
                self.spec_model,
                self.target_params,
                self.draft_params,
                batch["encoder_input_tokens"],
                batch["decoder_input_tokens"].shape[1],
                self.gamma_max,
                self.settings,
                self.verification,
                self.cost_repeats,
                baseline_sampler=self.baseline_sampler,
            )
            calls = self._calibration_calls(batch) if self.calibration_rounds else {}
            if calls:  # the trees have no modelled call to calibrate
                chains = {g: v for g, v in calls.items() if isinstance(g, int)}
                curve = cost_curve.calibrated(curve, chains)
            self.controller = self._controller(curve)
            # The calibration's baseline calls are real timed calls: they time the baseline, so
            # the run itself spends no call on that (each would cost the speed-up it forgoes).
            for seconds, longest, _ in calls.get(0, []):
                self.controller.time_baseline(seconds, longest)
            # ... and its speculative calls time each γ the same way (ρ_s), so that ρ_s and ρ_b
            # start from calls of the same moment (see `gamma_controller.GammaController.time_speculative`).
            for gamma in sorted(g for g in calls if isinstance(g, int) and g > 0):
                for seconds, longest, iterations in calls[gamma]:
                    self.controller.time_speculative(gamma, seconds, longest, iterations)
            for shape in self.trees:  # a tree's calibration calls start its measured speed-up
                for seconds, longest, _ in calls.get(shape, []):
                    self.chooser.time_tree(shape, seconds, longest)
        if self.chooser is not None:
            return self.chooser.choose()
        return self.controller.choose()

    def _calibration_calls(self, batch: Mapping[str, Array]) -> dict[Any, list]:
        """{plan: [(seconds, longest tokens, iterations)]}: `calibration_rounds` rounds of every
        plan (γ in 0..gamma_max, then the trees) decoding `batch` after one discarded warm-up
        round, each round in a seeded random order (drift hits all plans)."""
        plans = self.plans
        for plan in plans:
            self.compile(plan, batch)
        calls: dict[Any, list] = {p: [] for p in plans}
        order = np.random.default_rng(0)
        # Round -1 is a discarded warm-up: the first calls after compiling run well above their
        # later time while the executables take turns.
        for r in range(-1, self.calibration_rounds):
            rng = jax.random.PRNGKey(max(r, 0))
            for i in order.permutation(len(plans)):
                plan = plans[int(i)]
                start = self._now()
                decodes, aux = jax.block_until_ready(self.decode(plan, batch, rng))
                seconds = self._now() - start
                if r >= 0:
                    calls[plan].append((seconds, *call_counts(decodes, aux)))
        return calls

    def compile(self, gamma, batch: Mapping[str, Array]) -> None:
        """Compiles (and runs once) the decoder of a plan (γ or tree shape) for this batch shape,
        if not done yet; with encoder length buckets once per bucket (`steps.warmup_sources`)."""
        key = (gamma, *(tuple(v.shape) for v in batch.values()))
        if key not in self._compiled:
            rng = jax.random.PRNGKey(0)
            enc = batch["encoder_input_tokens"]
            for warm in steps.warmup_sources(self.target_params, enc):
                jax.block_until_ready(
                    self._fn(gamma)(
                        self.target_params,
                        self.draft_params,
                        {**batch, "encoder_input_tokens": warm},
                        rng,
                    )
                )
            self._compiled.add(key)

    def decode(self, gamma, batch: Mapping[str, Array], rng: Array):
        """(decodes int32 [batch, max_decode_len], aux) with a plan: γ (0: the baseline, aux =
        {}) or a tree shape (aux['stats']: `tree.TreeStats`)."""
        return self._fn(gamma)(self.target_params, self.draft_params, batch, rng)

    def update(self, aux: Mapping[str, Any]) -> None:
        """Feeds a chain call's β into the running α (no-op for γ = 0 and for a tree: a tree's β
        is measured at several children per depth, not Section 3.1's α)."""
        if "stats" in aux and not isinstance(aux["stats"], tree_lib.TreeStats):
            self.controller.update(aux["stats"])

    def observe(
        self, gamma, seconds: float, decodes: Array, aux: Mapping[str, Any] | None = None
    ) -> None:
        """Feeds a timed call of a plan (γ or tree shape) to the controller (a tree's to the
        `TreeChooser`): wall-clock seconds, its int32 [batch, len] decodes (all rows of the
        call, padding rows included: they ran) and its aux (stats)."""
        longest, iterations = call_counts(decodes, aux)
        if isinstance(gamma, tuple):
            self.chooser.observe(gamma, seconds, longest, iterations)
        else:
            self.controller.observe(gamma, seconds, longest, iterations)

    def __call__(self, batch: Mapping[str, Array], rng: Array):
        """Chooses a plan, decodes, learns α and the timing; returns (decodes, aux + the plan as
        'gamma', prediction)."""
        gamma, predicted = self.choose(batch)
        self.compile(gamma, batch)
        start = self._now()
        decodes, aux = jax.block_until_ready(self.decode(gamma, batch, rng))
        seconds = self._now() - start
        self.update(aux)
        self.observe(gamma, seconds, decodes, aux)
        return decodes, {**aux, "gamma": gamma, "predicted_speedup": predicted}


def bootstrap_interval(
    numerator_seconds, denominator_seconds, rounds: int = 2000, seed: int = 0
) -> list[float]:
    """5th and 95th percentiles of Σ numerator / Σ denominator over examples resampled in pairs.

    Args:
      numerator_seconds, denominator_seconds: float [num_examples] per-example wall seconds of two
        runs on the same examples (e.g. the baseline and auto: the ratio is auto's speedup).
      rounds: bootstrap resamples; seed: NumPy seed.

    Raises:
      ValueError: the two runs have different lengths or no examples.
    """
    a, b = np.asarray(numerator_seconds, float), np.asarray(denominator_seconds, float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"need two equal non-empty 1-D runs; got shapes {a.shape}, {b.shape}.")
    idx = np.random.default_rng(seed).integers(0, a.size, size=(rounds, a.size))
    ratios = a[idx].sum(1) / b[idx].sum(1)
    return [float(np.percentile(ratios, 5)), float(np.percentile(ratios, 95))]


def summarise_auto(
    baseline_seconds, seconds, stats, chosen, predictions, identical=None
) -> dict[str, Any]:
    """The eval job's row for an auto-γ run (per-example records, same examples as the baseline).

    Args:
      baseline_seconds, seconds: per-example wall seconds of the baseline and the auto run.
      stats: per-example `SpeculativeStats` or `tree.TreeStats` (NumPy), None where γ = 0 was
        chosen.
      chosen: per-example plan chosen: γ (0 = off), a tree shape or a plan name
        (`auto_trees.plan_name`, e.g. 'tree(3,2,1)').
      predictions: per-example predicted speedup of the choice; None for a measurement call (the
        γ = 1 probe, and γ = 0 calls that time the baseline: `gamma_controller.GammaController.choose`).
      identical: optional fraction of examples equal to the baseline's tokens.

    Returns:
      {'gamma': 'auto', 'gamma_chosen': {plan name: count} (measurement calls included; the γ in
      increasing order, then the trees, e.g. {'0': 3, '2': 90, 'tree(3,2,1)': 7}),
      'baseline_timing_examples' (γ = 0 calls that timed the baseline, in gamma_chosen['0']),
      'probe_examples', 'speedup', 'median_example_speedup',
      'alpha_beta' (of the chain calls; None when none ran), 'alpha_display' ('off' or 'α.aa'),
      'tokens_per_iteration' (chains and trees: tokens per target call), 'predicted_speedup'
      (mean over examples with a prediction; a tree's is its measured speed-up), ...}.
    """
    base, secs = np.asarray(baseline_seconds), np.asarray(seconds)
    ran = [s for s in stats if s is not None]
    chains = [s for s in ran if not isinstance(s, tree_lib.TreeStats)]  # α: chains' β only
    beta_sum = sum(float(np.sum(s.beta_sum)) for s in chains)
    num_beta = sum(int(np.sum(s.num_beta)) for s in chains)
    iterations = sum(int(np.sum(s.num_iterations)) for s in ran)
    generated = sum(int(np.sum(s.num_generated)) for s in ran)
    alpha = beta_sum / num_beta if num_beta else None
    known = [p for p in predictions if p is not None]
    names = [auto_trees.plan_name(g) for g in chosen]
    order = sorted(set(names), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))
    counts = {n: names.count(n) for n in order}
    measuring = [n for n, p in zip(names, predictions, strict=True) if p is None]
    return {
        "gamma": "auto",
        "gamma_chosen": counts,
        "baseline_timing_examples": sum(1 for n in measuring if n == "0"),
        "probe_examples": sum(1 for n in measuring if n != "0"),
        "speedup": float(base.sum() / secs.sum()),
        "median_example_speedup": float(np.median(base / secs)),
        "alpha_beta": alpha,
        "alpha_display": "off" if alpha is None else f"{alpha:.2f}",
        "tokens_per_iteration": generated / iterations if iterations else None,
        "predicted_speedup": float(np.mean(known)) if known else None,
        "identical_fraction": identical,
        "speculative_seconds": float(secs.sum()),
    }
