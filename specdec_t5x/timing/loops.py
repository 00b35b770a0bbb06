"""c and verify/step as the decode loops pay them (paper §3.4, Theorem 3.8's costs).

`loop_costs` times the real decode loops on the first batches' caches (auto γ's cost curve, and
the eval job's with the diagnostics), takes the loops' own work (`overheads.measure_loop_ms`) off,
and caps the verify call at its iteration's cost: the zero-cost-draft loop, a program of its own,
can read more per iteration than the real loop.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x import decoding, speculative, steps
from specdec_t5x.timing import clock, overheads, step_timer

Array = jax.Array


def loop_costs(spec_model, target_params, draft_params,
               encoder_input_tokens: Array | Sequence[Array], max_decode_len: int, gamma: int,
               settings: Mapping[str, Any], timer_costs: Mapping[str, Any] | None = None, *,
               repeats: int = 15, verification: str = "token",
               baseline_sampler: str = "t5x") -> dict[str, Any]:  # fmt: skip
    """Theorem 3.8's step costs as the real decode loops pay them: T(1), the verify call and c.

    On caches built once from each source (set-up not timed), the baseline loop (T(1) per token),
    the speculative loop with a zero-cost draft (`clock.constant_step`: the verify call per
    iteration) and with both models (one iteration) each run `max_decode_steps` 2 and
    max_decode_len, ending at the real EOS. Where that leaves fewer than 2 units per source
    between the lengths, they run max_decode_len // 4 and max_decode_len with EOS replaced by an
    id the baseline does not emit (`timing_eos_id`). Per unit = the slope between the lengths,
    summed over the sources per round, less the loop's own work; medians of per-round ratios.
    c = (iteration - verify) / (γ T(1)), verify_cost_ratio = verify / T(1).

    Args:
      spec_model: a `models.SpeculativeEncoderDecoderModel`; target_params, draft_params: raw or
        packed; encoder_input_tokens: int32 [batch, enc_len], or a sequence of such arrays of
        one shape (pooled); max_decode_len: L (tokens); gamma: γ >= 1; settings:
        {'temperature', 'topk', 'topp'}.
      timer_costs: `step_timer.step_costs`'s dict, for 'c_alone' and 'interference_ms' (None:
        left out).
      repeats: timed rounds; verification: 'token' or 'block'; baseline_sampler: the baseline's
        draw (`decoding.SAMPLERS`).

    Returns:
      {'target_step_ms', 'verify_step_ms', 'iteration_ms', 'draft_step_ms' (ms), 'c',
      'verify_cost_ratio', 'verify_only_ms' (before the cap), 'verify_capped', 'c_alone',
      'interference_ms' (ms per iteration), 'loop_work_ms' {'per_token', 'per_iteration'},
      'slopes_ms' {loop: ms per unit, loop work included}, 'units' {loop: [units at each
      length]}, 'decode_steps', 'sources', 'timing_eos_id' (None: the real EOS), 'repeats',
      'step_timer'}.

    Raises:
      ValueError: gamma < 1, max_decode_len < 4, no sources or sources of different shapes, no
        timing EOS among the vocabulary's last 8 ids, or a loop that ran the same number of units
        at both lengths.
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
    tp, dp = step_timer.packed(spec_model, target_params, draft_params)
    caches = [step_timer.caches(spec_model, tp, dp, enc, max_decode_len) for enc in sources]
    module, draft = spec_model.module, spec_model.draft
    vocab, batch = module.config.vocab_size, sources[0].shape[0]
    inputs = jnp.zeros((batch, max_decode_len), jnp.int32)
    rng = jax.random.PRNGKey(3)

    def baseline_loop(eos):
        def run(tp, e, tc, n):
            step = decoding.one_token_logits(steps.make_block_step(module, tp, e))
            out = decoding.temperature_sample(
                inputs, tc, step, eos, rng, max_decode_steps=n, sampler=baseline_sampler, **settings
            )[0].reshape(batch, -1)
            hit = out == eos
            return jnp.max(jnp.where(hit.any(axis=1), jnp.argmax(hit, axis=1) + 1, n))

        return jax.jit(run)

    def speculative_loop(eos, free_draft: bool):
        free, free_cache = clock.constant_step(vocab, eos), jnp.zeros((), jnp.float32)

        def run(tp, dp, e, tc, dc, n):
            draft_step = free if free_draft else draft.make_step(dp, e)
            _, stats = speculative.speculative_sample(
                inputs, tc, steps.make_block_step(module, tp, e), free_cache if free_draft else dc,
                draft_step, eos, gamma=gamma, decode_rng=rng, max_decode_steps=n,
                verification=verification, **settings,
            )  # fmt: skip
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
    samples = clock.time_interleaved(calls, repeats, warmup=1, shuffle=True)

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
    eos = spec_model.eos_id if timing_eos is None else timing_eos
    work = overheads.measure_loop_ms(
        batch, vocab, max_decode_len, gamma, settings, eos, repeats, verification=verification
    )
    per_token, per_iteration = work["baseline_per_token_ms"], work["speculative_per_iteration_ms"]
    floor = clock.FLOOR_MS
    t1 = [max(b - per_token, floor) for b in slopes["baseline"]]
    verify = [max(v - per_iteration, floor) for v in slopes["verify_only"]]
    iteration = [max(s - per_iteration, floor) for s in slopes["speculative"]]
    median = statistics.median
    verify_ratio = clock.paired_ratio(verify, t1)
    iteration_ratio = clock.paired_ratio(iteration, t1)
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
    if timer_costs is not None:  # the lone draft step: the iteration's drafting beyond it
        out["step_timer"] = dict(timer_costs)
        if "draft_step_ms" in timer_costs:
            lone = timer_costs["draft_step_ms"]
            out["c_alone"] = lone / out["target_step_ms"]
            out["interference_ms"] = gamma * out["draft_step_ms"] - gamma * lone
    return out
