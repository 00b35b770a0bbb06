"""The auto-γ controller's tuning knobs (`GammaConfig`; `gamma_controller` applies them)."""

from __future__ import annotations

import dataclasses
import math
import numbers


def knob(default, low: float = 0, *, integer: bool = False, strict: bool = False):
    """A config field that `check_knobs` bounds: >= low (> low with `strict`), an int with
    `integer` (a field declared plainly: a finite number >= 0)."""
    return dataclasses.field(
        default=default, metadata={"low": low, "integer": integer, "strict": strict}
    )


def check_knobs(config, strict_fields: tuple[str, ...] = ()) -> None:
    """Raises ValueError naming the first field of the dataclass `config` that is not a finite
    number (an int where `knob` says so; never a bool) within its `knob` bound (> 0 for the
    fields named in `strict_fields`)."""
    for field in dataclasses.fields(config):
        low = field.metadata.get("low", 0)
        strict = field.name in strict_fields or field.metadata.get("strict", False)
        integer, value = field.metadata.get("integer", False), getattr(config, field.name)
        kind = int if integer else numbers.Real
        ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low or (strict and value == low):
            what, op = ("an int" if integer else "a finite number"), (">" if strict else ">=")
            name = type(config).__name__
            raise ValueError(f"{name}.{field.name} must be {what} {op} {low}; got {value!r}.")


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

    def __post_init__(self):
        check_knobs(self, strict_fields=("min_speedup",))
