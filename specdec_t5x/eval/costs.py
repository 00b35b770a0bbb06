"""c and verify/step of an eval run, priced from the run's own decode calls, and sanity-checked.

`RunCostCalls` are the extra calls beside the timed ones (`timing.loops.run_costs`); `measure`
turns their timings into the run's costs (the step timer's stand-alone loops when they are off or
cannot price the run); `degenerate` says when a measurement is not a cost at all (one check for
every path: the run's calls, the decode loops, the step timer alone), so that the tables print
"n/a (degenerate: ...)" instead of a number.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import models
from specdec_t5x.eval import rows
from specdec_t5x.timing import loops, overheads

logger = logging.getLogger(__name__)


def timed(fn, *args, compiles=None) -> tuple[Any, float]:
    """(result, wall seconds) of `fn(*args)` including `block_until_ready`."""
    if compiles is not None:
        compiles.active = True
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    if compiles is not None:
        compiles.active = False
    return out, seconds


class RunCostCalls:
    """The extra calls `loops.run_costs` prices the run's steps from, and their timings.

    Per batch, beside the timed calls: the baseline and the speculative call at γ stopped after 2
    tokens, and the speculative call with `loops.ZeroCostDraft` in full and stopped after 2
    tokens. The full baseline and speculative calls are the run's own (`record`).
    """

    SHORT = 2  # max_decode_steps of the short calls

    def __init__(self, spec_model, baseline, settings, gamma: int):
        self.gamma, self.eos_id = gamma, spec_model.eos_id
        short = {**settings, "max_decode_steps": self.SHORT}
        free = models.SpeculativeEncoderDecoderModel(
            spec_model.module,
            loops.ZeroCostDraft(spec_model.module.config.vocab_size, spec_model.eos_id),
            spec_model.input_vocabulary,
            spec_model.output_vocabulary,
            cpu_weight_dtype=spec_model.cpu_weight_dtype,
        )
        base_short = jax.jit(
            lambda tp, b, rng: baseline.predict_batch_with_aux(tp, b, rng, decoder_params=short)[0]
        )
        spec_short = rows.speculative_fn(spec_model, {**short, "gamma": gamma})
        free_full = rows.speculative_fn(free, {**settings, "gamma": gamma})
        free_short = rows.speculative_fn(free, {**short, "gamma": gamma})
        self.fns = {
            "cost:baseline:short": lambda tp, dp, b, rng: base_short(tp, b, rng),
            "cost:speculative:short": spec_short,
            "cost:verify_only:full": lambda tp, dp, b, rng: free_full(tp, {}, b, rng),
            "cost:verify_only:short": lambda tp, dp, b, rng: free_short(tp, {}, b, rng),
        }
        self.seconds = collections.defaultdict(list)
        self.units = collections.defaultdict(list)

    def warm_up(self, target_params, draft_params, batch, rng) -> None:
        for fn in self.fns.values():
            jax.block_until_ready(fn(target_params, draft_params, batch, rng))

    def _units(self, tokens, stats) -> int:
        if stats is not None:  # speculative: the loop's iterations (its slowest row)
            return int(np.max(np.asarray(stats.num_iterations)))
        tokens = np.asarray(tokens)  # baseline: the longest row's tokens, EOS counted
        hit = tokens == self.eos_id
        lengths = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, (tokens != 0).sum(axis=1))
        return int(lengths.max())

    def time(self, key, target_params, draft_params, batch, rng, compiles) -> list:
        """Times one extra call on `batch`; returns its `[call, length, seconds, units]` entry."""
        out, seconds = timed(
            self.fns[key], target_params, draft_params, batch, rng, compiles=compiles
        )
        _, call, length = key.split(":")
        stats = out[1]["stats"] if isinstance(out, tuple) else None
        return self.add(call, length, seconds, self._units(out, stats))

    def record(self, key, seconds: float, tokens, stats) -> list:
        """Adds a timed full call of the run (the baseline or the costs' γ); returns its entry."""
        call = "baseline" if key == "baseline" else "speculative"
        return self.add(call, "full", seconds, self._units(tokens, stats))

    def add(self, call: str, length: str, seconds: float, units: int) -> list:
        """Adds one timing (also how `resume` restores a finished batch's); returns the entry."""
        self.seconds[(call, length)].append(float(seconds))
        self.units[(call, length)].append(int(units))
        return [call, length, float(seconds), int(units)]

    def measured(self):
        return dict(self.seconds), dict(self.units)


class CompileCounter:
    """Counts XLA compilations while active (the timed loop must cause none)."""

    def __init__(self):
        self.count, self.active = 0, False

    def __call__(self, event: str, duration_s: float, **kwargs) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def measure(
    spec_model,
    target_params,
    draft_params,
    batches: Sequence[tuple[int, Mapping[str, Any]]],
    target_len: int,
    gamma: int,
    settings: Mapping[str, Any],
    cost_calls: RunCostCalls | None,
    repeats: int,
    baseline_sampler: str = "t5x",
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """The run's costs: (`loops.run_costs`' dict, or the step timer's; the loops' own work).

    Args:
      spec_model, target_params, draft_params: the run's pair, parameters as timed.
      batches: the run's `(rows, batch)` list (the step timer uses the first).
      target_len: max_decode_len; gamma: the γ the costs are priced at.
      settings: {'temperature', 'topk', 'topp'}.
      cost_calls: the run's `RunCostCalls` (None: the step timer's stand-alone loops alone).
      repeats: timing repeats.
      baseline_sampler: the baseline's draw (`decoding.SAMPLERS`), as the run's baseline draws.

    Returns:
      (costs with 'c', 'verify_cost_ratio', 'target_step_ms', ... and 'degenerate' (list of
      reasons, empty when the measurement is sound), the loop-work dict or None).
    """
    first = batches[0][1]["encoder_input_tokens"]
    costs = loops.measure_step_costs(
        spec_model, target_params, draft_params, first, target_len, gamma, repeats=repeats
    )
    work = None
    sampling_keys = {k: settings[k] for k in ("temperature", "topk", "topp") if k in settings}
    if cost_calls is not None:
        work = overheads.measure_loop_ms(
            first.shape[0],
            spec_model.module.config.vocab_size,
            target_len,
            gamma,
            sampling_keys,
            spec_model.eos_id,
            repeats,
            baseline_sampler=baseline_sampler,
        )
        try:
            costs = loops.run_costs(*cost_calls.measured(), gamma, work, costs)
        except ValueError as err:  # every output within 2 tokens or one iteration
            logger.warning("%s; c and verify/step from the decode loops instead.", err)
            costs = loops.loop_costs(
                spec_model,
                target_params,
                draft_params,
                [b["encoder_input_tokens"] for _, b in batches[:4]],
                target_len,
                gamma,
                sampling_keys,
                costs,
                repeats=max(3, repeats // 2),
                baseline_sampler=baseline_sampler,
            )
    costs["degenerate"] = degenerate(costs, gamma)
    if costs["degenerate"]:
        logger.warning(
            "the cost measurement is degenerate (%s): c, verify/step and the predictions built "
            "on them are reported as n/a. Measure on more examples (NUM_EXAMPLES) or on a "
            "quieter machine.",
            "; ".join(costs["degenerate"]),
        )
    return costs, work


CAP_TOLERANCE = 1.05  # verify-only / iteration within timing noise: a nearly free draft, c ~ 0
NOISE_FRACTION = CAP_TOLERANCE - 1  # of an iteration: a negative interference within it is noise
# ms: a draft step at or below this is no measurement (the timer floors a slope <= 0 at
# `clock.FLOOR_MS`; one iteration of a jitted loop alone costs more on XLA:CPU).
DRAFT_FLOOR_MS = 1e-5


def degenerate(costs: Mapping[str, Any], gamma: int) -> list[str]:
    """Why a cost measurement is not a cost (empty: sound); one check for every cost path.

    `costs` is `loops.run_costs`'s, `loops.loop_costs`'s or `step_timer.step_costs`'s dict (the
    step timer alone: `LOOP_COSTS=False`, `--quick`). In each, c is the iteration's drafting,
    (iteration - verify) / (γ T(1)). Flags:

    * a target step <= 1e-3 ms (a slope floored at zero);
    * a draft step that no reading resolves: alone (the step timer's lone loop) at or below
      `DRAFT_FLOOR_MS` and in the loop (iteration - verify) <= 0;
    * a verify call dearer than its whole iteration by more than `CAP_TOLERANCE` (its
      uncapped reading: `verify_only_ms`, or the step timer's `verify_step_ms`; within it the
      draft is nearly free and c reads ~0);
    * interference (iteration - verify - γ lone draft steps) below -`NOISE_FRACTION` of the
      iteration: the loop drafted for less than the draft costs alone;
    * c outside [0, 1) (a draft step as dear as the target's is no draft) and verify/step
      outside [0.5, γ + 2].

    Example (a `--quick` run at load 5–15, step timer alone): draft_step_ms 1e-06,
    verify_step_ms 8.33, iteration_ms 5.90, interference_ms -2e-06, c 0.0 -> the draft step and
    the verify call are flagged, and the table prints "n/a (degenerate: ...)", not c = 0.000.
    """
    reasons = []
    show = lambda x: "missing" if x is None else f"{float(x):.4g}"  # noqa: E731
    t1 = costs.get("target_step_ms")
    if t1 is not None and not t1 > 1e-3:
        reasons.append(f"target step {t1:.3g} ms (non-positive slope)")
    iteration = costs.get("iteration_ms")
    verify = costs.get("verify_only_ms", costs.get("verify_step_ms"))  # before any cap
    if "step_timer" in costs:  # the loop paths: their own draft_step_ms is iteration - verify
        lone = costs["step_timer"].get("draft_step_ms")
    else:
        lone = None if "verify_only_ms" in costs else costs.get("draft_step_ms")
    c = costs.get("c")
    if lone is not None and lone <= DRAFT_FLOOR_MS and c is not None and c <= 0:
        reasons.append(f"draft step not resolved ({lone:.3g} ms alone, <= 0 in the loop)")
    if iteration is not None and verify is not None and verify > CAP_TOLERANCE * iteration:
        reasons.append(f"verify call dearer than its iteration ({verify:.3g} > {iteration:.3g} ms)")
    interference = costs.get("interference_ms")
    if interference is not None and iteration is not None:
        if interference < -NOISE_FRACTION * iteration:
            reasons.append(
                f"interference {interference:.3g} ms < 0 (beyond noise: "
                f"{NOISE_FRACTION:.0%} of the {iteration:.3g} ms iteration)"
            )
    if c is None or not math.isfinite(c) or not 0.0 <= c < 1.0:
        reasons.append(f"c = {show(c)} outside [0, 1)")
    ratio = costs.get("verify_cost_ratio")
    if ratio is None or not math.isfinite(ratio) or not 0.5 <= ratio <= gamma + 2:
        reasons.append(f"verify/step = {show(ratio)} outside [0.5, {gamma + 2}]")
    return reasons
