"""γ from the measured cost curve, 0 = off: speculative decoding that is not predictably slower.

The paper picks γ by maximising Theorem 3.8 for a known α and c (§3.3). Here the costs are measured
on this machine, for this model pair and these shapes (`cost_curve.CostCurve`: T(k), the draft step,
the loops' own work, the per-call set-up), and γ = 0 (plain decoding, no draft call at all) is
chosen whenever no γ predicts more than 1. α is estimated online: the running mean of β
(Corollary 3.6) over every speculative call so far (`GammaController.update`); before the first
call a prior α is used, or γ = 1 as a probe when there is none.

The prediction is for whole calls of the observed length (set-up and fixed work count on both
sides: a ~10-token synopsis of a 256-token input is mostly set-up), and it is checked against each
timed call's *own* counts (its longest row's tokens, its counted iterations), never against other
examples' speed: per-example lengths and α vary too much for that to mean anything at batch 1.

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

from specdec_t5x import models, steps, theory
from specdec_t5x.timing import cost_curve, step_timer

Array = jax.Array
# The cost curve's names, importable from here as before `cost_curve` was split out.
CostCurve, measure_cost_curve = cost_curve.CostCurve, cost_curve.measure_cost_curve
step_costs = step_timer.step_costs


@dataclasses.dataclass
class GammaController:
    """Chooses γ in 0..gamma_max before each call; learns α, the call length and the model's error.

    Prediction for γ > 0 (`predictions`): ρ_b · baseline_call(L) / (ρ_s · speculative_call(γ,
    η · N(α, γ))), with the `CostCurve`'s per-call model, where

    * α: running mean of β over all speculative calls (`update`), or the prior;
    * L: mean tokens of a call's longest row over the timed calls (any γ);
    * N(α, γ): the expected iterations of a call at the observed calls' lengths
      (`iterations_per_call`: Section 3.1's i.i.d. model with each call's last block cut at EOS,
      `theory.expected_iterations`). Until session 16 this was L / E(α, γ) (Eq. 1), which
      ignores the cut, and η had to learn it per γ;
    * ρ_b, ρ_s: measured / modelled wall time of the timed baseline and speculative calls, each call
      modelled with its own counts (baseline: its longest row's tokens; speculative: its counted
      iterations) — what the component model misses (e.g. cache copies in the loop carry);
    * η: counted iterations / N(α, γ) at each call's own length, over the speculative calls (what
      the i.i.d. model misses: α varies per example, a batch waits for its slowest row), kept per
      γ and shrunk toward the pooled η like ρ_s (`iterations_correction`). With Eq. 1 in place of
      N, η grew with γ on short outputs (session 13, Table 3 summarization at T = 1, ~10-token
      synopses: η 1.05 at γ = 3, 1.22 at γ = 6), and a pooled η dominated by one γ's calls
      mispredicted the others (there: γ = 6 on 72 of 100 calls, 0.945 of fixed γ = 3).

    Each correction is 1 until `min_timed_calls` calls of its kind were timed. Probing: γ = 1 while
    α is unknown, then γ = 0 until the baseline is timed `min_timed_calls` times (the baseline
    costs nothing extra: it is what auto falls back to).

    Calls timed before the run count as well: the calibration's calls on the first batch time
    the baseline (`time_baseline`) and every γ (`time_speculative`), so ρ_b and ρ_s start from
    calls of the same moment, and the run's first calls move them as further calls do.

    ρ_s is kept per γ and shrunk toward the pooled ρ_s of all speculative calls with the weight of
    `gamma_prior_calls` calls: the model's error differs between γ (e.g. a cache copy per
    iteration weighs more at small γ), and a γ timed a few times must not be judged on those
    alone.

    Re-timing the baseline: while speculating, every `baseline_every`-th call runs the baseline
    (γ = 0) instead, so that ρ_b is learnt from calls spread over the run like ρ_s, not from the
    two calls after the probe (the failure this prevents: two baseline calls that happened to run
    slow made ρ_b too high, and γ = 2 was kept for 97 of 100 summaries at 0.88× the baseline).
    The cost is 1/`baseline_every` of the calls run at the baseline's speed, so re-timing is
    skipped while the decision to speculate is safe: once the baseline was timed
    `retime_min_calls` times, ρ_b is known to a relative standard error s_b / √n_b (s_b: the spread
    of measured / modelled over the baseline calls), and while the chosen γ's prediction stays
    above 1 even with ρ_b at its lower bound (prediction · (1 − `retime_z` · s_b / √n_b) > 1) a
    re-timing could not switch speculation off; then the baseline is re-timed only every
    `max_baseline_every` calls (drift). ρ_b scales every γ > 0 alike, so it never changes which γ
    is chosen, only whether to speculate.

    Exploring (optimism under uncertainty, as in UCB bandits): α learnt from n speculative calls is
    uncertain by about s_α / √n (α varies from example to example), and once speculation is off it
    is never measured again. So "off" is chosen only when no γ predicts a speed-up even at the
    optimistic α̂ + `optimism_z` · s_α / √n; otherwise the γ best at that α is used (reported with
    its prediction at α̂). The margin shrinks as calls accumulate, so a pair that does not pay is
    switched off after a few calls, and one or two unlucky first examples (the failure this
    prevents: α̂ = 0.46 from two calls where the run's α was 0.56, off for the remaining 98 examples
    at 0.97× while γ = 2 gave 1.14×) cannot switch it off for good. s_α is the measured spread of
    the per-call α, shrunk toward the assumed `alpha_spread` with the weight of
    `spread_prior_calls` calls (`alpha_spread_estimate`): summaries sampled at T = 1 spread by 0.07,
    greedy ones by 0.22, and a margin sized for 0.2 kept a losing pair exploring for half of 100
    summaries (0.95×). A `prior_alpha` with no measured call is taken as known (no margin).

    Exploration budget: at most `max_explore_calls` speculative calls are spent exploring (γ
    chosen at the optimistic α only). Near break-even the margin closes slowly: it takes n ≈ (z ·
    s_α / Δα)² calls to fall below a gap Δα between α̂ and the break-even α (~80 calls for greedy
    summaries, s_α = 0.22, Δα = 0.04), and every one of them runs a γ that loses at α̂ (session 9,
    Table 3, summarization with the T5 draft at T = 0: γ = 2 explored on 25 of 100 calls, 0.96×
    the baseline). 12 calls pin α̂ to about ±0.1 at s_α = 0.22, which is what exploring is for:
    unlucky first calls (above) are outvoted within a few calls, and α̂ itself then decides.

    Switch-on margin: speculation is chosen only for a predicted speed-up above `min_speedup`
    (and explored only when the optimistic prediction clears it). The prediction is a model with
    its own error: over the 12 session-8 demo / Table 2 / Table 3 rows that speculated, measured /
    predicted ran from 0.92 to 1.05, and the three rows predicted below 1.03 ran at 0.94–1.00
    (summarization at T = 1: γ = 3 predicted 1.02, ran 0.91× for 86 calls). Near break-even, "off"
    costs at most the margin when the prediction was right and saves the model's error when it
    was wrong; every row predicted above 1.07 paid.

    Refuted γ: the calls of a γ are themselves a measurement of its speed-up, whatever α is:
    ρ_b · Σ baseline_call(L_i) / Σ wall_i over its timed calls, with a relative standard error from
    the spread of the per-call ratios (and ρ_b's own). A γ timed at least `refute_min_calls` times
    whose speed-up stays below 1 even at its upper bound (· (1 + `refute_z` · se)) is not chosen
    again (`refuted`): optimism about α cannot outvote what that γ's own calls showed.

    Confirmed γ (the converse): a γ whose own calls pay even at their speed-up's lower bound (·
    (1 − `refute_z` · se) > 1) is chosen when no prediction clears the margin (`confirmed`; the
    confirmed γ with the highest measured speed-up). The margin guards against the model's error;
    a speed-up measured on the run's own calls has no model error to guard against (the failure
    this prevents: session 12, Table 2 En→De at T = 0, γ = 2 predicted 1.02 on a slow VM phase
    while the same run's fixed γ = 2 read 1.12×, and auto ran the baseline on 41 of 100 calls,
    0.93 of the best fixed γ).

    Re-timing speculation while off: once off, speculation is never measured again, while the
    machine drifts (the VM has slow and fast phases). So while off with the best γ predicted
    above `retime_min_predicted` (0.95: near break-even, within the model's error), every
    `speculate_every`-th call runs that γ instead, and its timing updates ρ_s, the refutation and
    the confirmation. A call that truly loses costs its loss (≤ 5 % at the threshold) once per
    `speculate_every` calls (≤ 0.6 % of the run at 8); a γ refuted by these calls is not retried.

    Attributes:
      curve: the measured `CostCurve`.
      prior_alpha: α used before any β was measured (None: probe with γ = 1).
      beta_sum, num_beta: running Σ β and count over all speculative calls so far.
      min_timed_calls: timed calls of the baseline and of γ > 0 before their corrections are used.
      baseline_every: while speculating, re-time the baseline on every n-th call (0: never).
      max_baseline_every: ... every n-th call even while the decision is safe (0: never).
      retime_min_calls: baseline timings before their spread is trusted to skip re-timing.
      retime_z: the lower bound's multiple of ρ_b's standard error (1.645: one-sided 95 %).
      gamma_prior_calls: weight, in calls, of the pooled ρ_s in each γ's own ρ_s.
      alpha_spread: assumed spread (standard deviation) of one call's α around the run's α.
      optimism_z: the margin's multiple of s_α / √n (1.645: one-sided 95 %).
      spread_prior_calls: weight, in calls, of `alpha_spread` in s_α.
      min_speedup: predicted speed-up a γ must exceed to be chosen (switch-on margin, > 0).
      refute_min_calls: timed calls of a γ before its own speed-up can refute it.
      refute_z: the upper bound's multiple of that speed-up's relative standard error.
      max_explore_calls: speculative calls that may be spent exploring (0: never explore).
      explore_calls: speculative calls observed so far that were chosen by exploring.
      exploring: whether the last `choose` explored (its call, once observed, is counted).
      beta_calls: speculative calls whose β entered α (n).
      call_alpha_sum, call_alpha_sq_sum, alpha_calls: Σ and Σ² of the per-call α (s_α) and the
        number of calls with a β.
      speedup_terms: {γ: [calls, Σ modelled baseline ms, Σ r, Σ r²]} over γ's timed calls,
        r = modelled baseline ms / wall ms of the call (refutation).
      timed_calls: {γ: observed calls}.
      measured_ms, modelled_ms: {'baseline' | 'speculative' | γ: Σ wall ms, Σ modelled ms} (γ:
        that γ's speculative calls alone).
      calibration_ms: {'speculative' | γ: (Σ wall ms, Σ modelled ms)} of the speculative calls
        timed before the run (`time_speculative`); they enter ρ_s, not `measured_speedup`.
      calls_since_baseline: calls since the baseline was last timed.
      speculate_every: while off near break-even, re-time the best γ every n-th call (0: never).
      retime_min_predicted: ... when its predicted speed-up is above this (near break-even).
      calls_since_speculative: calls since γ > 0 last ran.
      baseline_ratio_sum, baseline_ratio_sq_sum: Σ and Σ² of measured / modelled per baseline
        call (s_b).
      longest_tokens, calls: Σ longest-row tokens and the number of observed calls (L).
      length_calls: {longest-row tokens: observed calls} (the iterations at these lengths).
      counted_iterations, expected_iterations: Σ over speculative calls (η).
      iterations_by_gamma: {γ: (Σ counted, Σ expected iterations)} over γ's calls (η per γ).
      history: one record per observed call: {'gamma', 'reason' ('probe', 'time_baseline',
        'retime_baseline', 'best', 'confirmed', 'explore', 'retime_speculative', 'off'), 'predicted' (that γ's prediction or None),
        'alpha' (α̂ at the choice), 'ms' (wall ms), 'longest_tokens', 'iterations'}.
      last_choice: what the last `choose` decided ({'reason', 'alpha', 'predicted'}).
    """

    curve: cost_curve.CostCurve
    prior_alpha: float | None = None
    beta_sum: float = 0.0
    num_beta: int = 0
    min_timed_calls: int = 2
    baseline_every: int = 8
    max_baseline_every: int = 32
    retime_min_calls: int = 4
    retime_z: float = 1.645
    gamma_prior_calls: float = 4.0
    alpha_spread: float = 0.2
    optimism_z: float = 1.645
    spread_prior_calls: float = 4.0
    min_speedup: float = 1.04
    refute_min_calls: int = 3
    refute_z: float = 1.645
    max_explore_calls: int = 12
    explore_calls: int = 0
    exploring: bool = False
    beta_calls: int = 0
    call_alpha_sum: float = 0.0
    call_alpha_sq_sum: float = 0.0
    alpha_calls: int = 0
    speedup_terms: dict = dataclasses.field(default_factory=dict)
    timed_calls: dict = dataclasses.field(default_factory=dict)
    measured_ms: dict = dataclasses.field(default_factory=dict)
    modelled_ms: dict = dataclasses.field(default_factory=dict)
    calibration_ms: dict = dataclasses.field(default_factory=dict)
    longest_tokens: float = 0.0
    calls: int = 0
    length_calls: dict = dataclasses.field(default_factory=dict)
    counted_iterations: float = 0.0
    expected_iterations: float = 0.0
    iterations_by_gamma: dict = dataclasses.field(default_factory=dict)
    calls_since_baseline: int = 0
    speculate_every: int = 8
    retime_min_predicted: float = 0.95
    calls_since_speculative: int = 0
    baseline_ratio_sum: float = 0.0
    baseline_ratio_sq_sum: float = 0.0
    history: list = dataclasses.field(default_factory=list)
    last_choice: dict = dataclasses.field(default_factory=dict)

    @property
    def alpha(self) -> float | None:
        """Running α = Σ β / count (Corollary 3.6), or the prior before any call."""
        if self.num_beta:
            return min(self.beta_sum / self.num_beta, 1.0)
        return self.prior_alpha

    @property
    def tokens_per_call(self) -> float | None:
        """L: mean tokens of the longest row per observed call (None before any)."""
        return self.longest_tokens / self.calls if self.calls else None

    def _timed(self, speculative: bool) -> bool:
        n = sum(c for g, c in self.timed_calls.items() if (g > 0) == speculative)
        return n >= self.min_timed_calls

    def corrections(self) -> dict[str, float]:
        """{'baseline': ρ_b, 'speculative': ρ_s, 'iterations': η}; 1.0 until enough calls."""
        out = {}
        for kind, speculative in (("baseline", False), ("speculative", True)):
            rho = self._rho(kind)
            out[kind] = rho if self._timed(speculative) and rho is not None else 1.0
        ok = self._timed(True) and self.expected_iterations > 0
        out["iterations"] = self.counted_iterations / self.expected_iterations if ok else 1.0
        return out

    def speculative_correction(self, gamma: int) -> float:
        """ρ_s of γ: (n_γ·ρ̂_γ + n0·ρ_s) / (n_γ + n0), n0 = `gamma_prior_calls`; ρ_s before."""
        pooled = self.corrections()["speculative"]
        n = self.timed_calls.get(gamma, 0)
        own = self._rho(gamma)
        if not self._timed(True) or n == 0 or own is None:
            return pooled
        return (n * own + self.gamma_prior_calls * pooled) / (n + self.gamma_prior_calls)

    def iterations_correction(self, gamma: int) -> float:
        """η of γ: (n_γ·η̂_γ + n0·η) / (n_γ + n0), n0 = `gamma_prior_calls`; the pooled η before."""
        pooled = self.corrections()["iterations"]
        n = self.timed_calls.get(gamma, 0)
        counted, expected = self.iterations_by_gamma.get(gamma, (0.0, 0.0))
        if not self._timed(True) or n == 0 or expected <= 0:
            return pooled
        return (n * counted / expected + self.gamma_prior_calls * pooled) / (
            n + self.gamma_prior_calls
        )

    def predictions(self, alpha: float) -> dict[int, float]:
        """{γ: predicted speedup} for γ = 0..gamma_max at α, with the learnt L and corrections.

        Before any call (no L) the steady-state curve (long outputs) is used, uncorrected.
        """
        L = self.tokens_per_call
        if L is None:
            return {
                g: self.curve.predicted_speedup(alpha, g) for g in range(self.curve.gamma_max + 1)
            }
        k = self.corrections()
        base = k["baseline"] * self.curve.baseline_call_ms(L)
        out = {0: 1.0}
        for g in range(1, self.curve.gamma_max + 1):
            iterations = self.iterations_correction(g) * self.iterations_per_call(alpha, g)
            rho = self.speculative_correction(g)
            out[g] = base / (rho * self.curve.speculative_call_ms(g, iterations))
        return out

    def iterations_per_call(self, alpha: float, gamma: int) -> float:
        """Iterations per call of γ at α, before η: the mean over the observed calls' lengths
        of `theory.expected_iterations` (Section 3.1's model, each call's last block cut at EOS).

        Eq. 1's L / E(α, γ) ignores that cut, which costs a larger γ more on short outputs (a
        ~10-token synopsis at γ = 6); η then had to learn it per γ from each γ's own calls.

        Raises:
          ValueError: no call observed yet (no lengths).
        """
        if not self.length_calls:
            raise ValueError("iterations_per_call needs at least one observed call (lengths).")
        lengths = np.fromiter(self.length_calls, np.int64)
        weights = np.fromiter(self.length_calls.values(), np.float64)
        alpha = min(max(float(alpha), 0.0), 1.0)
        per_length = theory.expected_iterations(lengths, alpha, gamma)
        return float(weights @ per_length / weights.sum())

    def choose(self) -> tuple[int, float | None]:
        """(γ, its predicted speedup): the best γ if its prediction exceeds `min_speedup`; else the
        `confirmed` γ with the highest measured speed-up; else the γ best at the optimistic α if
        that one's optimistic prediction does and the exploration budget (`max_explore_calls`) is
        not spent; else 0 ("off"), except that every `speculate_every`-th call while off runs the
        best γ when its prediction is above `retime_min_predicted`. (1, None) to probe. A
        `refuted` γ is never chosen. `last_choice['reason']` says which rule decided.

        After γ > 0 was timed `min_timed_calls` times, the baseline is chosen until it is timed
        as often; afterwards, while speculating, every `baseline_every`-th call re-times the
        baseline. Both are measurements, not decisions: (0, None) (a decision for "off" is (0,
        1.0)).
        """
        self.exploring = False
        alpha = self.alpha
        if alpha is None:
            return self._chose(1, None, "probe")
        if self._timed(True) and not self._timed(False):
            return self._chose(0, None, "time_baseline")  # before trusting the prediction
        candidates = [g for g in range(1, self.curve.gamma_max + 1) if not self.refuted(g)]
        predicted = self.predictions(alpha)
        # Ties: the smaller γ.
        best = max(candidates, key=lambda g: (predicted[g], -g), default=0)
        explore, reason = False, "off"
        confirmed = {g: m[0] for g in candidates if (m := self.confirmed(g)) is not None}
        if best and predicted[best] > self.min_speedup:
            choice, reason = (best, predicted[best]), "best"
        elif confirmed:  # its own calls pay: measurement outranks the model's margin
            gamma = max(confirmed, key=lambda g: (confirmed[g], -g))
            choice, reason = (gamma, predicted[gamma]), "confirmed"
        elif candidates and self.explore_calls < self.max_explore_calls:
            optimistic = self.predictions(self.optimistic_alpha)
            gamma = max(candidates, key=lambda g: (optimistic[g], -g))
            explore = optimistic[gamma] > self.min_speedup
            choice = (gamma, predicted[gamma]) if explore else (0, 1.0)
            reason = "explore" if explore else "off"
        else:
            choice = 0, 1.0
        if (
            choice[0] == 0
            and best
            and predicted[best] > self.retime_min_predicted
            and self.speculate_every
            and self.calls_since_speculative + 1 >= self.speculate_every
        ):  # off near break-even: re-time the best γ now and then (the machine drifts)
            return self._chose(best, predicted[best], "retime_speculative")
        if choice[0] > 0 and self._timed(False) and self._retime(choice[1]):
            # re-time the baseline (ρ_b from calls spread over the run)
            return self._chose(0, None, "retime_baseline")
        self.exploring = explore
        return self._chose(*choice, reason)

    def _chose(self, gamma: int, predicted: float | None, reason: str) -> tuple[int, float | None]:
        self.last_choice = {"reason": reason, "alpha": self.alpha, "predicted": predicted}
        return gamma, predicted

    def measured_speedup(self, gamma: int) -> tuple[float, float] | None:
        """(speed-up, its relative standard error) of γ's own timed calls, None before
        `refute_min_calls` of them and the baseline were timed.

        Speed-up: ρ_b · Σ baseline_call(L_i) / Σ wall_i (what the baseline would have cost on
        those calls' tokens over what they cost). Relative standard error: the per-call ratios'
        s / (√n · mean), combined in quadrature with ρ_b's (`baseline_standard_error`, 0 while
        that is unknown).
        """
        terms = self.speedup_terms.get(gamma)
        if terms is None or terms[0] < max(self.refute_min_calls, 2) or not self._timed(False):
            return None
        n, base_ms, r_sum, r_sq_sum = terms
        mean = r_sum / n
        var = max(r_sq_sum / n - mean * mean, 0.0) * n / (n - 1)
        se_b = self.baseline_standard_error() or 0.0
        se = float(np.sqrt(var / n + (mean * se_b) ** 2) / mean)
        rho_b = self.corrections()["baseline"]
        return float(rho_b * base_ms / self.measured_ms[gamma]), se

    def confirmed(self, gamma: int) -> tuple[float, float] | None:
        """γ's `measured_speedup` if its own calls pay even at its lower bound (· (1 −
        `refute_z` · se) > 1; see the class), else None."""
        measured = self.measured_speedup(gamma)
        if measured is None or measured[0] * (1 - self.refute_z * measured[1]) <= 1.0:
            return None
        return measured

    def refuted(self, gamma: int) -> bool:
        """Whether γ's own calls lose even at their speed-up's upper bound (see the class)."""
        measured = self.measured_speedup(gamma)
        return measured is not None and measured[0] * (1 + self.refute_z * measured[1]) < 1.0

    def baseline_standard_error(self) -> float | None:
        """s_b / √n_b: ρ_b's relative standard error over the timed baseline calls (None below
        `retime_min_calls` calls)."""
        n = self.timed_calls.get(0, 0)
        if n < max(self.retime_min_calls, 2):
            return None
        mean = self.baseline_ratio_sum / n
        var = max(self.baseline_ratio_sq_sum / n - mean * mean, 0.0) * n / (n - 1)
        return float(np.sqrt(var / n) / mean)

    def _retime(self, predicted: float | None) -> bool:
        """Whether the next call re-times the baseline instead of speculating (see the class)."""
        since = self.calls_since_baseline + 1
        if not self.baseline_every or since < self.baseline_every:
            return False
        se = self.baseline_standard_error()
        safe = se is not None and predicted is not None and predicted * (1 - self.retime_z * se) > 1
        return not safe or (self.max_baseline_every > 0 and since >= self.max_baseline_every)

    @property
    def alpha_spread_estimate(self) -> float:
        """s_α: √((n0 · alpha_spread² + (m − 1) · s²) / (n0 + m − 1)), s² the sample variance of
        the per-call α over m calls, n0 = `spread_prior_calls` (alpha_spread while m < 2)."""
        m = self.alpha_calls
        if m < 2:
            return self.alpha_spread
        mean = self.call_alpha_sum / m
        var = max(self.call_alpha_sq_sum / m - mean * mean, 0.0) * m / (m - 1)
        n0 = self.spread_prior_calls
        return float(np.sqrt((n0 * self.alpha_spread**2 + (m - 1) * var) / (n0 + m - 1)))

    @property
    def optimistic_alpha(self) -> float | None:
        """α̂ + optimism_z · s_α / √n over n = `beta_calls` (α̂ itself when n = 0), ≤ 1."""
        alpha = self.alpha
        if alpha is None or self.beta_calls == 0:
            return alpha
        margin = self.optimism_z * self.alpha_spread_estimate / np.sqrt(self.beta_calls)
        return min(alpha + margin, 1.0)

    def update(self, stats) -> None:
        """Adds a call's β (`speculative.SpeculativeStats`, any batch) to the running α."""
        beta_sum = float(np.sum(np.asarray(stats.beta_sum)))
        num_beta = int(np.sum(np.asarray(stats.num_beta)))
        self.beta_sum += beta_sum
        self.num_beta += num_beta
        self.beta_calls += 1
        if num_beta:
            call_alpha = min(beta_sum / num_beta, 1.0)
            self.call_alpha_sum += call_alpha
            self.call_alpha_sq_sum += call_alpha * call_alpha
            self.alpha_calls += 1

    def observe(
        self, gamma: int, seconds: float, longest_tokens: int, iterations: int | None = None
    ) -> None:
        """Records one timed call of γ (0: the baseline) against the model of that same call.

        Call `update` with the call's statistics first (η uses the running α).

        Args:
          gamma: the call's γ.
          seconds: its wall-clock time, seconds.
          longest_tokens: tokens generated by its longest row (incl. EOS), >= 1.
          iterations: its counted iterations (max over rows of `num_iterations`); required for
            γ > 0.

        Raises:
          ValueError: negative or non-finite seconds, longest_tokens < 1, or γ > 0 without
            iterations >= 1.
        """
        if not np.isfinite(seconds) or seconds < 0 or longest_tokens < 1:
            raise ValueError(
                f"observe needs seconds >= 0 and longest_tokens >= 1; got {seconds!r}, "
                f"{longest_tokens!r}."
            )
        if gamma > 0 and (iterations is None or iterations < 1):
            raise ValueError(f"observe of γ = {gamma} needs iterations >= 1; got {iterations!r}.")
        if gamma == 0:
            self.time_baseline(seconds, longest_tokens)  # ρ_b, its spread, the timed calls
        else:
            modelled = self.curve.speculative_call_ms(gamma, iterations)
            alpha = self.alpha if self.alpha is not None else 0.0
            expected = float(
                theory.expected_iterations([int(longest_tokens)], min(alpha, 1.0), gamma)[0]
            )
            self.counted_iterations += iterations
            self.expected_iterations += expected
            counted_g, expected_g = self.iterations_by_gamma.get(gamma, (0.0, 0.0))
            self.iterations_by_gamma[gamma] = (counted_g + iterations, expected_g + expected)
            for key in ("speculative", gamma):
                self.measured_ms[key] = self.measured_ms.get(key, 0.0) + 1e3 * float(seconds)
                self.modelled_ms[key] = self.modelled_ms.get(key, 0.0) + modelled
            if seconds > 0:
                base_ms = self.curve.baseline_call_ms(longest_tokens)
                r = base_ms / (1e3 * float(seconds))
                terms = self.speedup_terms.setdefault(gamma, [0, 0.0, 0.0, 0.0])
                terms[0] += 1
                terms[1] += base_ms
                terms[2] += r
                terms[3] += r * r
            if self.exploring:
                self.explore_calls += 1  # the call `choose` explored with
            self.timed_calls[gamma] = self.timed_calls.get(gamma, 0) + 1
        self.calls_since_baseline = 0 if gamma == 0 else self.calls_since_baseline + 1
        self.calls_since_speculative = 0 if gamma > 0 else self.calls_since_speculative + 1
        choice = self.last_choice or {"reason": None, "alpha": None, "predicted": None}
        self.history.append(
            {
                "gamma": int(gamma),
                **choice,
                "ms": 1e3 * float(seconds),
                "longest_tokens": int(longest_tokens),
                "iterations": None if iterations is None else int(iterations),
            }
        )
        self.last_choice = {}
        self.exploring = False
        self.longest_tokens += int(longest_tokens)
        self.calls += 1
        self.length_calls[int(longest_tokens)] = self.length_calls.get(int(longest_tokens), 0) + 1

    def time_baseline(self, seconds: float, longest_tokens: int) -> None:
        """Records a timed baseline call made before the run (the calibration's on the first
        batch): it counts toward ρ_b, its spread and the baseline's timed calls, not toward L,
        the history or the re-timing counters. So the run spends no call timing the baseline
        before trusting a prediction (re-timing while speculating still spreads ρ_b's calls over
        the run).

        Args:
          seconds: the call's wall-clock time, seconds.
          longest_tokens: tokens generated by its longest row (incl. EOS), >= 1.

        Raises:
          ValueError: negative or non-finite seconds, or longest_tokens < 1.
        """
        if not np.isfinite(seconds) or seconds < 0 or longest_tokens < 1:
            raise ValueError(
                f"time_baseline needs seconds >= 0 and longest_tokens >= 1; got {seconds!r}, "
                f"{longest_tokens!r}."
            )
        modelled = self.curve.baseline_call_ms(longest_tokens)
        self.measured_ms["baseline"] = self.measured_ms.get("baseline", 0.0) + 1e3 * float(seconds)
        self.modelled_ms["baseline"] = self.modelled_ms.get("baseline", 0.0) + modelled
        self.timed_calls[0] = self.timed_calls.get(0, 0) + 1
        if modelled > 0:
            ratio = 1e3 * float(seconds) / modelled
            self.baseline_ratio_sum += ratio
            self.baseline_ratio_sq_sum += ratio * ratio

    def time_speculative(
        self, gamma: int, seconds: float, longest_tokens: int, iterations: int
    ) -> None:
        """Records a timed call of γ made before the run (the calibration's on the first batch):
        it counts toward ρ_s (pooled and γ's own) and γ's timed calls, as `time_baseline`'s calls
        count toward ρ_b; not toward α, η, L, the history, the re-timing counters or γ's
        `measured_speedup` (refutation and confirmation rest on the run's own calls).

        Without it ρ_b started from the calibration's calls and ρ_s from the run's first
        speculative calls alone. When those ran in a slow phase of the VM, ρ_s / ρ_b read ~1.5
        and no γ was ever predicted to pay again (session 23, demo at T = 0: the probe and one
        γ = 2 call at 1.5-1.6x their model, then off for 98 calls at 0.95x the baseline while
        fixed γ = 2 ran 1.07x).

        Args:
          gamma: the call's γ (>= 1).
          seconds: its wall-clock time, seconds.
          longest_tokens: tokens generated by its longest row (incl. EOS), >= 1.
          iterations: its counted iterations (max over rows of `num_iterations`), >= 1.

        Raises:
          ValueError: γ < 1, negative or non-finite seconds, longest_tokens < 1 or
            iterations < 1.
        """
        if (
            gamma < 1
            or not np.isfinite(seconds)
            or seconds < 0
            or longest_tokens < 1
            or iterations is None
            or iterations < 1
        ):
            raise ValueError(
                "time_speculative needs γ >= 1, seconds >= 0, longest_tokens >= 1 and "
                f"iterations >= 1; got {gamma!r}, {seconds!r}, {longest_tokens!r}, "
                f"{iterations!r}."
            )
        modelled = self.curve.speculative_call_ms(gamma, iterations)
        for key in ("speculative", gamma):
            measured, model = self.calibration_ms.get(key, (0.0, 0.0))
            self.calibration_ms[key] = (measured + 1e3 * float(seconds), model + modelled)
        self.timed_calls[gamma] = self.timed_calls.get(gamma, 0) + 1

    def _rho(self, key) -> float | None:
        """Σ measured / Σ modelled ms of `key`'s calls ('baseline', 'speculative' or γ), the
        calibration's included; None while nothing was modelled."""
        measured, modelled = self.calibration_ms.get(key, (0.0, 0.0))
        measured += self.measured_ms.get(key, 0.0)
        modelled += self.modelled_ms.get(key, 0.0)
        return measured / modelled if modelled > 0 else None


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
      min_speedup: predicted speed-up a γ must exceed to be chosen (`GammaController`).

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
        calibration_rounds: int = 4,
        curve: cost_curve.CostCurve | None = None,
        min_speedup: float = GammaController.min_speedup,
    ):
        if not isinstance(gamma_max, int) or gamma_max < 1:
            raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
        if not isinstance(calibration_rounds, int) or calibration_rounds < 0:
            raise ValueError(f"calibration_rounds must be an int >= 0; got {calibration_rounds!r}.")
        if not np.isfinite(min_speedup) or min_speedup <= 0:
            raise ValueError(f"min_speedup must be a finite number > 0; got {min_speedup!r}.")
        self.calibration_rounds, self.min_speedup = calibration_rounds, float(min_speedup)
        self.spec_model, self.target_params = spec_model, target_params
        self.draft_params = spec_model.draft.params if draft_params is None else draft_params
        self.settings = dict(settings)
        self.gamma_max, self.verification = gamma_max, verification
        self.threshold, self.prior_alpha = draft_confidence_threshold, prior_alpha
        self.cost_repeats = cost_repeats
        self.controller = None if curve is None else self._controller(curve)
        self._fns: dict[int, Any] = {}
        self._compiled: set[tuple] = set()
        self._baseline = models.EncoderDecoderModel(
            spec_model.module, cpu_weight_dtype=getattr(spec_model, "cpu_weight_dtype", "float32")
        )

    def _controller(self, curve: cost_curve.CostCurve) -> GammaController:
        return GammaController(curve, self.prior_alpha, min_speedup=self.min_speedup)

    def _fn(self, gamma: int):
        if gamma not in self._fns:
            if gamma == 0:
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
            calls = self._calibration_calls(batch) if self.calibration_rounds else {}
            if calls:
                curve = cost_curve.calibrated(curve, calls)
            self.controller = self._controller(curve)
            # The calibration's baseline calls are real timed calls: they time the baseline, so
            # the run itself spends no call on that (each costs the speed-up it forgoes: 2 of 100
            # calls, ~1.5 % at 1.35x, session 13).
            for seconds, longest, _ in calls.get(0, []):
                self.controller.time_baseline(seconds, longest)
            # ... and its speculative calls time each γ the same way (ρ_s), so that ρ_s and ρ_b
            # start from calls of the same moment (see `GammaController.time_speculative`).
            for gamma in sorted(g for g in calls if g > 0):
                for seconds, longest, iterations in calls[gamma]:
                    self.controller.time_speculative(gamma, seconds, longest, iterations)
        return self.controller.choose()

    def _calibration_calls(self, batch: Mapping[str, Array]) -> dict[int, list]:
        """{γ: [(seconds, longest tokens, iterations)]}: `calibration_rounds` rounds of every γ in
        0..gamma_max decoding `batch` after one discarded warm-up round, each round in a seeded
        random order (drift hits all γ)."""
        gammas = list(range(self.gamma_max + 1))
        for gamma in gammas:
            self.compile(gamma, batch)
        calls: dict[int, list] = {g: [] for g in gammas}
        order = np.random.default_rng(0)
        # Round -1 is a discarded warm-up: the first calls after compiling read 1.2-1.9x their
        # later time (7 executables taking turns; En→De, 15-token calls).
        for r in range(-1, self.calibration_rounds):
            rng = jax.random.PRNGKey(max(r, 0))
            for gamma in order.permutation(gammas):
                gamma = int(gamma)
                start = time.perf_counter()
                decodes, aux = jax.block_until_ready(self.decode(gamma, batch, rng))
                seconds = time.perf_counter() - start
                if r >= 0:
                    calls[gamma].append((seconds, *call_counts(decodes, aux)))
        return calls

    def compile(self, gamma: int, batch: Mapping[str, Array]) -> None:
        """Compiles (and runs once) the decoder of γ for this batch shape, if not done yet; with
        encoder length buckets once per bucket (`steps.warmup_sources`)."""
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

    def decode(self, gamma: int, batch: Mapping[str, Array], rng: Array):
        """(decodes int32 [batch, max_decode_len], aux) with γ (0: the baseline, aux = {})."""
        return self._fn(gamma)(self.target_params, self.draft_params, batch, rng)

    def update(self, aux: Mapping[str, Any]) -> None:
        """Feeds a speculative call's β into the running α (no-op for γ = 0)."""
        if "stats" in aux:
            self.controller.update(aux["stats"])

    def observe(
        self, gamma: int, seconds: float, decodes: Array, aux: Mapping[str, Any] | None = None
    ) -> None:
        """Feeds a timed call to the controller: wall-clock seconds, its int32 [batch, len]
        decodes (all rows of the call, padding rows included: they ran) and its aux (stats)."""
        longest, iterations = call_counts(decodes, aux)
        self.controller.observe(gamma, seconds, longest, iterations)

    def __call__(self, batch: Mapping[str, Array], rng: Array):
        """Chooses γ, decodes, learns α and the timing; returns (decodes, aux + γ, prediction)."""
        gamma, predicted = self.choose(batch)
        self.compile(gamma, batch)
        start = time.perf_counter()
        decodes, aux = jax.block_until_ready(self.decode(gamma, batch, rng))
        seconds = time.perf_counter() - start
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
      stats: per-example `SpeculativeStats` (NumPy), None where γ = 0 was chosen.
      chosen: per-example γ chosen (0 = off).
      predictions: per-example predicted speedup of the choice; None for a measurement call (the
        γ = 1 probe, and γ = 0 calls that time the baseline: `GammaController.choose`).
      identical: optional fraction of examples equal to the baseline's tokens.

    Returns:
      {'gamma': 'auto', 'gamma_chosen': {γ: count} (measurement calls included),
      'baseline_timing_examples' (γ = 0 calls that timed the baseline, in gamma_chosen['0']),
      'probe_examples', 'speedup', 'median_example_speedup',
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
    measuring = [g for g, p in zip(chosen, predictions, strict=True) if p is None]
    return {
        "gamma": "auto",
        "gamma_chosen": counts,
        "baseline_timing_examples": sum(1 for g in measuring if g == 0),
        "probe_examples": sum(1 for g in measuring if g > 0),
        "speedup": float(base.sum() / secs.sum()),
        "median_example_speedup": float(np.median(base / secs)),
        "alpha_beta": alpha,
        "alpha_display": "off" if alpha is None else f"{alpha:.2f}",
        "tokens_per_iteration": generated / iterations if iterations else None,
        "predicted_speedup": float(np.mean(known)) if known else None,
        "identical_fraction": identical,
        "speculative_seconds": float(secs.sum()),
    }
