"""Auto γ's gate: a run starts on the baseline and speculates only on its own timed evidence.

The controller's curve is measured before the run; a short run or a machine whose load changed
can lose before any of its rules fires (a 5-example demo ran 0.69x:
experiments/auto_gamma_short_runs). `SpeculationGate` compares measured wall time only:

* off (the start): the baseline, except every `explore_every`-th call, which runs the
  controller's plan (the interval doubles after each failed verdict, up to `max_backoff` times);
  after `evidence_calls` explored calls, on if their speed-up exceeds `margin`;
* on: the plan runs; off as soon as the last `window` speculative calls' speed-up is below 1
  against `judge_calls` baseline calls timed since the window began (their median; where fewer
  were, it re-times the baseline first); the baseline is re-timed every `refresh_every` calls.

A set of speculative calls' speed-up is ρ · Σ baseline_ms(L_i) / Σ wall_i (L_i their longest
rows' tokens, baseline_ms the curve's baseline call, ρ the median measured / modelled of the last
`baseline_calls` baseline calls). Bound: once every speculative call loses, the gate is off
within N = W + J + ⌈W / (R − 1)⌉ calls (W = `window`, J = `judge_calls`, R = `refresh_every`;
12 with the defaults, at most 8 of them speculative: `GateConfig.bound_calls`).

Why a window of 8 judged against 3 fresh baseline calls: single calls scatter (on the shipped pair,
one call's speed-up against the run's baseline ran 0.75-1.46 between its 10th and 90th percentile,
quiet), and with a window of 4 judged against one fresh call a pair paying 1.15X was switched
off at about every second re-timing, which held auto γ to 0.90x the best fixed γ
(results/auto_check/); the longer window and fresh median make such false verdicts rare.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable

from specdec_t5x.auto.gamma_config import check_knobs, knob


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """Knobs of `SpeculationGate` (its module docstring: the rules and their bound).

    Attributes:
      explore_every (>= 2), evidence_calls (>= 1), margin (> 0), window (W, >= 1),
      baseline_calls (B, >= 1), refresh_every (R, >= 2), max_backoff (>= 1), judge_calls (J,
      >= 1: fresh baseline calls a full window is judged against).

    Raises:
      ValueError: a knob out of its range.
    """

    explore_every: int = knob(4, 2, integer=True)
    evidence_calls: int = knob(2, 1, integer=True)
    margin: float = knob(1.02, strict=True)
    window: int = knob(8, 1, integer=True)
    baseline_calls: int = knob(5, 1, integer=True)
    refresh_every: int = knob(16, 2, integer=True)
    max_backoff: int = knob(8, 1, integer=True)
    judge_calls: int = knob(3, 1, integer=True)

    def __post_init__(self):
        check_knobs(self)

    @property
    def bound_calls(self) -> int:
        """N in calls: W speculative calls, the J re-timings that judge them and the periodic
        re-timings among them."""
        return self.window + self.judge_calls + math.ceil(self.window / (self.refresh_every - 1))


def _speculative(plan) -> bool:
    return plan != 0  # γ >= 1


class SpeculationGate:
    """Lets the controller's plan run only while the run's own timed calls show it pays.

    Args:
      baseline_ms: modelled wall ms of a baseline call of L tokens (`CostCurve.baseline_call_ms`).
      config: the knobs (None: `GateConfig()`).

    `choose(plan)` before a call, `observe(plan, seconds, longest_tokens)` after it. `history`:
    per call {'plan', 'on', 'reason', 'speedup' (None for a baseline call)}.
    """

    def __init__(self, baseline_ms: Callable[[float], float], config: GateConfig | None = None):
        self.baseline_ms = baseline_ms
        self.config = GateConfig() if config is None else config
        self.on = False
        self.interval = self.config.explore_every
        self.since_explore = 0
        self.since_baseline = 0
        self.ratios: collections.deque = collections.deque(maxlen=self.config.baseline_calls)
        # Baseline calls' (call number, measured / modelled), enough to cover a window.
        self.baseline_log: collections.deque = collections.deque(
            maxlen=self.config.window + self.config.baseline_calls + self.config.judge_calls
        )
        # Speculative calls: (modelled baseline ms, wall ms, call number).
        self.evidence: list[tuple[float, float, int]] = []  # explored calls while off
        self.window: collections.deque = collections.deque(maxlen=self.config.window)
        self.verdicts: list[dict] = []  # {'call', 'on', 'speedup'} at each switch decision
        self.history: list[dict] = []
        self.calls = 0
        self.pending = False  # a full losing window waits for a fresh baseline call
        self._reason: str | None = None

    @property
    def reference(self) -> float | None:
        """ρ: median measured / modelled of the last `baseline_calls` baseline calls (None: none)."""
        return statistics.median(self.ratios) if self.ratios else None

    def speedup(self, calls, rho: float | None = None) -> float | None:
        """ρ · Σ baseline ms / Σ wall ms over [(baseline ms, wall ms, call)] (ρ: the reference
        unless given; None: no reference)."""
        rho = self.reference if rho is None else rho
        wall = sum(c[1] for c in calls)
        if rho is None or not calls or wall <= 0:
            return None
        return rho * sum(c[0] for c in calls) / wall

    def choose(self, plan):
        """(plan to run, reason or None): the controller's `plan` unless the gate overrides it
        ('gate_baseline': no baseline reference yet; 'gate_refresh': re-time the baseline while
        on; 'gate_off': off and no exploration due) or marks it ('gate_explore')."""
        cfg = self.config
        if not _speculative(plan):
            reason = None
        elif self.reference is None:
            plan, reason = 0, "gate_baseline"
        elif self.on:
            due = self.pending or self.since_baseline + 1 >= cfg.refresh_every
            plan, reason = (0, "gate_refresh") if due else (plan, None)
        elif self.since_explore + 1 >= self.interval:
            reason = "gate_explore"
        else:
            plan, reason = 0, "gate_off"
        self._reason = reason
        return plan, reason

    def observe(self, plan, seconds: float, longest_tokens: int) -> None:
        """Records a timed call of `plan` (0: the baseline): the reference, the evidence or the
        window, and the switch decisions they give."""
        cfg = self.config
        self.calls += 1
        model = float(self.baseline_ms(max(int(longest_tokens), 1)))
        wall = 1e3 * float(seconds)
        speedup = None
        if not _speculative(plan):
            if model > 0 and wall > 0:
                self.ratios.append(wall / model)
                self.baseline_log.append((self.calls, wall / model))
                if self.pending:  # judge the window against the fresh calls (or ask another)
                    self._judge()
            else:
                self.pending = False
            self.since_baseline = 0
            self.since_explore += 1
        else:
            self.since_baseline += 1
            call = (model, wall, self.calls)
            speedup = self.speedup([call])
            if self.on:
                self.window.append(call)
                if len(self.window) == cfg.window:
                    self._judge()
            else:
                self.since_explore = 0
                self.evidence.append(call)
                if len(self.evidence) >= cfg.evidence_calls:
                    measured = self.speedup(self.evidence)
                    if measured is not None and measured > cfg.margin:
                        self._switch(True, measured)
                        self.window.extend(self.evidence)
                        self.interval = cfg.explore_every
                    else:
                        self.verdicts.append({"call": self.calls, "on": False, "speedup": measured})
                        top = cfg.explore_every * cfg.max_backoff
                        self.interval = min(2 * self.interval, top)
                    self.evidence = []
        self.history.append(
            {"plan": plan, "on": self.on, "reason": self._reason, "speedup": speedup}
        )
        self._reason = None

    def _judge(self) -> None:
        """Off if the full window's speed-up is below 1 against the baseline calls timed since
        its first call (their median ratio); fewer than `judge_calls`: the next call re-times the
        baseline if the window loses against the reference."""
        during = [r for i, r in self.baseline_log if i > self.window[0][2]]
        if len(during) < self.config.judge_calls:
            measured = self.speedup(list(self.window))
            self.pending = measured is not None and measured < 1.0
            return
        self.pending = False
        measured = self.speedup(list(self.window), rho=statistics.median(during))
        if measured is not None and measured < 1.0:
            self._switch(False, measured)
            self.interval = self.config.explore_every

    def _switch(self, on: bool, measured: float) -> None:
        self.on = on
        self.verdicts.append({"call": self.calls, "on": on, "speedup": measured})
        self.window.clear()
        self.evidence = []
        self.since_explore = 0
        self.pending = False
