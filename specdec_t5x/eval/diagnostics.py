"""Where the eval job's time goes: a speedup predicted from measured component costs.

Theorem 3.8 (and its measured-verify form) models one iteration as γ draft steps plus one verify
call, and the baseline as one target step per token. A whole `predict_batch_with_aux` call also
pays for work the theorem leaves out; each part is measured here on its own, never from the
end-to-end time being predicted:

* set-up: the encoder pass and cache set-up of the target (both decoders) and of the draft
  (speculative only), amortised over a short output (`measure_setup_ms`);
* loop work outside the model calls: sampling / argmax, the acceptance test and residual, buffer
  writes, statistics and the `while_loop` bookkeeping, per iteration (speculative) and per token
  (baseline), plus a fixed per-call part (`measure_loop_ms`: the real decode loops run with
  zero-cost models whose logits are a constant row);
* the model calls: T(1), the draft step and T(γ + 1), in-loop (`step_timer.step_costs`).

`compose` adds them up with the counted target calls and tokens of the run (counts, not times):

    baseline ≈ setup_T + fixed_b + N_tokens · (T(1) + o_b)
    speculative ≈ setup_T + setup_D + fixed_s + N_iterations · (γ · draft + T(γ + 1) + o_s(γ))

and predicts speedup = baseline / speculative. The residual (measured − composed, per call) is what
no component explains (e.g. copies of the real caches in the loop carry, the draft's two-token
catch-up call after an all-accepted iteration, which is counted as one draft step); the
diagnostics `measure_in_loop_ms` (each model inside the real loop, the other free) and
`measure_iteration_ms` (both models alternating in one `fori_loop`) narrow it down.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import metrics as metrics_lib
from specdec_t5x import speculative, theory
from specdec_t5x.eval import summary
from specdec_t5x.timing import clock, overheads

Array = jax.Array


def compose(
    *,
    gamma: int,
    num_calls: int,
    baseline_tokens: int,
    iterations: int,
    target_step_ms: float,
    draft_step_ms: float,
    verify_step_ms: float,
    setup: Mapping[str, float],
    loop: Mapping[str, float],
    baseline_seconds: float | None = None,
    speculative_seconds: float | None = None,
) -> dict[str, Any]:
    """Composes the run's predicted times (ms) from component costs and counted calls/tokens.

    Args:
      gamma: γ.
      num_calls: decode calls (batches) in the run; set-up and fixed costs are paid per call.
      baseline_tokens: tokens the baseline generated (target calls of the baseline), whole run.
      iterations: speculative iterations (target verify calls), whole run.
      target_step_ms, draft_step_ms, verify_step_ms: in-loop model costs per call (ms).
      setup: `measure_setup_ms` result; loop: `measure_loop_ms` result.
      baseline_seconds, speculative_seconds: measured totals, only to report the residual
        (never used in the prediction).

    Returns:
      {'baseline': {component: ms}, 'speculative': {component: ms}, 'baseline_ms',
      'speculative_ms', 'predicted_speedup', and with measured seconds 'baseline_residual_ms',
      'speculative_residual_ms' (measured − composed)}.

    Raises:
      ValueError: a negative count or cost.
    """
    values = dict(
        num_calls=num_calls,
        baseline_tokens=baseline_tokens,
        iterations=iterations,
        target_step_ms=target_step_ms,
        draft_step_ms=draft_step_ms,
        verify_step_ms=verify_step_ms,
        **setup,
        **loop,
    )
    bad = {k: v for k, v in values.items() if not v >= 0}
    if bad or gamma < 1:
        raise ValueError(
            f"compose needs gamma >= 1 and counts/costs >= 0; got gamma={gamma}, {bad}."
        )
    base = {
        "setup_target": num_calls * setup["target_setup_ms"],
        "loop_fixed": num_calls * loop["baseline_fixed_ms"],
        "target_steps": baseline_tokens * target_step_ms,
        "loop_work": baseline_tokens * loop["baseline_per_token_ms"],
    }
    spec = {
        "setup_target": num_calls * setup["target_setup_ms"],
        "setup_draft": num_calls * setup["draft_setup_ms"],
        "loop_fixed": num_calls * loop["speculative_fixed_ms"],
        "draft_steps": iterations * gamma * draft_step_ms,
        "verify_calls": iterations * verify_step_ms,
        "loop_work": iterations * loop["speculative_per_iteration_ms"],
    }
    out = {
        "baseline": base,
        "speculative": spec,
        "baseline_ms": sum(base.values()),
        "speculative_ms": sum(spec.values()),
    }
    out["predicted_speedup"] = out["baseline_ms"] / out["speculative_ms"]
    if baseline_seconds is not None:
        out["baseline_residual_ms"] = baseline_seconds * 1e3 - out["baseline_ms"]
    if speculative_seconds is not None:
        out["speculative_residual_ms"] = speculative_seconds * 1e3 - out["speculative_ms"]
    return out


def per_call_counts(runs, gamma, eos_id: int, rows_per_call: list[int]) -> dict[str, int]:
    """Counted baseline tokens and speculative iterations, per decode call (longest row of each).

    Args:
      runs: `summary.Run` records {'baseline': Run, γ: Run}, examples in call order.
      gamma: the γ key; eos_id: EOS id; rows_per_call: examples per call, in order.

    Returns:
      {'baseline_tokens', 'iterations', 'speculative_tokens'} summed over calls (with batch 1,
      the plain totals).
    """

    out, start = {"baseline_tokens": 0, "iterations": 0, "speculative_tokens": 0}, 0
    for n in rows_per_call:
        rows = range(start, start + n)
        out["baseline_tokens"] += max(
            len(metrics_lib.until_eos(runs["baseline"].tokens[r], eos_id)) for r in rows
        )
        stats = [runs[gamma].stats[r] for r in rows]
        out["iterations"] += int(max(s.num_iterations for s in stats))
        out["speculative_tokens"] += int(max(s.num_generated for s in stats))
        start += n
    return out


def eval_time_budget(
    spec_model,
    target_params,
    draft_params,
    batch: Mapping[str, Array],
    metrics,
    runs,
    rows_per_call: list[int],
    *,
    gamma: int,
    settings: Mapping[str, Any],
    repeats: int = 20,
    sources: Sequence[Array] | None = None,
    loop: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The eval job's time budget (`DIAGNOSTICS`): component costs measured on `batch`'s shapes, composed.

    Uses the step costs already in `metrics['step_costs']` (in-loop T(1), draft, T(γ + 1)), adds
    `measure_setup_ms` and `measure_loop_ms`, and composes with the counted calls (`compose`);
    also the same composition with iterations from Eq. 1 at the measured α instead of counted
    (`predicted_speedup_alpha_iterations`; the difference is Jensen's gap: α varies per example
    and EOS truncates blocks), and the iterations of that i.i.d. model at the run's output lengths
    (`theory.expected_iterations`: the last block of each output cut) in the ladder.

    Returns:
      `compose`'s dict plus 'setup_ms', 'loop_ms', 'counts', 'predicted_speedup_alpha_iterations',
      'measured_speedup' and 'ladder' (the prediction with the terms added one at a time, from
      the model calls alone, which is Thm 3.8 with the measured verify cost when the iterations
      come from Eq. 1 at α, to the full composition).

    `sources` (int32 [batch, enc_len], every call's encoder inputs) times the set-up at each
    call's length bucket (`measure_setup_ms`); without it the set-up is `batch`'s. `loop`: the
    job's `measure_loop_ms` result at these shapes, γ and settings when it already has one (the
    eval job's `run_costs` measures it first); measured here when None.
    """
    enc = batch["encoder_input_tokens"]
    L = batch["decoder_input_tokens"].shape[1]
    setup = overheads.measure_setup_ms(
        spec_model, target_params, draft_params, enc, L, repeats, sources
    )
    vocab = spec_model.module.config.vocab_size
    if loop is None:
        loop = overheads.measure_loop_ms(
            enc.shape[0], vocab, L, gamma, settings, spec_model.eos_id, repeats
        )
    counts = per_call_counts(runs, gamma, spec_model.eos_id, rows_per_call)
    costs = metrics["step_costs"]
    # The draft's and the verify call's costs as the target's median step times the measured
    # (paired, `clock.paired_ratio`) c and verify ratio, so that the ladder's first rung is
    # Thm 3.8 with the measured verify cost exactly.
    target_ms = costs["target_step_ms"]
    model = dict(
        gamma=gamma,
        num_calls=len(rows_per_call),
        baseline_tokens=counts["baseline_tokens"],
        target_step_ms=target_ms,
        draft_step_ms=target_ms * costs["c"],
        verify_step_ms=target_ms * costs["verify_cost_ratio"],
        setup={k: setup[k] for k in ("target_setup_ms", "draft_setup_ms")},
        loop=loop,
    )
    out = compose(
        iterations=counts["iterations"],
        baseline_seconds=metrics["baseline_seconds"],
        speculative_seconds=metrics["speculative_seconds"],
        **model,
    )
    per_iteration = metrics["expected_tokens_per_iteration_eq1"]  # Eq. 1 at α (α = 1 allowed)
    alpha_iterations = counts["speculative_tokens"] / per_iteration
    speedup = lambda **kw: compose(**{**model, **kw})["predicted_speedup"]  # noqa: E731
    out["predicted_speedup_alpha_iterations"] = speedup(iterations=alpha_iterations)

    # The same i.i.d. model at this run's output lengths: each output's last block cut at EOS,
    # each call running until its slowest row ends (`theory.expected_iterations`).
    lengths = [int(s.num_generated) for s in runs[gamma].stats]
    length_iterations = float(
        np.sum(
            theory.expected_iterations(
                summary.group_by_call(lengths, rows_per_call), metrics["alpha_beta"], gamma
            )
        )
    )
    # The gap from Thm 3.8 with measured verify to this prediction, one term added at a time.
    no_setup = {k: 0.0 for k in setup}
    no_loop = {k: 0.0 for k in loop}
    out["ladder"] = {
        "model calls, iterations from Eq. 1 at α": speedup(
            iterations=alpha_iterations, setup=no_setup, loop=no_loop
        ),
        "model calls, iterations at α for these output lengths (last block cut)": speedup(
            iterations=length_iterations, setup=no_setup, loop=no_loop
        ),
        "model calls, counted iterations": speedup(
            iterations=counts["iterations"], setup=no_setup, loop=no_loop
        ),
        "+ loop work (sampling, acceptance, bookkeeping)": speedup(
            iterations=counts["iterations"], setup=no_setup
        ),
        "+ encoder and cache set-up, fixed per call": out["predicted_speedup"],
    }
    counts["expected_iterations_at_output_lengths"] = length_iterations
    out.update(setup_ms=setup, loop_ms=loop, counts=counts, measured_speedup=metrics["speedup"])
    # In-loop costs of each model (the other one free), beside the stand-alone ones.
    in_loop = measure_in_loop_ms(
        spec_model, target_params, draft_params, batch, gamma, settings, max(2, repeats // 4)
    )
    work = loop["speculative_per_iteration_ms"]
    in_loop["verify_in_loop_ms"] = in_loop["real_target_per_iteration_ms"] - work
    in_loop["drafting_in_loop_ms"] = in_loop["real_draft_per_iteration_ms"] - work
    timer = costs.get("step_timer", costs)  # the stand-alone step loops (`step_timer.step_costs`)
    in_loop["verify_step_ms"] = timer["verify_step_ms"]
    in_loop["drafting_step_ms"] = gamma * timer["draft_step_ms"]
    in_loop["draft_and_verify_one_loop_ms"] = measure_iteration_ms(
        spec_model, target_params, draft_params, batch, gamma, repeats=max(3, repeats // 2)
    )
    out["in_loop_ms"] = in_loop
    return out


def measure_in_loop_ms(
    spec_model,
    target_params,
    draft_params,
    batch: Mapping[str, Array],
    gamma: int,
    settings: Mapping[str, Any],
    repeats: int = 5,
) -> dict[str, float]:
    """Each model's cost per iteration inside the real speculative loop (the other one free).

    Runs `speculative.speculative_sample` on `batch` with the real target and a zero-cost draft
    (`constant_step`), and with a zero-cost target and the real draft; caches are built once,
    outside the timed call. Per iteration: call time / counted iterations. Subtracting the loop
    work (`measure_loop_ms`) leaves the in-loop verify call and the in-loop γ draft steps, to set
    beside the stand-alone step costs (`step_timer.step_costs`).

    Returns:
      {'real_target_per_iteration_ms', 'real_draft_per_iteration_ms'} (whole batch, medians).
    """
    enc = batch["encoder_input_tokens"]
    inputs = jnp.zeros_like(batch["decoder_input_tokens"])
    L = inputs.shape[1]
    (target_cache, target_step), (draft_cache, draft_step) = spec_model.states(
        target_params, draft_params, enc, L
    )
    vocab = spec_model.module.config.vocab_size
    free_step, free_cache = (
        clock.constant_step(vocab, spec_model.eos_id),
        jnp.zeros((), jnp.float32),
    )
    rng = jax.random.PRNGKey(2)

    def run(tc, ts, dc, ds):
        fn = jax.jit(
            lambda tc, dc, r: (
                speculative.speculative_sample(
                    inputs, tc, ts, dc, ds, spec_model.eos_id, gamma=gamma, decode_rng=r, **settings
                )[1].num_iterations
            )
        )
        return lambda: fn(tc, dc, rng)

    calls = {
        "real_target": run(target_cache, target_step, free_cache, free_step),
        "real_draft": run(free_cache, free_step, draft_cache, draft_step),
    }
    samples = clock.time_interleaved(calls, repeats, warmup=1)
    return {
        f"{k}_per_iteration_ms": statistics.median(v) / max(int(jnp.max(calls[k]())), 1)
        for k, v in samples.items()
    }


def measure_iteration_ms(
    spec_model,
    target_params,
    draft_params,
    batch: Mapping[str, Array],
    gamma: int,
    position: int = 8,
    steps_per_call: int = 8,
    repeats: int = 10,
) -> float:
    """Median ms of one iteration's model calls, both models in one loop: γ draft steps + verify.

    Unlike the separate step benchmarks, the draft's and the target's weights and caches alternate
    inside one jitted `fori_loop` (as in the decode loop), so CPU-cache interference between the
    two models is included. Positions are fixed (`position`); no sampling.
    """
    enc = batch["encoder_input_tokens"]
    L = batch["decoder_input_tokens"].shape[1]
    b = enc.shape[0]
    pos = jnp.full((b,), min(position, L - gamma - 1), jnp.int32)

    @jax.jit
    def run(tp, dp, e):
        (tc, target_step), (dc, draft_step) = spec_model.states(tp, dp, e, L)
        one = jnp.full((b, 1), 5, jnp.int32)
        block = jnp.full((b, gamma + 1), 5, jnp.int32)

        def body(i, carry):
            dc, tc, acc = carry
            for j in range(gamma):
                logits, dc = draft_step(one + (acc > 1e9), pos + j, dc)  # not hoisted
                acc = acc + logits[0, 0, 0]
            logits, tc = target_step(block + (acc > 1e9), pos, tc)
            return dc, tc, acc + logits[0, 0, 0]

        return jax.lax.fori_loop(0, steps_per_call, body, (dc, tc, jnp.float32(0)))[2]

    setup = jax.jit(lambda tp, dp, e: tuple(state[0] for state in spec_model.states(tp, dp, e, L)))
    calls = {
        "loop": lambda: run(target_params, draft_params, enc),
        "setup": lambda: setup(target_params, draft_params, enc),
    }
    ms = {k: statistics.median(v) for k, v in clock.time_interleaved(calls, repeats).items()}
    return max(ms["loop"] - ms["setup"], 0.0) / steps_per_call
