"""The measured cost curve of a model pair: T(k), the draft step, the loop work and set-up, in ms.

The paper picks γ by maximising Theorem 3.8 for a known α and c (§3.3). Here every term is measured
on this machine, for this model pair and these shapes, once (cached), in the same in-loop timing as
the eval job's step costs (`step_timer.time_decoder_steps`):

* T(k): the target's cached call on k = 1..γmax + 1 tokens (the verify call of γ = k - 1);
* the draft's one-token step;
* the decode loops' own work (`overheads.measure_loop_ms`: the real loops with zero-cost models):
  s_1 per baseline token and o(γ) per speculative iteration (sampling or argmax, the acceptance
  test, buffer and statistics updates, loop bookkeeping), plus a fixed part per call;
* the per-call set-up (`overheads.measure_setup_ms`): the target's encoder pass and cache
  (both decoders) and the draft's (speculative only).

With u = T(1) + s_1, the baseline's cost per token, the steady-state speedup of γ (long outputs)
is `theory.measured_walltime_improvement(α, γ, c = draft/u, T(γ + 1)/u, o(γ)/u)`; for calls of
L tokens the set-up and fixed parts are added to both sides (`CostCurve.predicted_speedup` with
`tokens_per_call`), which matters when outputs are short and inputs long (summarization: a ~10-token
synopsis of a 256-token description). `auto_gamma` chooses γ from it.
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
      block_step_ms: {k: T(k)} the target's cached call on k tokens, k = 1..gamma_max + 1.
      draft_step_ms: the draft's one-token cached call.
      baseline_sampling_ms: s_1, the baseline loop's own work per token (sampling, bookkeeping).
      sampling_ms: {γ: o(γ)} the speculative loop's own work per iteration, γ = 1..gamma_max.
      target_setup_ms, draft_setup_ms: encoder pass + cache set-up per call (0: not measured).
      baseline_fixed_ms: the baseline loop's fixed work per call.
      speculative_fixed_ms: {γ: the speculative loop's fixed work per call} (missing: 0).
      call_scale: {γ: measured / modelled wall time of real decode calls of γ} (0: the baseline;
        missing: 1), from `calibrated`. The component model composes costs timed in isolation;
        in the real loops the extra draft steps of γ >= 2 cost more than their isolated time
        (measured / predicted fell from ~1.0 at γ = 1 to ~0.9 at γ = 2 and ~0.8 at γ = 5 in every
        Table-2 row measured), which made the model prefer γ = 2 where γ = 1 was faster.
      interference_ms: what one iteration's model calls cost beyond γ lone draft steps and the
        verify call (`step_timer.time_decoder_steps`: the draft reloaded into the CPU's caches
        after each verify call), once per iteration (0: not measured).
      source: where the curve came from: 'measured' in this run, 'cache' (read back from
        `cost_cache.CostCurveCache`) or 'given' (passed in); not part of its equality.
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
        """Predicted speedup of γ (0..gamma_max) at α; 1.0 for γ = 0.

        Args:
          alpha: acceptance rate in [0, 1].
          gamma: γ.
          tokens_per_call: None for the steady state (long outputs:
            `theory.measured_walltime_improvement` with these costs); else the tokens a call
            generates (its longest row), so the per-call set-up and fixed work count on both
            sides and the iterations are tokens / E(α, γ) (Eq. 1).
        """
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
        return {
            "block_step_ms": {str(k): v for k, v in self.block_step_ms.items()},
            "draft_step_ms": self.draft_step_ms,
            "baseline_sampling_ms": self.baseline_sampling_ms,
            "sampling_ms": {str(k): v for k, v in self.sampling_ms.items()},
            "target_setup_ms": self.target_setup_ms,
            "draft_setup_ms": self.draft_setup_ms,
            "baseline_fixed_ms": self.baseline_fixed_ms,
            "speculative_fixed_ms": {str(k): v for k, v in self.speculative_fixed_ms.items()},
            "call_scale": {str(k): v for k, v in self.call_scale.items()},
            "interference_ms": self.interference_ms,
            "c": self.c,
            "source": self.source,
        }


def calibrated(curve: CostCurve, calls: Mapping[int, Any]) -> CostCurve:
    """`curve` with `call_scale` from timed real decode calls.

    γ = 0 (the baseline): the median of measured / modelled over its calls. γ >= 1: the medians of
    each γ's calls, smoothed by a least-squares line in γ through them when three or more γ were
    timed (with two the line passes through both). The model's error changes steadily with γ
    (measured / modelled fell from ~1.0 at γ = 1 to ~0.8 at γ = 5 in every Table-2
    row), while a few calls of one example scatter each γ's median by ~5 % on this CPU: the line
    keeps the trend and averages the scatter (Table 2 En→De at T = 1 once: per-γ medians
    made γ = 4 look 7 % cheaper than γ = 2, auto kept γ = 4 and ran 0.93× the best fixed γ).

    Args:
      curve: the composed `CostCurve`.
      calls: {γ: [(wall seconds, longest row's tokens, counted iterations or None), ...]} (γ = 0:
        the baseline; iterations required for γ >= 1), e.g. a few interleaved rounds of each
        γ's real decode on the first batch (`auto_gamma.AutoGammaDecoder`).

    Raises:
      ValueError: a γ outside 0..gamma_max, no calls for a γ, or a call without what its model
        needs (tokens >= 1; iterations >= 1 for γ >= 1).
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


def measure_cost_curve(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array,
    max_decode_len: int,
    gamma_max: int,
    settings: Mapping[str, Any],
    verification: str = "token",
    repeats: int = 20,
    baseline_sampler: str = "t5x",
    progress: Callable[[str], None] | None = None,
) -> CostCurve:
    """The `CostCurve` of this model pair and shape; measured once per process, then cached.

    `progress(stage)`, if given, is called as each measurement starts ('step costs', 'set-up',
    'loop work', 'in-loop costs'; `cost_cache.Heartbeat` logs the current one every 30 s).

    The cache key is the model pair (object identity), the batch and encoder shape, the decode
    length, gamma_max, the sampling settings, the verification rule and the baseline's draw. T(k) is the step timer's
    (`step_costs`) brought to what the decode loops pay (`loop_costs` at γ = gamma_max: T(1) from
    the baseline loop, k >= 2 scaled by the loop's verify call over the timer's T(gamma_max + 1));
    the draft's step is its lone step, plus the loop's interference once per iteration.

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
        loop_work = measure_loop_work_ms(
            encoder_input_tokens.shape[0],
            spec_model.module.config.vocab_size,
            max_decode_len,
            gamma_max,
            settings,
            spec_model.eos_id,
            verification,
            repeats,
            baseline_sampler,
        )
        # The step timer's loops price the target's calls below what the decode loops pay
        # (`loop_costs`): T(1) is taken from the baseline loop, and the k >= 2 calls are scaled by
        # the decode loop's verify call over the step timer's at k = gamma_max + 1.
        progress("in-loop costs")
        in_loop = loops.loop_costs(
            *pair,
            gamma_max,
            settings,
            costs,
            repeats=max(3, repeats // 2),
            verification=verification,
            baseline_sampler=baseline_sampler,
        )
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


def measure_loop_work_ms(
    batch: int,
    vocab: int,
    max_decode_len: int,
    gamma_max: int,
    settings: Mapping[str, Any],
    eos_id: int,
    verification: str = "token",
    repeats: int = 20,
    baseline_sampler: str = "t5x",
) -> dict[str, Any]:
    """The decode loops' own work for γ = 1..gamma_max (`overheads.measure_loop_ms`), in ms.

    `baseline_sampler` is the baseline's draw (`decoding.SAMPLERS`): its sampling work per token.

    Measured at γ = 1 and γ = gamma_max (real loops, zero-cost models) and interpolated linearly
    in γ between them (the per-iteration work is γ draft samples plus a fixed part).

    Returns:
      `CostCurve` keyword arguments: 'baseline_sampling_ms' (s_1 per token), 'sampling_ms' ({γ: o(γ)}
      per iteration), 'baseline_fixed_ms', 'speculative_fixed_ms' ({γ: per call}).
    """
    ends = sorted({1, gamma_max})
    measured = {
        g: overheads.measure_loop_ms(
            batch,
            vocab,
            max_decode_len,
            g,
            settings,
            eos_id,
            repeats,
            verification=verification,
            baseline_sampler=baseline_sampler,
        )
        for g in ends
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
