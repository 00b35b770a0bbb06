"""The measured cost curve of a model pair: T(k), the draft step, the loop work and set-up, in ms.

The paper picks γ by maximising Theorem 3.8 for a known α and c (§3.3). Here every term is measured
on this machine, for this model pair and these shapes, once (cached), in the same in-loop timing as
the eval job's step costs (`benchmark.time_decoder_steps`):

* T(k): the target's cached call on k = 1..γmax + 1 tokens (the verify call of γ = k - 1);
* the draft's one-token step;
* the decode loops' own work (`time_budget.measure_loop_ms`: the real loops with zero-cost models):
  s_1 per baseline token and o(γ) per speculative iteration (sampling or argmax, the acceptance
  test, buffer and statistics updates, loop bookkeeping), plus a fixed part per call;
* the per-call set-up (`time_budget.measure_setup_ms`): the target's encoder pass and cache
  (both decoders) and the draft's (speculative only).

With u = T(1) + s_1, the baseline's cost per token, the steady-state speedup of γ (long outputs)
is `theory.measured_walltime_improvement(α, γ, c = draft/u, T(γ + 1)/u, o(γ)/u)`; for calls of
L tokens the set-up and fixed parts are added to both sides (`CostCurve.predicted_speedup` with
`tokens_per_call`), which matters when outputs are short and inputs long (summarization: a ~10-token
synopsis of a 256-token description). `gamma_control` chooses γ from it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import (
    benchmark,
    decoding,
    drafts,
    models,
    speculative,
    steps,
    theory,
    time_budget,
)

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
        Table-2 row of session 7), which made the model prefer γ = 2 where γ = 1 was faster.
      interference_ms: what one iteration's model calls cost beyond γ lone draft steps and the
        verify call (`benchmark.time_decoder_steps`: the draft reloaded into the CPU's caches
        after each verify call), once per iteration (0: not measured).
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
        }


def calibrated(curve: CostCurve, calls: Mapping[int, Any]) -> CostCurve:
    """`curve` with `call_scale` from timed real decode calls.

    γ = 0 (the baseline): the median of measured / modelled over its calls. γ >= 1: the medians of
    each γ's calls, smoothed by a least-squares line in γ through them when three or more γ were
    timed (with two the line passes through both). The model's error changes steadily with γ
    (session 7: measured / modelled fell from ~1.0 at γ = 1 to ~0.8 at γ = 5 in every Table-2
    row), while a few calls of one example scatter each γ's median by ~5 % on this CPU: the line
    keeps the trend and averages the scatter (session 9, Table 2 En→De at T = 1: per-γ medians
    made γ = 4 look 7 % cheaper than γ = 2, auto kept γ = 4 and ran 0.93× the best fixed γ).

    Args:
      curve: the composed `CostCurve`.
      calls: {γ: [(wall seconds, longest row's tokens, counted iterations or None), ...]} (γ = 0:
        the baseline; iterations required for γ >= 1), e.g. a few interleaved rounds of each
        γ's real decode on the first batch (`gamma_control.AutoGammaDecoder`).

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


def _packed(spec_model, target_params, draft_params):
    """(target params, draft params) packed for the CPU kernel (no-op when off or packed)."""
    weight_dtype = getattr(spec_model, "cpu_weight_dtype", "float32")
    target_params = steps.pack_params(spec_model.module, target_params, weight_dtype)
    draft = spec_model.draft
    if hasattr(draft, "pack_params"):
        draft_params = draft.pack_params(draft_params)
    return target_params, draft_params


def _caches(spec_model, target_params, draft_params, enc, max_decode_len):
    """(target cache, draft cache) of packed parameters for int32 [batch, enc_len] sources."""
    module, draft = spec_model.module, spec_model.draft
    target_cache = jax.jit(lambda tp, e: steps.prepare_cache(module, tp, e, max_decode_len))(
        target_params, enc
    )
    encoded = None
    if getattr(draft, "shares_target_encoder", False):  # its cache reads the target's encoding
        encoded = jax.jit(lambda tp, e: steps.encode(module, tp, e))(target_params, enc)
    draft_cache = jax.jit(lambda dp, e, x: draft.init_cache(dp, e, max_decode_len, x))(
        draft_params, enc, encoded
    )
    return target_cache, draft_cache


def _prepared(spec_model, target_params, draft_params, encoder_input_tokens, max_decode_len):
    """(enc, packed target params, packed draft params, target cache, draft cache), built once."""
    enc = jnp.asarray(encoder_input_tokens)
    # Packed once here for the CPU kernel (no-op when off): the steps run in the timed loops.
    target_params, draft_params = _packed(spec_model, target_params, draft_params)
    target_cache, draft_cache = _caches(
        spec_model, target_params, draft_params, enc, max_decode_len
    )
    return enc, target_params, draft_params, target_cache, draft_cache


def step_costs(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array,
    max_decode_len: int,
    gamma: int,
    *,
    position: int = 8,
    repeats: int = 30,
    block_sizes=(),
) -> dict[str, Any]:
    """c, the verify-cost ratio and T(k) of a model pair, on caches built once (not timed).

    One cached target step, one draft step, one γ + 1 verify step and one target call per k in
    `block_sizes`, at decoder position `position`, caches built from `encoder_input_tokens` (int32
    [batch, enc_len]); timed by `benchmark.time_decoder_steps`.

    Returns:
      `benchmark.time_decoder_steps`'s dict (`c`, `verify_cost_ratio`, `*_step_ms`,
      `block_step_ms`).
    """
    enc, target_params, draft_params, target_cache, draft_cache = _prepared(
        spec_model, target_params, draft_params, encoder_input_tokens, max_decode_len
    )
    module, draft = spec_model.module, spec_model.draft

    def draft_step(dp, e, tokens, pos, cache):
        return draft.make_step(dp, e)(tokens, pos, cache)  # the cache is built once, above

    largest = max([gamma + 1, *block_sizes])
    return benchmark.time_decoder_steps(
        benchmark.decoder_step(module),
        (target_params, enc),
        target_cache,
        draft_step,
        (draft_params, enc),
        draft_cache,
        batch=enc.shape[0],
        position=max(0, min(position, max_decode_len - largest)),
        gamma=gamma,
        repeats=repeats,
        block_sizes=tuple(block_sizes),
    )


_CURVES: dict[tuple, CostCurve] = {}


def loop_costs(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array | Sequence[Array],
    max_decode_len: int,
    gamma: int,
    settings: Mapping[str, Any],
    step_timer: Mapping[str, Any] | None = None,
    *,
    repeats: int = 15,
    verification: str = "token",
) -> dict[str, Any]:
    """Theorem 3.8's step costs as the decode loops pay them: T(1), the verify call and c.

    The step timer (`step_costs`) times each model's calls in a loop of their own; the decode
    loops pay more for them. On the 2-core CPU the real speculative loop with a zero-cost draft
    spent 0.74 ms per iteration on a verify call that the step timer priced at 0.65 ms, and a real
    draft after each verify call is read back from DRAM (results/verify_cost/
    loop_interference.md). Here the real loops run on caches built once (set-up not timed), on
    every source given (the run's first batches; one batch's outputs are too short and its
    timings too noisy to price a run), pooled:

    * the baseline (`decoding.temperature_sample`, the target alone): T(1) per token;
    * the speculative loop with the real target and a zero-cost draft (`time_budget.
      _constant_step`): the verify call per iteration;
    * the speculative loop with both models real: one iteration's model calls;

    each at two lengths: `max_decode_steps` 2 and max_decode_len, ending at the real EOS, so the
    loops decode the positions the run decodes. Where that leaves fewer than 2 units per source
    between the two lengths (outputs of one or two blocks), the loops run max_decode_len // 4
    and max_decode_len tokens with EOS replaced by an id the baseline does not emit
    (`timing_eos_id`). Tokens and iterations are counted, not assumed. Per unit = the slope
    between the two lengths, summed over the sources within a round (a call's fixed cost
    cancels), minus the loop's own work per unit (`time_budget.measure_loop_ms`); medians over
    rounds of the ratios within a round.

    The zero-cost-draft loop is its own compiled program, and on this CPU it spent 0.03-0.19 ms
    more per iteration than the real loop with a unigram draft in it (session 22 probe,
    results/verify_cost/README.md): a verify call costs no more than the iteration it is part of,
    so the verify cost is capped at the iteration's (`verify_capped`; the loop's own reading is
    kept as `verify_only_ms`). c = (iteration - verify) / (γ T(1)) and verify_cost_ratio = verify
    / T(1), so Theorem 3.8 with these inputs is E(α, γ) T(1) / iteration.

    Args:
      spec_model: a `models.SpeculativeEncoderDecoderModel`; target_params, draft_params: raw or
        packed; encoder_input_tokens: int32 [batch, enc_len], or a sequence of such arrays of
        one shape (pooled); max_decode_len: L (tokens); gamma: γ >= 1; settings:
        {'temperature', 'topk', 'topp'}.
      step_timer: `step_costs`'s dict at this γ, for `c_alone` (its lone draft step over this
        T(1)) and `interference_ms`; None: those two are left out.
      repeats: timed rounds; verification: 'token' or 'block'.

    Returns:
      {'target_step_ms', 'verify_step_ms', 'iteration_ms', 'draft_step_ms' ((iteration - verify)
      / γ) (ms), 'c', 'verify_cost_ratio', 'verify_only_ms' (the zero-cost-draft loop's verify
      call, before the cap), 'verify_capped' (bool), 'c_alone', 'interference_ms' (iteration -
      verify - γ lone draft steps, ms per iteration), 'loop_work_ms' {'per_token',
      'per_iteration'}, 'slopes_ms' {'baseline', 'speculative', 'verify_only'} (before the loop
      work is taken off), 'units' {loop: [units at each length, summed over sources]},
      'decode_steps', 'sources' (their count), 'timing_eos_id' (None: the real EOS), 'repeats',
      and 'step_timer' (the dict given)}.

    Raises:
      ValueError: gamma < 1, max_decode_len < 4, no sources or sources of different shapes, no
        timing EOS id found among the vocabulary's last 8 ids, or a loop whose two lengths ran
        the same number of units.
    """
    if gamma < 1 or max_decode_len < 4:
        raise ValueError(f"need gamma >= 1 and max_decode_len >= 4; got {gamma}, {max_decode_len}.")
    sources = (
        [encoder_input_tokens]
        if hasattr(encoder_input_tokens, "shape")
        else list(encoder_input_tokens)
    )
    sources = [jnp.asarray(s) for s in sources]
    if not sources or len({(s.shape, s.dtype) for s in sources}) != 1 or sources[0].ndim != 2:
        raise ValueError(
            "loop_costs needs one or more int32 [batch, enc_len] sources of one shape; got "
            f"{[(tuple(s.shape), str(s.dtype)) for s in sources]}."
        )
    tp, dp = _packed(spec_model, target_params, draft_params)
    caches = [_caches(spec_model, tp, dp, enc, max_decode_len) for enc in sources]
    module, draft = spec_model.module, spec_model.draft
    vocab, batch = module.config.vocab_size, sources[0].shape[0]
    inputs = jnp.zeros((batch, max_decode_len), jnp.int32)
    rng = jax.random.PRNGKey(3)

    def baseline_loop(eos):
        def run(tp, e, tc, n):
            step = models.one_token_logits_fn(steps.make_block_step(module, tp, e))
            out = decoding.temperature_sample(
                inputs, tc, step, eos, rng, max_decode_steps=n, **settings
            )[0].reshape(batch, -1)
            hit = out == eos
            return jnp.max(jnp.where(hit.any(axis=1), jnp.argmax(hit, axis=1) + 1, n))

        return jax.jit(run)

    def speculative_loop(eos, free_draft: bool):
        free, free_cache = time_budget._constant_step(vocab, eos), jnp.zeros((), jnp.float32)

        def run(tp, dp, e, tc, dc, n):
            draft_step = free if free_draft else draft.make_step(dp, e)
            _, stats = speculative.speculative_sample(
                inputs,
                tc,
                steps.make_block_step(module, tp, e),
                free_cache if free_draft else dc,
                draft_step,
                eos,
                gamma=gamma,
                decode_rng=rng,
                max_decode_steps=n,
                verification=verification,
                **settings,
            )
            return jnp.max(stats.num_iterations)

        return jax.jit(run)

    names = ("baseline", "speculative", "verify_only")

    def calls_and_units(eos, lengths, baseline_fn=None):
        fns = {
            "baseline": baseline_fn or baseline_loop(eos),
            "speculative": speculative_loop(eos, False),
            "verify_only": speculative_loop(eos, True),
        }
        calls = {}
        for s, (enc, (tc, dc)) in enumerate(zip(sources, caches, strict=True)):
            for n in lengths:
                n_ = jnp.int32(n)
                calls[("baseline", n, s)] = lambda f=fns["baseline"], e=enc, tc=tc, n_=n_: f(
                    tp, e, tc, n_
                )
                for name in names[1:]:
                    calls[(name, n, s)] = lambda f=fns[name], e=enc, tc=tc, dc=dc, n_=n_: f(
                        tp, dp, e, tc, dc, n_
                    )
        units = {k: int(f()) for k, f in calls.items()}  # compiles; units are deterministic
        totals = {
            (name, n): sum(units[(name, n, s)] for s in range(len(sources)))
            for name in names
            for n in lengths
        }
        return calls, totals

    # The run's own EOS first: the positions the run decodes.
    lengths, timing_eos = (2, max_decode_len), None
    calls, totals = calls_and_units(spec_model.eos_id, lengths)
    if any(totals[(n, lengths[1])] - totals[(n, lengths[0])] < 2 * len(sources) for n in names):
        # Outputs of one or two blocks: the loops run past the real EOS. The timing EOS: the
        # vocabulary's last ids (sentinels or the rarest pieces), the first one the baseline does
        # not emit in max_decode_len tokens from the first source (it ends the rows otherwise).
        lengths, full = (max(1, max_decode_len // 4), max_decode_len), jnp.int32(max_decode_len)
        candidates = [
            i for i in range(vocab - 1, max(vocab - 9, 0) - 1, -1) if i != spec_model.eos_id
        ]
        for timing_eos in candidates:
            baseline_fn = baseline_loop(timing_eos)
            if int(baseline_fn(tp, sources[0], caches[0][0], full)) == max_decode_len:
                break
        else:
            raise ValueError(
                f"loop_costs: the baseline emitted each of the ids {candidates} within "
                f"{max_decode_len} tokens; no id to time the loops at their full length."
            )
        calls, totals = calls_and_units(timing_eos, lengths, baseline_fn)
    for name in names:
        if totals[(name, lengths[1])] <= totals[(name, lengths[0])]:
            raise ValueError(
                f"loop_costs: the {name} loop ran {totals[(name, lengths[0])]} units at both "
                f"lengths {lengths}; its EOS id {timing_eos} was emitted early."
            )
    samples = benchmark.time_interleaved(calls, repeats, warmup=1, shuffle=True)

    def pooled(name, n):  # per round: the call times summed over the sources
        per_source = [samples[(name, n, s)] for s in range(len(sources))]
        return [sum(times) for times in zip(*per_source, strict=True)]

    slopes = {
        name: [
            (hi - lo) / (totals[(name, lengths[1])] - totals[(name, lengths[0])])
            for lo, hi in zip(pooled(name, lengths[0]), pooled(name, lengths[1]), strict=True)
        ]
        for name in names
    }
    work = time_budget.measure_loop_ms(
        batch,
        vocab,
        max_decode_len,
        gamma,
        settings,
        spec_model.eos_id if timing_eos is None else timing_eos,
        repeats,
        verification=verification,
    )
    per_token, per_iteration = work["baseline_per_token_ms"], work["speculative_per_iteration_ms"]
    floor = 1e-6
    t1 = [max(b - per_token, floor) for b in slopes["baseline"]]
    verify = [max(v - per_iteration, floor) for v in slopes["verify_only"]]
    iteration = [max(s - per_iteration, floor) for s in slopes["speculative"]]
    median = statistics.median
    verify_ratio = benchmark.paired_ratio(verify, t1)
    iteration_ratio = benchmark.paired_ratio(iteration, t1)
    verify_ms, iteration_ms = median(verify), median(iteration)
    # The verify call costs no more than its iteration (in the paired ratios or the medians).
    capped = verify_ratio > iteration_ratio or verify_ms > iteration_ms
    if capped:
        verify_ratio, verify_ms = min(verify_ratio, iteration_ratio), iteration_ms
    out: dict[str, Any] = {
        "target_step_ms": median(t1),
        "verify_step_ms": verify_ms,
        "iteration_ms": iteration_ms,
        "draft_step_ms": max(iteration_ms - verify_ms, 0.0) / gamma,
        "c": (iteration_ratio - verify_ratio) / gamma,
        "verify_cost_ratio": verify_ratio,
        "verify_only_ms": median(verify),
        "verify_capped": capped,
        "loop_work_ms": {"per_token": per_token, "per_iteration": per_iteration},
        "slopes_ms": {name: median(v) for name, v in slopes.items()},
        "units": {name: [totals[(name, n)] for n in lengths] for name in names},
        "decode_steps": list(lengths),
        "sources": len(sources),
        "timing_eos_id": timing_eos,
        "repeats": repeats,
    }
    if step_timer is not None:
        lone = step_timer["draft_step_ms"]
        out["c_alone"] = lone / out["target_step_ms"]
        out["interference_ms"] = gamma * out["draft_step_ms"] - gamma * lone
        out["step_timer"] = dict(step_timer)
    return out


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
) -> CostCurve:
    """The `CostCurve` of this model pair and shape; measured once per process, then cached.

    The cache key is the model pair (object identity), the batch and encoder shape, the decode
    length, gamma_max, the sampling settings and the verification rule. T(k) is the step timer's
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
    )
    if key not in _CURVES:
        costs = step_costs(
            spec_model,
            target_params,
            draft_params,
            encoder_input_tokens,
            max_decode_len,
            gamma_max,
            repeats=repeats,
            block_sizes=range(1, gamma_max + 2),
        )
        setup = time_budget.measure_setup_ms(
            spec_model, target_params, draft_params, encoder_input_tokens, max_decode_len, repeats
        )
        loops = measure_loop_work_ms(
            encoder_input_tokens.shape[0],
            spec_model.module.config.vocab_size,
            max_decode_len,
            gamma_max,
            settings,
            spec_model.eos_id,
            verification,
            repeats,
        )
        # The step timer's loops price the target's calls below what the decode loops pay
        # (`loop_costs`): T(1) is taken from the baseline loop, and the k >= 2 calls are scaled by
        # the decode loop's verify call over the step timer's at k = gamma_max + 1.
        in_loop = loop_costs(
            spec_model,
            target_params,
            draft_params,
            encoder_input_tokens,
            max_decode_len,
            gamma_max,
            settings,
            costs,
            repeats=max(3, repeats // 2),
            verification=verification,
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
            **loops,
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
) -> dict[str, Any]:
    """The decode loops' own work for γ = 1..gamma_max (`time_budget.measure_loop_ms`), in ms.

    Measured at γ = 1 and γ = gamma_max (real loops, zero-cost models) and interpolated linearly
    in γ between them (the per-iteration work is γ draft samples plus a fixed part).

    Returns:
      `CostCurve` keyword arguments: 'baseline_sampling_ms' (s_1 per token), 'sampling_ms' ({γ: o(γ)}
      per iteration), 'baseline_fixed_ms', 'speculative_fixed_ms' ({γ: per call}).
    """
    ends = sorted({1, gamma_max})
    measured = {
        g: time_budget.measure_loop_ms(
            batch, vocab, max_decode_len, g, settings, eos_id, repeats, verification=verification
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


class ZeroCostDraft(drafts.Draft):
    """A draft that costs nothing: the same logits row at every position (`time_budget.
    _constant_step`, EOS never proposed). With it the speculative loop's iterations cost the
    verify call plus the loop's own work, which `run_costs` takes as the verify call's cost.

    Args:
      vocab_size: V of the target; eos_id: the id never proposed.
    """

    def __init__(self, vocab_size: int, eos_id: int):
        self.params = {}
        self._step = time_budget._constant_step(vocab_size, eos_id)

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        return {"unused": jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32)}

    def make_step(self, params, encoder_input_tokens):
        return self._step


# The calls `run_costs` prices, each timed on every batch of the run at two lengths.
RUN_COST_CALLS = ("baseline", "speculative", "verify_only")


def run_costs(
    seconds: Mapping[tuple[str, str], Sequence[float]],
    units: Mapping[tuple[str, str], Sequence[int]],
    gamma: int,
    loop_work_ms: Mapping[str, float],
    step_timer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Theorem 3.8's step costs from the run's own decode calls: T(1), the verify call and c.

    The eval job times, on every batch and in its seeded random order beside the timed calls,
    each of `RUN_COST_CALLS` (the baseline; the speculative call at this γ; the speculative call
    with `ZeroCostDraft`, whose iterations are the verify call) in full ('full') and stopped
    after 2 tokens ('short', `max_decode_steps` 2). A full call minus its short call is the cost
    of its extra tokens or iterations (the encoder, the cache set-up and the call's fixed cost
    cancel), summed over the run and divided by the extra units, less the loop's own work per
    unit. The costs are thus the run's, at its time: on this VM the same loops timed minutes
    apart read T(1) 10-50 % apart (results/verify_cost/README.md, session 22).

    A verify call costs no more than the iteration it is part of: the zero-cost-draft loop, a
    program of its own, read up to 0.19 ms per iteration more than the real loop with a unigram
    draft in it (session 22 probe), so the verify cost is capped at the iteration's
    (`verify_capped`; the uncapped reading is `verify_only_ms`). c = (iteration - verify) / (γ
    T(1)), verify_cost_ratio = verify / T(1), so Theorem 3.8 with them is E(α, γ) T(1) /
    iteration.

    Args:
      seconds: {(call, 'full' | 'short'): float [batches] wall seconds}, for each call in
        `RUN_COST_CALLS`.
      units: the same keys: int [batches] tokens (baseline: the longest row's, EOS counted) or
        iterations (the speculative calls: the most of any row).
      gamma: γ of the speculative calls (>= 1).
      loop_work_ms: `time_budget.measure_loop_ms`'s dict (its 'baseline_per_token_ms' and
        'speculative_per_iteration_ms').
      step_timer: `step_costs`'s dict at this γ, for `c_alone` and `interference_ms`; None: left
        out.

    Returns:
      {'target_step_ms', 'verify_step_ms', 'iteration_ms', 'draft_step_ms' (ms), 'c',
      'verify_cost_ratio', 'verify_only_ms', 'verify_capped', 'c_alone', 'interference_ms',
      'loop_work_ms', 'slopes_ms' {call: ms per unit before the loop work is taken off},
      'units' {call: [short, full] summed over batches}, 'batches', 'calls' {'call/length':
      {'seconds': float [batches], 'units': int [batches]}}, 'interval' {'c',
      'verify_cost_ratio', 'iteration_ratio': [5th, 95th percentile] of a bootstrap over
      batches}, 'source': 'run', and 'step_timer'}.

    Raises:
      ValueError: gamma < 1, a missing key, lists of different lengths or empty, or a call whose
        full runs added no unit over its short runs.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1; got {gamma!r}.")
    keys = [(call, length) for call in RUN_COST_CALLS for length in ("short", "full")]
    missing = [k for k in keys if k not in seconds or k not in units]
    if missing:
        raise ValueError(f"run_costs needs seconds and units for {keys}; missing {missing}.")
    sizes = {len(seconds[k]) for k in keys} | {len(units[k]) for k in keys}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            f"run_costs needs one non-empty value per batch for each key; got {sizes}."
        )
    n = sizes.pop()
    sec = {k: np.asarray(seconds[k], np.float64) for k in keys}
    cnt = {k: np.asarray(units[k], np.float64) for k in keys}
    for call in RUN_COST_CALLS:
        extra = cnt[(call, "full")].sum() - cnt[(call, "short")].sum()
        if extra < 1:
            raise ValueError(
                f"run_costs: the {call} calls ran {extra:g} units beyond their short calls over "
                f"{n} batches (outputs too short to price a step)."
            )
    work = {
        "baseline": loop_work_ms["baseline_per_token_ms"],
        "speculative": loop_work_ms["speculative_per_iteration_ms"],
        "verify_only": loop_work_ms["speculative_per_iteration_ms"],
    }

    def per_unit(rows):  # ms per extra unit over the given batches, loop work taken off
        out = {}
        for call in RUN_COST_CALLS:
            ms = 1e3 * (sec[(call, "full")][rows] - sec[(call, "short")][rows]).sum()
            extra = (cnt[(call, "full")][rows] - cnt[(call, "short")][rows]).sum()
            out[call] = ms / max(extra, 1.0)
        return out

    def costs(slopes):
        t1 = max(slopes["baseline"] - work["baseline"], 1e-6)
        iteration = max(slopes["speculative"] - work["speculative"], 1e-6)
        verify = max(slopes["verify_only"] - work["verify_only"], 1e-6)
        return t1, iteration, min(verify, iteration), verify

    everything = np.arange(n)
    slopes = per_unit(everything)
    t1, iteration, verify, verify_only = costs(slopes)
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(200):
        b_t1, b_it, b_v, _ = costs(per_unit(rng.integers(0, n, n)))
        draws.append(((b_it - b_v) / (gamma * b_t1), b_v / b_t1, b_it / b_t1))
    lo, hi = np.percentile(np.asarray(draws), [5, 95], axis=0)
    out: dict[str, Any] = {
        "target_step_ms": t1,
        "verify_step_ms": verify,
        "iteration_ms": iteration,
        "draft_step_ms": (iteration - verify) / gamma,
        "c": (iteration - verify) / (gamma * t1),
        "verify_cost_ratio": verify / t1,
        "verify_only_ms": verify_only,
        "verify_capped": bool(verify_only > iteration),
        "loop_work_ms": {
            "per_token": work["baseline"],
            "per_iteration": work["speculative"],
        },
        "slopes_ms": slopes,
        "units": {
            call: [int(cnt[(call, "short")].sum()), int(cnt[(call, "full")].sum())]
            for call in RUN_COST_CALLS
        },
        "batches": n,
        # The raw timings, per batch in the run's order: {"call/length": {"seconds": [...],
        # "units": [...]}} (s; tokens or iterations), for re-analysis without a re-run.
        "calls": {
            f"{call}/{length}": {
                "seconds": [float(v) for v in sec[(call, length)]],
                "units": [int(v) for v in cnt[(call, length)]],
            }
            for call, length in keys
        },
        "interval": {
            name: [float(lo[i]), float(hi[i])]
            for i, name in enumerate(("c", "verify_cost_ratio", "iteration_ratio"))
        },
        "source": "run",
    }
    if step_timer is not None:
        out["step_timer"] = dict(step_timer)
        if "draft_step_ms" in step_timer:
            lone = step_timer["draft_step_ms"]
            out["c_alone"] = lone / t1
            out["interference_ms"] = iteration - verify - gamma * lone
    return out
