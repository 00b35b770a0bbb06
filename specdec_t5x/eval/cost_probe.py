"""c and verify/step of an eval run: the step timer's one probe, and the run's own extra calls.

`measure` prices the run's steps with the step timer (`timing.step_timer.step_costs`: one
compiled probe) and, with the diagnostics, from `RunCostCalls`, the extra calls beside the timed
ones (`timing.loops.run_costs`); `eval.costs.degenerate` flags a measurement that is no cost.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import models
from specdec_t5x.eval import costs as costs_lib
from specdec_t5x.eval import rows
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation
from specdec_t5x.timing import loops, overheads, step_timer

logger = logging.getLogger(__name__)


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
        sampling = SamplingSettings(**settings)
        chain = Speculation(gamma=gamma)
        chain_short = Speculation(gamma=gamma, max_decode_steps=self.SHORT)
        spec_short = rows.speculative_fn(spec_model, sampling, chain_short)
        free_full = rows.speculative_fn(free, sampling, chain)
        free_short = rows.speculative_fn(free, sampling, chain_short)
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
        out, seconds = rows.timed(
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


def measure(spec_model, target_params, draft_params,
            batches: Sequence[tuple[int, Mapping[str, Any]]], target_len: int, gamma: int,
            settings: Mapping[str, Any], cost_calls: RunCostCalls | None, repeats: int,
            baseline_sampler: str = "t5x") -> tuple[dict[str, Any], dict[str, float] | None]:  # fmt: skip
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
    costs = step_timer.step_costs(
        spec_model, target_params, draft_params, first, target_len, gamma, repeats=repeats
    )
    work = None
    sampling_keys = {k: settings[k] for k in ("temperature", "topk", "topp") if k in settings}
    if cost_calls is not None:
        shape = (first.shape[0], spec_model.module.config.vocab_size, target_len, gamma)
        work = overheads.measure_loop_ms(
            *shape, sampling_keys, spec_model.eos_id, repeats, baseline_sampler=baseline_sampler
        )
        try:
            costs = loops.run_costs(*cost_calls.measured(), gamma, work, costs)
        except ValueError as err:  # every output within 2 tokens or one iteration
            logger.warning("%s; c and verify/step from the decode loops instead.", err)
            sources = [b["encoder_input_tokens"] for _, b in batches[:4]]
            costs = loops.loop_costs(
                spec_model, target_params, draft_params, sources, target_len, gamma,
                sampling_keys, costs, repeats=max(3, repeats // 2),
                baseline_sampler=baseline_sampler,
            )  # fmt: skip
    costs["degenerate"] = costs_lib.degenerate(costs, gamma)
    if costs["degenerate"]:
        logger.warning(
            "the cost measurement is degenerate (%s): c, verify/step and the predictions built "
            "on them are reported as n/a. Measure on more examples (NUM_EXAMPLES) or on a "
            "quieter machine.",
            "; ".join(costs["degenerate"]),
        )
    return costs, work
