"""The row factory: the eval job's rows and the instruments beside them (the job's only way to
auto γ and to the timing code).

`build` returns the baseline(s), one chain per fixed γ, one row per token tree and, with 'auto'
among the γs, auto γ's row (`specdec_t5x.auto.row.AutoRow`), in the job's call-order keys.
`measure_costs` is the instrument: c and verify/step (`eval.cost_probe`).
"""

from __future__ import annotations

from specdec_t5x.auto import row as auto_row
from specdec_t5x.eval import cost_probe
from specdec_t5x.eval import rows as rows_lib
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation
from specdec_t5x.timing import clock

call_order = clock.call_order  # the rows' seeded random order per batch
measure_costs = cost_probe.measure  # c and verify/step: the step timer's one probe (+ the loops)


def build(spec_model, target_params, draft_params, sampling_settings: SamplingSettings,
          speculation, measure) -> list[rows_lib.Row]:  # fmt: skip
    """The rows of a run, parameters as timed (packed once by the job).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`; target_params, draft_params: packed.
      sampling_settings: temperature, top-k, top-p for every row (target and draft alike).
      speculation: `eval.config.SpeculationConfig`; measure: `eval.config.MeasureConfig`.
    """
    settings = sampling_settings.decoder_params()  # the baselines' and auto γ's keywords
    out: list[rows_lib.Row] = []
    for key, sampler in rows_lib.baseline_samplers(settings).items():
        model = rows_lib.baseline_model(spec_model, sampler)
        out.append(rows_lib.BaselineRow(key, model, target_params, settings))
    pair = (spec_model, target_params, draft_params, sampling_settings)
    for g in speculation.fixed_gammas:
        out.append(rows_lib.ChainRow(g, *pair, Speculation(gamma=g)))
    for name, shape in speculation.tree_rows.items():
        tree = Speculation(tree=shape, tree_rule=speculation.tree_rule)
        out.append(rows_lib.TreeRow(name, *pair, tree))
    if speculation.auto:
        sampler = out[0].sampler
        out.append(
            auto_row.AutoRow(
                spec_model,
                target_params,
                draft_params,
                settings=settings,
                speculation=speculation,
                measure=measure,
                baseline_sampler=sampler,
            )
        )
    return out
