"""The auto-γ controller's tuning knobs (`GammaConfig`), each with the rule it sets and why.

`gamma_controller.GammaController` applies them (and re-exports `GammaConfig`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class GammaConfig:
    """Tuning knobs of `GammaController` (the defaults are the eval job's): each rule and why.

    Attributes:
      min_timed_calls: timed calls of the baseline, and of γ > 0, before their corrections (ρ_b;
        ρ_s, η) replace 1; after the probe the baseline is timed this often.
      baseline_every: while speculating, every n-th call re-times the baseline (0: never), so
        that ρ_b comes from calls spread over the run, as ρ_s does, not from a few early ones.
      max_baseline_every: ... every n-th call even while that is safe (below; 0: never): drift.
      retime_min_calls: baseline timings before their spread s_b is trusted; then re-timing is
        skipped while the chosen γ's prediction · (1 − retime_z · s_b / √n_b) > 1 (ρ_b scales
        every γ > 0 alike: a re-timing could not switch speculation off).
      retime_z: the multiple of ρ_b's relative standard error there (1.645: one-sided 95 %).
      gamma_prior_calls: weight, in calls, of the pooled ρ_s and η in each γ's own: the model's
        error differs between γ, and a γ timed a few times must not be judged on those alone.
      alpha_spread: assumed spread (standard deviation) of one call's α around the run's α.
      optimism_z: the exploration margin's multiple of s_α / √n. "Off" only when no γ pays even
        at α̂ + optimism_z · s_α / √n (optimism under uncertainty, as in UCB bandits): once off,
        α is not measured again, so unlucky first calls must not switch a paying pair off.
      spread_prior_calls: weight, in calls, of `alpha_spread` in the estimated s_α (the margin
        follows the measured per-call spread, which differs per task and temperature).
      min_speedup: predicted speed-up a γ must exceed to be chosen or explored (> 0): the model
        errs by a few per cent, and near break-even "off" costs at most this margin.
      refute_min_calls: timed calls of a γ before its own measured speed-up counts.
      refute_z: that speed-up's multiple of its relative standard error. Below 1 even at its
        upper bound: refuted, never chosen again (optimism cannot outvote a γ's own calls);
        above 1 at its lower bound: confirmed, chosen when no prediction clears `min_speedup`.
      max_explore_calls: speculative calls that may be spent exploring (0: never). Near
        break-even the margin closes only after n ≈ (z · s_α / Δα)² losing calls; a dozen pin α̂
        to ±0.1 at s_α = 0.2, which is what exploring is for.
      speculate_every: while off with the best γ predicted above `retime_min_predicted`, every
        n-th call runs it (0: never), so that a faster phase of the machine is noticed.
      retime_min_predicted: that prediction threshold (near break-even, within the model's error).
      tree_margin: with token trees among the plans (`auto_trees.TreeChooser`), a tree is chosen
        only when its measured speed-up exceeds this times the chains' (the chosen γ's prediction,
        its measured speed-up if confirmed, 1 when off): a tree has no model, so its few timed
        calls scatter by a few per cent and a near tie must stay with the modelled chain.

    Raises:
      ValueError: a knob that is not a finite number >= 0, or min_speedup <= 0.
    """

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
    speculate_every: int = 8
    retime_min_predicted: float = 0.95
    tree_margin: float = 1.02

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"GammaConfig.{field.name} must be a finite number >= 0; got {value!r}."
                )
        if self.min_speedup <= 0:
            raise ValueError(f"min_speedup must be a finite number > 0; got {self.min_speedup!r}.")
        if self.tree_margin <= 0:
            raise ValueError(f"tree_margin must be a finite number > 0; got {self.tree_margin!r}.")
