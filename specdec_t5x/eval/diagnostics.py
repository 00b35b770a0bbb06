"""Where the eval job's time goes (`DIAGNOSTICS`): a speedup composed from measured costs.

A whole `predict_batch_with_aux` call pays more than Theorem 3.8's γ draft steps and verify call
per iteration; each part is measured on its own, never from the end-to-end time it predicts:
the set-up (encoder pass and cache, `overheads.measure_setup_ms`), the loops' own work per token
or iteration and per call (`overheads.measure_loop_ms`) and the model calls (the job's costs).
`compose` adds them up with the run's counted calls:

    baseline ≈ setup_T + fixed_b + N_tokens · (T(1) + o_b)
    speculative ≈ setup_T + setup_D + fixed_s + N_iterations · (γ · draft + T(γ + 1) + o_s(γ))

and the residual (measured − composed) is what no component explains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import metrics as metrics_lib
from specdec_t5x import theory
from specdec_t5x.eval import summary
from specdec_t5x.timing import overheads

Array = jax.Array


def compose(*, gamma: int, num_calls: int, baseline_tokens: int, iterations: int,
            target_step_ms: float, draft_step_ms: float, verify_step_ms: float,
            setup: Mapping[str, float], loop: Mapping[str, float],
            baseline_seconds: float | None = None,
            speculative_seconds: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The run's predicted times (ms), composed from component costs and counted calls.

    Args:
      gamma: γ; num_calls: decode calls (set-up and fixed costs are paid per call);
      baseline_tokens: the baseline's target calls; iterations: speculative iterations (whole run).
      target_step_ms, draft_step_ms, verify_step_ms: in-loop model costs per call (ms).
      setup: `overheads.measure_setup_ms`'s dict; loop: `overheads.measure_loop_ms`'s.
      baseline_seconds, speculative_seconds: measured totals, only for the residuals.

    Returns:
      {'baseline': {component: ms}, 'speculative': {component: ms}, 'baseline_ms',
      'speculative_ms', 'predicted_speedup', and with measured seconds 'baseline_residual_ms',
      'speculative_residual_ms' (measured − composed)}.

    Raises:
      ValueError: gamma < 1, or a negative count or cost.
    """
    values = dict(num_calls=num_calls, baseline_tokens=baseline_tokens, iterations=iterations,
                  target_step_ms=target_step_ms, draft_step_ms=draft_step_ms,
                  verify_step_ms=verify_step_ms, **setup, **loop)  # fmt: skip
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
    """{'baseline_tokens', 'iterations', 'speculative_tokens'}: each call's longest row's,
    summed over calls (`runs`: `summary.Run` records {'baseline', γ}, examples in call order;
    `rows_per_call`: examples per call)."""
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


def eval_time_budget(spec_model, target_params, draft_params, batch: Mapping[str, Array],
                     metrics, runs, rows_per_call: list[int], *, gamma: int,
                     settings: Mapping[str, Any], repeats: int = 20,
                     sources: Sequence[Array] | None = None,
                     loop: Mapping[str, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """The eval job's time budget: component costs measured on `batch`'s shapes, composed.

    The model calls are the job's costs (`metrics['step_costs']`: T(1), c and verify/step); the
    set-up is timed at each call's length bucket of `sources` (int32 [batch, enc_len] each; None:
    `batch`'s); `loop`: the job's `measure_loop_ms` dict (None: measured here).

    Returns:
      `compose`'s dict plus 'setup_ms', 'loop_ms', 'counts' (`per_call_counts`, with
      'expected_iterations_at_output_lengths'), 'predicted_speedup_alpha_iterations' (iterations
      from Eq. 1 at the measured α), 'measured_speedup', 'ladder' (the prediction with the terms
      added one at a time, from Thm 3.8 with the measured verify cost to the full composition)
      and 'in_loop_ms' (the verify call and the drafting per iteration in the loop, beside the
      step timer's lone loops: 'verify_in_loop_ms', 'drafting_in_loop_ms', 'verify_step_ms',
      'drafting_step_ms', 'draft_and_verify_one_loop_ms'; ms).
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
        gamma=gamma, num_calls=len(rows_per_call), baseline_tokens=counts["baseline_tokens"],
        target_step_ms=target_ms, draft_step_ms=target_ms * costs["c"],
        verify_step_ms=target_ms * costs["verify_cost_ratio"],
        setup={k: setup[k] for k in ("target_setup_ms", "draft_setup_ms")}, loop=loop,
    )  # fmt: skip
    out = compose(
        iterations=counts["iterations"], baseline_seconds=metrics["baseline_seconds"],
        speculative_seconds=metrics["speculative_seconds"], **model,
    )  # fmt: skip
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
    timer = costs.get("step_timer", costs)  # the stand-alone step loops (`step_timer.step_costs`)
    verify = costs.get("verify_only_ms", costs["verify_step_ms"])  # before any cap
    out["in_loop_ms"] = {
        "verify_in_loop_ms": verify,
        "drafting_in_loop_ms": max(costs["iteration_ms"] - costs["verify_step_ms"], 0.0),
        "verify_step_ms": timer["verify_step_ms"],
        "drafting_step_ms": gamma * timer["draft_step_ms"],
        "draft_and_verify_one_loop_ms": timer["iteration_ms"],
    }
    return out
