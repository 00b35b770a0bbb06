"""The auto-γ controller's tuning knobs (`GammaConfig`; `gamma_controller` applies them)."""

from __future__ import annotations

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class GammaConfig:
    """Tuning knobs of `GammaController` (the defaults are the eval job's).

    Attributes:
      min_timed_calls: timed baseline and γ > 0 calls before ρ_b, ρ_s and η replace 1.
      baseline_every: while speculating, every n-th call re-times the baseline (0: never) unless
        the prediction · (1 − retime_z · s_b / √n_b) > 1 once `retime_min_calls` were timed;
        max_baseline_every: ... every n-th call regardless (0: never), for drift.
      gamma_prior_calls: weight, in calls, of the pooled ρ_s and η in each γ's own.
      alpha_spread: prior spread of one call's α; spread_prior_calls: its weight, in calls.
      optimism_z: "off" only when no γ pays at α̂ + optimism_z · s_α / √n (once off, α is not
        measured again, so unlucky first calls must not switch a paying pair off).
      min_speedup: predicted speed-up a γ must exceed to be chosen or explored (> 0).
      refute_min_calls, refute_z: a γ whose own calls' speed-up is below 1 even at + refute_z
        standard errors is never chosen again; above 1 at − refute_z it is confirmed.
      max_explore_calls: speculative calls that may be spent exploring (0: never).
      speculate_every: while off with the best γ above `retime_min_predicted`, every n-th call
        runs it (0: never), so that a faster phase of the machine is noticed.
      tree_margin: a tree (`auto_trees.TreeChooser`) is chosen only when measured faster than
        this times the chains' speed-up (> 0).

    Raises:
      ValueError: a knob that is not a finite number >= 0, or min_speedup, tree_margin <= 0.
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
            strict = field.name in ("min_speedup", "tree_margin")  # > 0; the rest >= 0
            check_knob("GammaConfig", field.name, getattr(self, field.name), 0, strict=strict)


def check_knob(owner: str, name: str, value, low: float, *, integer: bool = False,
               strict: bool = False) -> None:  # fmt: skip
    """Raises ValueError naming `owner`.`name` unless `value` is a finite number (an int with
    `integer`; never a bool) >= low (> low with `strict`)."""
    kind = int if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        what = "an int" if integer else "a finite number"
        raise ValueError(
            f"{owner}.{name} must be {what} {'>' if strict else '>='} {low}; got {value!r}."
        )
