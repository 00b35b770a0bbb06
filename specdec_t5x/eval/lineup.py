"""The row factory: the eval job's rows for one configuration (the job's only way to auto γ).

`build` returns the baseline(s), one chain per fixed γ, one row per token tree and, with 'auto'
among the γs, auto γ's row (`specdec_t5x.auto.row.AutoRow`), in the job's call-order keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdec_t5x.auto import row as auto_row
from specdec_t5x.eval import rows as rows_lib


def build(spec_model, target_params, draft_params, settings: Mapping[str, Any], speculation,
          measure) -> list[rows_lib.Row]:  # fmt: skip
    """The rows of a run, parameters as timed (packed once by the job).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`; target_params, draft_params: packed.
      settings: {'temperature', 'topk', 'topp'} for every row.
      speculation: `eval.config.SpeculationConfig`; measure: `eval.config.MeasureConfig`.
    """
    out: list[rows_lib.Row] = []
    for key, sampler in rows_lib.baseline_samplers(settings).items():
        model = rows_lib.baseline_model(spec_model, sampler)
        out.append(rows_lib.BaselineRow(key, model, target_params, settings))
    for g in speculation.fixed_gammas:
        params = {**settings, "gamma": g}
        out.append(rows_lib.ChainRow(g, spec_model, target_params, draft_params, params))
    for name, shape in speculation.tree_rows.items():
        params = {**settings, "tree": shape, "tree_rule": speculation.tree_rule}
        out.append(rows_lib.TreeRow(name, spec_model, target_params, draft_params, params))
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
