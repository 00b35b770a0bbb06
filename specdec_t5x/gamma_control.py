"""γ from the measured cost curve, 0 = off: speculative decoding that is not predictably slower.

The paper picks γ by maximising Theorem 3.8 for a known α and c (§3.3). Here the costs are measured
on this machine, for this model pair and these shapes (`cost_curve.CostCurve`: T(k), the draft step,
the sampling work), and γ = 0 (plain decoding, no draft call at all) is chosen whenever no γ
predicts more than 1. α is estimated online: the running mean of β (Corollary 3.6) over every
speculative call so far (`GammaController.update`); before the first call a prior α is used, or
γ = 1 as a probe when there is none.

`AutoGammaDecoder` is the Python API of `gamma='auto'`: it measures the curve on the first batch,
keeps one jitted decoder per γ (γ = 0: the baseline), and chooses γ before every call (γ is static
under `jit`, so the choice is made outside it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from specdec_t5x import cost_curve, models

Array = jax.Array
# The cost curve's names, importable from here as before `cost_curve` was split out.
CostCurve, measure_cost_curve = cost_curve.CostCurve, cost_curve.measure_cost_curve
step_costs, measure_sampling_ms = cost_curve.step_costs, cost_curve.measure_sampling_ms


@dataclasses.dataclass
class GammaController:
    """Chooses γ in 0..gamma_max before each call; learns α from β and corrects by measured speed.

    The cost curve predicts each γ's speedup (generalised Thm 3.8), but a model of step costs misses
    work inside the speculative loop (rejection sampling over the vocabulary, the loop itself), so on
    its own it can switch speculation on where it does not pay. The controller therefore also learns
    from wall-clock time: once `min_timed_calls` calls of some γ > 0 *and* of the baseline (γ = 0)
    have been timed (`observe`), every γ > 0 prediction is scaled by the calibration factor
    κ = (measured speedup of the timed γs) / (their predicted speedup), weighted by tokens. Before
    that it probes: γ = 1 while α is unknown, then γ = 0 until the baseline is timed.

    Attributes:
      curve: the measured `CostCurve`.
      prior_alpha: α used before any β was measured (None: probe with γ = 1).
      beta_sum, num_beta: running Σ β and count over all speculative calls so far.
      min_timed_calls: timed calls of the baseline and of γ > 0 before κ is used.
      timed_seconds, timed_tokens, timed_calls: per γ, Σ seconds (wall clock), Σ generated
        tokens and the number of observed calls.
    """

    curve: cost_curve.CostCurve
    prior_alpha: float | None = None
    beta_sum: float = 0.0
    num_beta: int = 0
    min_timed_calls: int = 2
    timed_seconds: dict = dataclasses.field(default_factory=dict)
    timed_tokens: dict = dataclasses.field(default_factory=dict)
    timed_calls: dict = dataclasses.field(default_factory=dict)

    @property
    def alpha(self) -> float | None:
        """Running α = Σ β / count (Corollary 3.6), or the prior before any call."""
        if self.num_beta:
            return min(self.beta_sum / self.num_beta, 1.0)
        return self.prior_alpha

    def predictions(self, alpha: float) -> dict[int, float]:
        """{γ: predicted speedup} for γ = 0..gamma_max (cost curve only, no calibration)."""
        return {g: self.curve.predicted_speedup(alpha, g) for g in range(self.curve.gamma_max + 1)}

    def _timed(self, gamma: int) -> bool:
        return self.timed_calls.get(gamma, 0) >= self.min_timed_calls

    def calibration(self, predicted: Mapping[int, float]) -> float | None:
        """κ: measured over predicted speedup of the timed γ > 0 (None until enough timing)."""
        spec = [g for g in self.timed_calls if g > 0 and self._timed(g)]
        if not spec or not self._timed(0):
            return None
        s_per_token_0 = self.timed_seconds[0] / self.timed_tokens[0]
        ratios = [
            (s_per_token_0 * self.timed_tokens[g] / self.timed_seconds[g]) / predicted[g]
            for g in spec
        ]
        weights = [self.timed_tokens[g] for g in spec]
        return float(np.average(ratios, weights=weights))

    def choose(self) -> tuple[int, float | None]:
        """(γ, its predicted speedup): the best γ, 0 when none predicts > 1; (1, None) to probe.

        Predictions are scaled by `calibration` once available; until then, after a γ > 0 was
        timed, the baseline is chosen (prediction 1.0) until it is timed too.
        """
        alpha = self.alpha
        if alpha is None:
            return 1, None
        predicted = self.predictions(alpha)
        kappa = self.calibration(predicted)
        if kappa is None:
            if any(g > 0 and self._timed(g) for g in self.timed_calls):
                return 0, 1.0  # time the baseline before trusting the prediction
        else:
            predicted = {g: (p if g == 0 else p * kappa) for g, p in predicted.items()}
        best = max(predicted, key=lambda g: (predicted[g], -g))  # ties: the smaller γ
        return (best, predicted[best]) if predicted[best] > 1.0 else (0, 1.0)

    def update(self, stats) -> None:
        """Adds a call's β (`speculative.SpeculativeStats`, any batch) to the running α."""
        self.beta_sum += float(np.sum(np.asarray(stats.beta_sum)))
        self.num_beta += int(np.sum(np.asarray(stats.num_beta)))

    def observe(self, gamma: int, seconds: float, num_tokens: int) -> None:
        """Records one timed call of γ: wall-clock `seconds` for `num_tokens` generated tokens.

        Raises:
          ValueError: negative or non-finite seconds, or num_tokens < 1.
        """
        if not np.isfinite(seconds) or seconds < 0 or num_tokens < 1:
            raise ValueError(
                f"observe needs seconds >= 0 and num_tokens >= 1; got {seconds!r}, {num_tokens!r}."
            )
        self.timed_seconds[gamma] = self.timed_seconds.get(gamma, 0.0) + float(seconds)
        self.timed_tokens[gamma] = self.timed_tokens.get(gamma, 0) + int(num_tokens)
        self.timed_calls[gamma] = self.timed_calls.get(gamma, 0) + 1


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
      curve: a `CostCurve` to use instead of measuring one on the first batch.

    Use `decoder(batch, rng)`, or, to keep compilation out of a timed region, `choose()`,
    `compile(gamma, batch)`, then the timed `decode(gamma, batch, rng)` and `update(aux)`.
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
        curve: cost_curve.CostCurve | None = None,
    ):
        if not isinstance(gamma_max, int) or gamma_max < 1:
            raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
        self.spec_model, self.target_params = spec_model, target_params
        self.draft_params = spec_model.draft.params if draft_params is None else draft_params
        self.settings = dict(settings)
        self.gamma_max, self.verification = gamma_max, verification
        self.threshold, self.prior_alpha = draft_confidence_threshold, prior_alpha
        self.cost_repeats = cost_repeats
        self.controller = None if curve is None else GammaController(curve, prior_alpha)
        self._fns: dict[int, Any] = {}
        self._compiled: set[tuple] = set()
        self._baseline = models.EncoderDecoderModel(spec_model.module)

    def _fn(self, gamma: int):
        if gamma not in self._fns:
            if gamma == 0:
                params = dict(self.settings)
                self._fns[0] = jax.jit(
                    lambda tp, dp, b, rng: (
                        self._baseline.predict_batch_with_aux(tp, b, rng, decoder_params=params)[0],
                        {},
                    )
                )
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

    def choose(self, batch: Mapping[str, Array]) -> tuple[int, float | None]:
        """(γ, predicted speedup) for the next call; measures the cost curve on the first batch."""
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
            )
            self.controller = GammaController(curve, self.prior_alpha)
        return self.controller.choose()

    def compile(self, gamma: int, batch: Mapping[str, Array]) -> None:
        """Compiles (and runs once) the decoder of γ for this batch shape, if not done yet."""
        key = (gamma, *(tuple(v.shape) for v in batch.values()))
        if key not in self._compiled:
            rng = jax.random.PRNGKey(0)
            jax.block_until_ready(
                self._fn(gamma)(self.target_params, self.draft_params, batch, rng)
            )
            self._compiled.add(key)

    def decode(self, gamma: int, batch: Mapping[str, Array], rng: Array):
        """(decodes int32 [batch, max_decode_len], aux) with γ (0: the baseline, aux = {})."""
        return self._fn(gamma)(self.target_params, self.draft_params, batch, rng)

    def update(self, aux: Mapping[str, Any]) -> None:
        """Feeds a speculative call's β into the running α (no-op for γ = 0)."""
        if "stats" in aux:
            self.controller.update(aux["stats"])

    def observe(self, gamma: int, seconds: float, decodes: Array) -> None:
        """Feeds a timed call (wall-clock seconds; its int32 [batch, len] decodes) to the controller.

        Generated tokens are the non-padding (non-zero) entries of `decodes`.
        """
        self.controller.observe(gamma, seconds, max(int(np.count_nonzero(np.asarray(decodes))), 1))

    def __call__(self, batch: Mapping[str, Array], rng: Array):
        """Chooses γ, decodes, learns α and the timing; returns (decodes, aux + γ, prediction)."""
        gamma, predicted = self.choose(batch)
        self.compile(gamma, batch)
        start = time.perf_counter()
        decodes, aux = jax.block_until_ready(self.decode(gamma, batch, rng))
        self.observe(gamma, time.perf_counter() - start, decodes)
        self.update(aux)
        return decodes, {**aux, "gamma": gamma, "predicted_speedup": predicted}


def summarise_auto(
    baseline_seconds, seconds, stats, chosen, predictions, identical=None
) -> dict[str, Any]:
    """The eval job's row for an auto-γ run (per-example records, same examples as the baseline).

    Args:
      baseline_seconds, seconds: per-example wall seconds of the baseline and the auto run.
      stats: per-example `SpeculativeStats` (NumPy), None where γ = 0 was chosen.
      chosen: per-example γ chosen (0 = off).
      predictions: per-example predicted speedup of the choice (None for the γ = 1 probe).
      identical: optional fraction of examples equal to the baseline's tokens.

    Returns:
      {'gamma': 'auto', 'gamma_chosen': {γ: count}, 'speedup', 'median_example_speedup',
      'alpha_beta' (None when every example ran off), 'alpha_display' ('off' or 'α.aa'),
      'tokens_per_iteration', 'predicted_speedup' (mean over examples with a prediction), ...}.
    """
    base, secs = np.asarray(baseline_seconds), np.asarray(seconds)
    ran = [s for s in stats if s is not None]
    beta_sum = sum(float(np.sum(s.beta_sum)) for s in ran)
    num_beta = sum(int(np.sum(s.num_beta)) for s in ran)
    iterations = sum(int(np.sum(s.num_iterations)) for s in ran)
    generated = sum(int(np.sum(s.num_generated)) for s in ran)
    alpha = beta_sum / num_beta if num_beta else None
    known = [p for p in predictions if p is not None]
    counts = {str(g): chosen.count(g) for g in sorted(set(chosen))}
    return {
        "gamma": "auto",
        "gamma_chosen": counts,
        "speedup": float(base.sum() / secs.sum()),
        "median_example_speedup": float(np.median(base / secs)),
        "alpha_beta": alpha,
        "alpha_display": "off" if alpha is None else f"{alpha:.2f}",
        "tokens_per_iteration": generated / iterations if iterations else None,
        "predicted_speedup": float(np.mean(known)) if known else None,
        "identical_fraction": identical,
        "speculative_seconds": float(secs.sum()),
    }
