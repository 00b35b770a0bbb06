"""Whether an eval run's c and verify/step are costs at all (`degenerate`), for every cost path
(the measurements are `eval.cost_probe`'s); the tables print "n/a (degenerate: ...)" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CAP_TOLERANCE = 1.05  # verify-only / iteration within timing noise: a nearly free draft, c ~ 0
NOISE_FRACTION = CAP_TOLERANCE - 1  # of an iteration: a negative interference within it is noise
# ms: a draft step at or below this is no measurement (the timer floors a slope <= 0 at
# `clock.FLOOR_MS`; one iteration of a jitted loop alone costs more on XLA:CPU).
DRAFT_FLOOR_MS = 1e-5


def degenerate(costs: Mapping[str, Any], gamma: int) -> list[str]:
    """Why a cost measurement is not a cost (empty: sound), for every cost path: `costs` is
    `loops.loop_costs`'s or `step_timer.step_costs`'s dict at γ = `gamma` (or a recorded run's).

    Flags a target step <= 1e-3 ms; a draft step no reading resolves (alone <= `DRAFT_FLOOR_MS`
    and c <= 0); a verify call (before any cap) dearer than its iteration by more than
    `CAP_TOLERANCE`; interference below -`NOISE_FRACTION` of the iteration; c outside [0, 1);
    verify/step outside [0.5, γ + 2]. The tables then print "n/a (degenerate: ...)".
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
