"""c and verify/step of an eval run: the step timer's one probe, and the real decode loops.

`measure` prices the run's steps with the step timer (`timing.step_timer.step_costs`: one
compiled probe) and, with the diagnostics, as the decode loops pay them (`timing.loops.loop_costs`
on the first batches' caches); `eval.costs.degenerate` flags a measurement that is no cost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_t5x.eval import costs as costs_lib
from specdec_t5x.timing import loops, step_timer

logger = logging.getLogger(__name__)


def measure(spec_model, target_params, draft_params,
            batches: Sequence[tuple[int, Mapping[str, Any]]], target_len: int, gamma: int,
            settings: Mapping[str, Any], in_loop: bool, repeats: int,
            baseline_sampler: str = "t5x", budget_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The run's costs: `loops.loop_costs`' dict, or the step timer's.

    Args:
      spec_model, target_params, draft_params: the run's pair, parameters as timed.
      batches: the run's `(rows, batch)` list (the step timer uses the first).
      target_len: max_decode_len; gamma: the γ the costs are priced at.
      settings: {'temperature', 'topk', 'topp'}.
      in_loop: also time the real decode loops on the first 4 batches (False: the step timer's
        stand-alone loops alone).
      repeats: timing repeats; budget_s: seconds the step timer's rounds may take once it has
        timed `clock.MIN_ROUNDS` (None: all `repeats`).
      baseline_sampler: the baseline's draw (`decoding.SAMPLERS`), as the run's baseline draws.

    Returns:
      {'c', 'verify_cost_ratio', 'target_step_ms', ... (ms), 'degenerate': list of reasons,
      empty when the measurement is sound}.
    """
    first = batches[0][1]["encoder_input_tokens"]
    costs = step_timer.step_costs(
        spec_model, target_params, draft_params, first, target_len, gamma, repeats=repeats,
        budget_s=budget_s,
    )  # fmt: skip
    sampling_keys = {k: settings[k] for k in ("temperature", "topk", "topp") if k in settings}
    if in_loop:
        sources = [b["encoder_input_tokens"] for _, b in batches]  # loop_costs: one shape
        sources = [s for s in sources if s.shape == first.shape][:4]
        costs = loops.loop_costs(
            spec_model, target_params, draft_params, sources, target_len, gamma, sampling_keys,
            costs, repeats=max(3, repeats // 2), baseline_sampler=baseline_sampler,
        )  # fmt: skip
    costs["degenerate"] = costs_lib.degenerate(costs, gamma)
    if costs["degenerate"]:
        logger.warning(
            "the cost measurement is degenerate (%s): c, verify/step and the predictions built "
            "on them are reported as n/a. Measure on more examples (NUM_EXAMPLES) or on a "
            "quieter machine.",
            "; ".join(costs["degenerate"]),
        )
    return costs
