"""The measured cost curve of a model pair: T(k), the draft step, the loop work and set-up, in ms.

Measured once per process for a model pair and shape, in the eval job's in-loop timing:
T(k), the target's cached call on k = 1..γmax + 1 tokens; the draft's step; the decode loops' own
work per token or iteration and per call (`overheads.measure_loop_ms`); the per-call set-up
(`overheads.measure_setup_ms`). With u = T(1) + s_1 (the baseline's cost per token), γ's
steady-state speedup is `theory.measured_walltime_improvement(α, γ, draft/u, T(γ + 1)/u,
o(γ)/u)`; for calls of L tokens the set-up and fixed parts count on both sides (short outputs of
long inputs). Auto γ (`auto.auto_gamma`) chooses γ from it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from specdec_t5x import theory
from specdec_t5x.timing import loops, overheads, step_timer

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class CostCurve:
    """Measured costs of one model pair at one shape (milliseconds, medians).

    Attributes:
      block_step_ms: {k: T(k)}, k = 1..gamma_max + 1; draft_step_ms: the draft's step.
      baseline_sampling_ms: s_1, the baseline loop's own work per token.
      sampling_ms: {γ: o(γ)} the speculative loop's own work per iteration, γ = 1..gamma_max.
      target_setup_ms, draft_setup_ms: encoder pass + cache set-up per call (0: not measured).
      baseline_fixed_ms, speculative_fixed_ms ({γ: ms}; missing: 0): the loops' work per call.
      call_scale: {γ: measured / modelled wall time of real calls} (0: the baseline; missing: 1),
        from `calibrated`: in the real loops γ >= 2's extra draft steps cost more than alone.
      interference_ms: what an iteration's model calls cost beyond γ lone draft steps and the
        verify call (the draft reloaded into the CPU's caches), per iteration (0: not measured).
      source: 'measured', 'cache' (`cost_cache.CostCurveCache`) or 'given'; not compared.
    """

    block_step_ms: Mapping[int, float]
    draft_step_ms: float
    baseline_sampling_ms: float
    sampling_ms: Mapping[int, float]
    target_setup_ms: float = 0.0
    draft_setup_ms: float = 0.0
    baseline_fixed_ms: float = 0.0
    speculative_fixed_ms: Mapping[int, float] = dataclasses.field(default_factory=dict)
    call_scale: Mapping[int, float] = dataclasses.field(default_factory=dict)
    interference_ms: float = 0.0
    source: str = dataclasses.field(default="measured", compare=False)

    @property
    def gamma_max(self) -> int:
        return max(self.sampling_ms)

    @property
    def unit_ms(self) -> float:
        """u = T(1) + s_1: the baseline's cost per token."""
        return self.block_step_ms[1] + self.baseline_sampling_ms

    @property
    def c(self) -> float:
        """Draft step / u (the paper's c, against the baseline's per-token cost)."""
        return self.draft_step_ms / self.unit_ms

    def iteration_ms(self, gamma: int) -> float:
        """One speculative iteration of γ >= 1: γ draft steps + interference + T(γ + 1) + o(γ), ms."""
        return (
            gamma * self.draft_step_ms
            + max(self.interference_ms, 0.0)
            + self.block_step_ms[gamma + 1]
            + self.sampling_ms[gamma]
        )

    def baseline_call_ms(self, tokens: float) -> float:
        """Modelled wall ms of one baseline call whose longest row generates `tokens` tokens."""
        scale = self.call_scale.get(0, 1.0)
        return scale * (self.target_setup_ms + self.baseline_fixed_ms + tokens * self.unit_ms)

    def speculative_call_ms(self, gamma: int, iterations: float) -> float:
        """Modelled wall ms of one speculative call of γ >= 1 running `iterations` iterations."""
        fixed = (
            self.target_setup_ms + self.draft_setup_ms + self.speculative_fixed_ms.get(gamma, 0.0)
        )
        return self.call_scale.get(gamma, 1.0) * (fixed + iterations * self.iteration_ms(gamma))

    def predicted_speedup(
        self, alpha: float, gamma: int, tokens_per_call: float | None = None
    ) -> float:
        """Predicted speedup of γ (0..gamma_max; 1.0 for 0) at α in [0, 1]: the steady state
        (`theory.measured_walltime_improvement`) when `tokens_per_call` is None, else for calls
        of that many tokens (the longest row's; iterations tokens / E(α, γ), Eq. 1)."""
        if gamma == 0:
            return 1.0
        if tokens_per_call is None:
            scale = self.call_scale.get(0, 1.0) / self.call_scale.get(gamma, 1.0)
            return scale * float(
                theory.measured_walltime_improvement(
                    alpha,
                    gamma,
                    self.c,
                    self.block_step_ms[gamma + 1] / self.unit_ms,
                    (self.sampling_ms[gamma] + max(self.interference_ms, 0.0)) / self.unit_ms,
                )
            )
        per_iteration = theory.expected_tokens_per_iteration(min(alpha, 1.0 - 1e-9), gamma)
        iterations = tokens_per_call / float(per_iteration)
        return self.baseline_call_ms(tokens_per_call) / self.speculative_call_ms(gamma, iterations)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values ({γ or k: ms} keys as strings), 'c' before 'source'."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out = {k: {str(g): x for g, x in v.items()} if isinstance(v, Mapping) else v
               for k, v in out.items() if k != "source"}  # fmt: skip
        return {**out, "c": self.c, "source": self.source}


def calibrated(curve: CostCurve, calls: Mapping[int, Any]) -> CostCurve:
    """`curve` with `call_scale` from timed real decode calls: γ = 0 the median of measured /
    modelled over its calls; γ >= 1 each γ's median, smoothed by a least-squares line in γ when
    three or more γ were timed (the model's error changes steadily with γ; one example's calls
    scatter each median by ~5 %).

    Args:
      curve: the composed `CostCurve`.
      calls: {γ: [(wall seconds, longest row's tokens, counted iterations or None), ...]} (γ = 0:
        the baseline; iterations required for γ >= 1).

    Raises:
      ValueError: a γ outside 0..gamma_max, no calls for a γ, or a call without tokens >= 1 (and
        iterations >= 1 for γ >= 1).
    """
    scale = dict(curve.call_scale)
    base = dataclasses.replace(curve, call_scale={})  # the composed model, unscaled
    for gamma, timed in calls.items():
        if gamma not in range(curve.gamma_max + 1) or not timed:
            raise ValueError(
                f"calibration calls must be non-empty for γ in 0..{curve.gamma_max}; got γ = "
                f"{gamma!r} with {len(timed) if timed else 0} calls."
            )
        ratios = []
        for seconds, tokens, iterations in timed:
            if tokens < 1 or (gamma > 0 and (iterations is None or iterations < 1)):
                raise ValueError(
                    f"a calibration call of γ = {gamma} needs tokens >= 1 and, for γ >= 1, "
                    f"iterations >= 1; got tokens={tokens!r}, iterations={iterations!r}."
                )
            model = (
                base.baseline_call_ms(tokens)
                if gamma == 0
                else base.speculative_call_ms(gamma, iterations)
            )
            ratios.append(1e3 * seconds / model)
        scale[gamma] = float(statistics.median(ratios))
    drafting = sorted(g for g in calls if g > 0)
    if len(drafting) >= 3:
        slope, intercept = np.polyfit(drafting, [scale[g] for g in drafting], 1)
        for g in drafting:
            scale[g] = float(intercept + slope * g)
    return dataclasses.replace(curve, call_scale=scale)


_CURVES: dict[tuple, CostCurve] = {}


def measure_cost_curve(spec_model, target_params, draft_params, encoder_input_tokens: Array,
                       max_decode_len: int, gamma_max: int, settings: Mapping[str, Any],
                       verification: str = "token", repeats: int = 20,
                       baseline_sampler: str = "t5x",
                       progress: Callable[[str], None] | None = None) -> CostCurve:  # fmt: skip
    """The `CostCurve` of this model pair and shape; measured once per process, then cached (key:
    the pair's identity, encoder shape, decode length, gamma_max, settings, verification, the
    baseline's draw). T(k) is the step timer's brought to what the decode loops pay
    (`loops.loop_costs` at gamma_max: T(1) from the baseline loop, k >= 2 scaled by the loop's
    verify call over the timer's T(gamma_max + 1)); the draft step is its lone step, plus the
    loop's interference per iteration. `progress(stage)` is called as each measurement starts.

    Args:
      encoder_input_tokens: int32 [batch, enc_len]; settings: {'temperature', 'topk', 'topp'};
        the rest as `loops.loop_costs`'.

    Raises:
      ValueError: gamma_max < 1.
    """
    if not isinstance(gamma_max, int) or gamma_max < 1:
        raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
    key = (
        id(spec_model),
        id(spec_model.draft),
        tuple(encoder_input_tokens.shape),
        max_decode_len,
        gamma_max,
        tuple(sorted(settings.items())),
        verification,
        baseline_sampler,
    )
    if key not in _CURVES:
        progress = progress or (lambda stage: None)
        pair = (spec_model, target_params, draft_params, encoder_input_tokens, max_decode_len)
        progress("step costs")
        costs = step_timer.step_costs(
            *pair, gamma_max, repeats=repeats, block_sizes=range(1, gamma_max + 2)
        )
        progress("set-up")
        setup = overheads.measure_setup_ms(
            spec_model, target_params, draft_params, encoder_input_tokens, max_decode_len, repeats
        )
        progress("loop work")
        shape = (encoder_input_tokens.shape[0], spec_model.module.config.vocab_size)
        loop_work = measure_loop_work_ms(
            *shape, max_decode_len, gamma_max, settings, spec_model.eos_id, verification,
            repeats, baseline_sampler,
        )  # fmt: skip
        progress("in-loop costs")
        in_loop = loops.loop_costs(
            *pair, gamma_max, settings, costs, repeats=max(3, repeats // 2),
            verification=verification, baseline_sampler=baseline_sampler,
        )  # fmt: skip
        scale = in_loop["verify_step_ms"] / costs["block_step_ms"][gamma_max + 1]
        blocks = {
            k: in_loop["target_step_ms"] if k == 1 else ms * scale
            for k, ms in costs["block_step_ms"].items()
        }
        _CURVES[key] = CostCurve(
            blocks,
            costs["draft_step_ms"],
            interference_ms=in_loop["interference_ms"],
            target_setup_ms=setup["target_setup_ms"],
            draft_setup_ms=setup["draft_setup_ms"],
            **loop_work,
        )
    return _CURVES[key]


def measure_loop_work_ms(batch: int, vocab: int, max_decode_len: int, gamma_max: int,
                         settings: Mapping[str, Any], eos_id: int, verification: str = "token",
                         repeats: int = 20, baseline_sampler: str = "t5x") -> dict[str, Any]:  # fmt: skip
    """The decode loops' own work for γ = 1..gamma_max, in ms: `overheads.measure_loop_ms` at
    γ = 1 and gamma_max, linear in γ between them. Returns `CostCurve` keyword arguments
    ('baseline_sampling_ms', 'sampling_ms', 'baseline_fixed_ms', 'speculative_fixed_ms')."""
    ends = sorted({1, gamma_max})
    kw = dict(verification=verification, baseline_sampler=baseline_sampler)
    shape = (batch, vocab, max_decode_len)
    measured = {
        g: overheads.measure_loop_ms(*shape, g, settings, eos_id, repeats, **kw) for g in ends
    }

    def line(name):
        lo, hi = measured[ends[0]][name], measured[ends[-1]][name]
        span = max(ends[-1] - ends[0], 1)
        return {g: lo + (hi - lo) * (g - ends[0]) / span for g in range(1, gamma_max + 1)}

    return {
        "baseline_sampling_ms": statistics.mean(
            m["baseline_per_token_ms"] for m in measured.values()
        ),
        "baseline_fixed_ms": statistics.mean(m["baseline_fixed_ms"] for m in measured.values()),
        "sampling_ms": line("speculative_per_iteration_ms"),
        "speculative_fixed_ms": line("speculative_fixed_ms"),
    }
