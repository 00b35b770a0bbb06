"""The auto-γ controller: γ in 0..gamma_max chosen before each call, 0 = plain decoding.

Theorem 3.8 maximised (§3.3) with costs measured on this machine (`cost_curve.CostCurve`) and α
learnt online (Corollary 3.6), for whole calls of the observed length; each timed call is checked
against the model of that same call. `GammaConfig` (`gamma_config`, re-exported) holds the knobs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specdec_t5x import theory
from specdec_t5x.auto.gamma_config import GammaConfig
from specdec_t5x.timing import cost_curve

__all__ = ["GammaConfig", "GammaController"]  # GammaConfig re-exported from `gamma_config`


def _mean_variance(total: float, sq_total: float, n: int) -> tuple[float, float]:
    """(mean, sample variance) of n >= 2 values from their Σ and Σ² (variance clipped at 0)."""
    mean = total / n
    return mean, max(sq_total / n - mean * mean, 0.0) * n / (n - 1)


def check_call(name: str, seconds: float, longest_tokens: int, gamma=0, iterations=None) -> None:
    """Raises ValueError unless seconds >= 0 (finite), longest_tokens >= 1 and, for γ >= 1,
    iterations >= 1."""
    bad_speculative = gamma != 0 and (iterations is None or iterations < 1)
    if not np.isfinite(seconds) or seconds < 0 or longest_tokens < 1 or bad_speculative:
        raise ValueError(
            f"{name} needs seconds >= 0, longest_tokens >= 1 and for γ >= 1 iterations >= 1; "
            f"got {seconds!r}, {longest_tokens!r}, γ = {gamma!r}, {iterations!r}."
        )


def running_field(factory):
    """A field of the running state: starts at `factory()`, not a constructor argument."""
    return dataclasses.field(default_factory=factory, init=False)


@dataclasses.dataclass
class GammaController:
    """Chooses γ in 0..gamma_max before each call; learns α, the call length and the model's error.

    Prediction for γ > 0: ρ_b · baseline_call(L) / (ρ_s · speculative_call(γ, η · N(α, γ))),
    the `CostCurve`'s per-call model with α the running mean of β (or `prior_alpha`), L the mean
    tokens of a call's longest row, N the expected iterations at the observed lengths, ρ_b and
    ρ_s measured / modelled wall time of the timed baseline and speculative calls and η counted /
    expected iterations (ρ_s and η per γ, shrunk toward the pooled value). `choose` applies the
    rules `config` sets. Alone they reach γ = 0 only slowly once speculation stops paying, so
    `auto_gamma` puts a `speculation_gate.SpeculationGate` after `choose` and, where the model
    alone would stay off or explore, hands the gate the `best` γ.

    Attributes:
      curve: the measured `CostCurve`; prior_alpha: α before any β (None: probe with γ = 1);
      config: the knobs.
      history: one record per observed call: {'gamma', 'reason', 'predicted', 'alpha', 'ms' (wall
        ms), 'longest_tokens', 'iterations'}.
      The other fields are the running state, commented where they are declared.
    """

    curve: cost_curve.CostCurve
    prior_alpha: float | None = None
    config: GammaConfig = GammaConfig()
    beta_sum: float = running_field(float)  # α: Σ β and its count over all speculative calls
    num_beta: int = running_field(int)
    beta_calls: int = running_field(int)  # speculative calls whose β entered α (n)
    call_alpha_sum: float = running_field(float)  # s_α: Σ and Σ² of the per-call α, and the calls
    call_alpha_sq_sum: float = running_field(float)
    alpha_calls: int = running_field(int)
    explore_calls: int = running_field(int)  # speculative calls chosen by exploring so far
    exploring: bool = running_field(bool)  # whether the last `choose` explored
    speedup_terms: dict = running_field(dict)  # {γ: [calls, Σ base ms, Σ r, Σ r²]}, r: base / wall
    timed_calls: dict = running_field(dict)  # {γ: timed calls} (0: baseline), calibration included
    measured_ms: dict = running_field(dict)  # {'baseline' | 'speculative' | γ: Σ wall, Σ model ms}
    modelled_ms: dict = running_field(dict)
    calibration_ms: dict = running_field(dict)  # {'speculative' | γ: (Σ, Σ)} timed before the run
    longest_tokens: float = running_field(float)  # L: Σ longest-row tokens, calls, {tokens: calls}
    calls: int = running_field(int)
    length_calls: dict = running_field(dict)
    counted_iterations: float = running_field(float)  # η: Σ counted, Σ expected, {γ: (Σ, Σ)}
    expected_iterations: float = running_field(float)
    iterations_by_gamma: dict = running_field(dict)
    calls_since_baseline: int = running_field(int)
    calls_since_speculative: int = running_field(int)
    baseline_ratio_sum: float = running_field(float)  # s_b: Σ and Σ² of measured / modelled
    baseline_ratio_sq_sum: float = running_field(float)
    history: list = running_field(list)
    last_choice: dict = running_field(dict)  # the last `choose`: {'reason', 'alpha', 'predicted'}
    best: tuple = running_field(tuple)  # the last `choose`'s best γ and its prediction, or ()

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
        return n >= self.config.min_timed_calls

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
        n0 = self.config.gamma_prior_calls
        return (n * own + n0 * pooled) / (n + n0)

    def iterations_correction(self, gamma: int) -> float:
        """η of γ: (n_γ·η̂_γ + n0·η) / (n_γ + n0), n0 = `gamma_prior_calls`; the pooled η before."""
        pooled = self.corrections()["iterations"]
        n = self.timed_calls.get(gamma, 0)
        counted, expected = self.iterations_by_gamma.get(gamma, (0.0, 0.0))
        if not self._timed(True) or n == 0 or expected <= 0:
            return pooled
        n0 = self.config.gamma_prior_calls
        return (n * counted / expected + n0 * pooled) / (n + n0)

    def predictions(self, alpha: float) -> dict[int, float]:
        """{γ: predicted speedup} for γ = 0..gamma_max at α, with the learnt L and corrections
        (before any call: the steady-state curve, uncorrected)."""
        L = self.tokens_per_call
        gammas = range(self.curve.gamma_max + 1)
        if L is None:
            return {g: self.curve.predicted_speedup(alpha, g) for g in gammas}
        k = self.corrections()
        base = k["baseline"] * self.curve.baseline_call_ms(L)
        out = {0: 1.0}
        for g in range(1, self.curve.gamma_max + 1):
            iterations = self.iterations_correction(g) * self.iterations_per_call(alpha, g)
            rho = self.speculative_correction(g)
            out[g] = base / (rho * self.curve.speculative_call_ms(g, iterations))
        return out

    def iterations_per_call(self, alpha: float, gamma: int) -> float:
        """Iterations per call of γ at α, before η: `theory.expected_iterations` averaged over the
        observed calls' lengths. Raises ValueError before any call."""
        if not self.length_calls:
            raise ValueError("iterations_per_call needs at least one observed call (lengths).")
        lengths = np.fromiter(self.length_calls, np.int64)
        weights = np.fromiter(self.length_calls.values(), np.float64)
        alpha = min(max(float(alpha), 0.0), 1.0)
        per_length = theory.expected_iterations(lengths, alpha, gamma)
        return float(weights @ per_length / weights.sum())

    def choose(self) -> tuple[int, float | None]:
        """(γ, its predicted speedup) for the next call; `last_choice['reason']` names the rule:
        'probe' (γ = 1 while α is unknown), 'time_baseline' (until timed `min_timed_calls`
        times), 'best' (above `min_speedup`), 'confirmed' (its own calls pay), 'explore' (pays at
        `optimistic_alpha`, within `max_explore_calls`), 'off' (0, or 'retime_speculative' every
        `speculate_every`-th call near break-even), 'retime_baseline'. A `refuted` γ is never
        chosen. Measurement calls return a None prediction; "off" is (0, 1.0)."""
        cfg = self.config
        self.exploring = False
        self.best = ()
        alpha = self.alpha
        if alpha is None:
            return self._chose(1, None, "probe")
        if self._timed(True) and not self._timed(False):
            return self._chose(0, None, "time_baseline")  # before trusting the prediction
        candidates = [g for g in range(1, self.curve.gamma_max + 1) if not self.refuted(g)]
        predicted = self.predictions(alpha)
        # Ties: the smaller γ.
        best = max(candidates, key=lambda g: (predicted[g], -g), default=0)
        self.best = (best, predicted[best]) if best else ()
        explore, reason = False, "off"
        confirmed = {g: m[0] for g in candidates if (m := self.confirmed(g)) is not None}
        if best and predicted[best] > cfg.min_speedup:
            choice, reason = (best, predicted[best]), "best"
        elif confirmed:  # its own calls pay: measurement outranks the model's margin
            gamma = max(confirmed, key=lambda g: (confirmed[g], -g))
            choice, reason = (gamma, predicted[gamma]), "confirmed"
        elif candidates and self.explore_calls < cfg.max_explore_calls:
            optimistic = self.predictions(self.optimistic_alpha)
            gamma = max(candidates, key=lambda g: (optimistic[g], -g))
            explore = optimistic[gamma] > cfg.min_speedup
            choice = (gamma, predicted[gamma]) if explore else (0, 1.0)
            reason = "explore" if explore else "off"
        else:
            choice = 0, 1.0
        if (
            choice[0] == 0
            and best
            and predicted[best] > cfg.retime_min_predicted
            and cfg.speculate_every
            and self.calls_since_speculative + 1 >= cfg.speculate_every
        ):  # off near break-even: re-time the best γ now and then (the machine drifts)
            return self._chose(best, predicted[best], "retime_speculative")
        if choice[0] > 0 and self._timed(False) and self.retime_baseline(choice[1]):
            return self._chose(0, None, "retime_baseline")
        self.exploring = explore
        return self._chose(*choice, reason)

    def _chose(self, gamma: int, predicted: float | None, reason: str) -> tuple[int, float | None]:
        self.last_choice = {"reason": reason, "alpha": self.alpha, "predicted": predicted}
        return gamma, predicted

    def measured_speedup(self, gamma: int) -> tuple[float, float] | None:
        """(ρ_b · Σ baseline_call(L_i) / Σ wall_i, its relative standard error) over γ's own
        timed calls; None before `refute_min_calls` of them and the baseline were timed."""
        terms = self.speedup_terms.get(gamma)
        enough = max(self.config.refute_min_calls, 2)
        if terms is None or terms[0] < enough or not self._timed(False):
            return None
        n, base_ms, r_sum, r_sq_sum = terms
        mean, var = _mean_variance(r_sum, r_sq_sum, n)
        se_b = self.baseline_standard_error() or 0.0
        se = float(np.sqrt(var / n + (mean * se_b) ** 2) / mean)
        rho_b = self.corrections()["baseline"]
        return float(rho_b * base_ms / self.measured_ms[gamma]), se

    def confirmed(self, gamma: int) -> tuple[float, float] | None:
        """γ's `measured_speedup` if it pays even at its lower bound (· (1 − refute_z · se))."""
        measured = self.measured_speedup(gamma)
        if measured is None or measured[0] * (1 - self.config.refute_z * measured[1]) <= 1.0:
            return None
        return measured

    def refuted(self, gamma: int) -> bool:
        """Whether γ's own calls lose even at their upper bound (· (1 + refute_z · se) < 1)."""
        measured = self.measured_speedup(gamma)
        return measured is not None and measured[0] * (1 + self.config.refute_z * measured[1]) < 1.0

    def baseline_standard_error(self) -> float | None:
        """ρ_b's relative standard error s_b / √n_b (None below `retime_min_calls` calls)."""
        n = self.timed_calls.get(0, 0)
        if n < max(self.config.retime_min_calls, 2):
            return None
        mean, var = _mean_variance(self.baseline_ratio_sum, self.baseline_ratio_sq_sum, n)
        return float(np.sqrt(var / n) / mean)

    def retime_baseline(self, predicted: float | None) -> bool:
        """Whether the next call re-times the baseline: every `baseline_every`-th call unless the
        prediction stays above 1 at ρ_b's lower bound; every `max_baseline_every`-th regardless."""
        cfg = self.config
        since = self.calls_since_baseline + 1
        if not cfg.baseline_every or since < cfg.baseline_every:
            return False
        se = self.baseline_standard_error()
        safe = se is not None and predicted is not None and predicted * (1 - cfg.retime_z * se) > 1
        return not safe or (cfg.max_baseline_every > 0 and since >= cfg.max_baseline_every)

    @property
    def alpha_spread_estimate(self) -> float:
        """s_α: the per-call α's spread over m calls, shrunk toward `alpha_spread` with weight
        `spread_prior_calls` (alpha_spread while m < 2)."""
        m = self.alpha_calls
        if m < 2:
            return self.config.alpha_spread
        _, var = _mean_variance(self.call_alpha_sum, self.call_alpha_sq_sum, m)
        n0, spread = self.config.spread_prior_calls, self.config.alpha_spread
        return float(np.sqrt((n0 * spread**2 + (m - 1) * var) / (n0 + m - 1)))

    @property
    def optimistic_alpha(self) -> float | None:
        """α̂ + optimism_z · s_α / √n over n = `beta_calls` (α̂ itself when n = 0), ≤ 1."""
        alpha = self.alpha
        if alpha is None or self.beta_calls == 0:
            return alpha
        margin = self.config.optimism_z * self.alpha_spread_estimate / np.sqrt(self.beta_calls)
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
        """Records one timed call of γ (0: the baseline) against the model of that same call
        (after `update` with its statistics: η uses the running α).

        Args:
          gamma: the call's γ; seconds: its wall time (s); longest_tokens: its longest row's
            tokens (incl. EOS), >= 1; iterations: its counted iterations (required for γ > 0).

        Raises:
          ValueError: negative or non-finite seconds, longest_tokens < 1, or γ > 0 without
            iterations >= 1.
        """
        check_call("observe", seconds, longest_tokens, gamma, iterations)
        if gamma == 0:
            self.time_baseline(seconds, longest_tokens)  # ρ_b, its spread, the timed calls
        else:
            self._observe_speculative(gamma, seconds, longest_tokens, iterations)
        # The re-timing counters, the history and L.
        self.calls_since_baseline = 0 if gamma == 0 else self.calls_since_baseline + 1
        self.calls_since_speculative = 0 if gamma > 0 else self.calls_since_speculative + 1
        choice = self.last_choice or {"reason": None, "alpha": None, "predicted": None}
        iterations = None if iterations is None else int(iterations)
        record = {"gamma": int(gamma), **choice, "ms": 1e3 * float(seconds)}
        self.history.append(
            {**record, "longest_tokens": int(longest_tokens), "iterations": iterations}
        )
        self.last_choice = {}
        self.exploring = False
        self.longest_tokens += int(longest_tokens)
        self.calls += 1
        self.length_calls[int(longest_tokens)] = self.length_calls.get(int(longest_tokens), 0) + 1

    def _observe_speculative(
        self, gamma: int, seconds: float, longest_tokens: int, iterations: int
    ) -> None:
        """`observe`'s part for γ > 0: η, ρ_s, the speed-up terms, the exploration budget."""
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

    def time_baseline(self, seconds: float, longest_tokens: int) -> None:
        """Records a timed baseline call made before the run (the calibration's): it counts
        toward ρ_b, its spread and the timed calls, not L, the history or the re-timing counters.
        Raises ValueError as `observe`."""
        check_call("time_baseline", seconds, longest_tokens)
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
        """Records a timed call of γ >= 1 made before the run (the calibration's): it counts
        toward ρ_s (pooled and γ's) and γ's timed calls, as `time_baseline`'s toward ρ_b, so both
        start from calls of the same moment; not α, η, L, the history or `measured_speedup`.
        Raises ValueError as `observe`."""
        check_call("time_speculative", seconds, longest_tokens, gamma or 1, iterations)
        if gamma < 1:
            raise ValueError(f"time_speculative needs γ >= 1; got {gamma!r}.")
        modelled = self.curve.speculative_call_ms(gamma, iterations)
        for key in ("speculative", gamma):
            measured, model = self.calibration_ms.get(key, (0.0, 0.0))
            self.calibration_ms[key] = (measured + 1e3 * float(seconds), model + modelled)
        self.timed_calls[gamma] = self.timed_calls.get(gamma, 0) + 1

    def _rho(self, key) -> float | None:
        """Σ measured / Σ modelled ms of `key`'s calls ('baseline', 'speculative' or γ),
        calibration included; None while nothing was modelled."""
        measured, modelled = self.calibration_ms.get(key, (0.0, 0.0))
        measured += self.measured_ms.get(key, 0.0)
        modelled += self.modelled_ms.get(key, 0.0)
        return measured / modelled if modelled > 0 else None
