"""Auto γ as a row of the eval job: γ (or a tree, or none) chosen before each call, and its metrics.

`AutoRow` follows `eval.rows.Row`: `prepare` chooses the plan and compiles it (untimed), `decode`
is the timed call, `observe` feeds the seconds and the statistics to the controller; `report` adds
the auto row to the metrics (the γ chosen per example, the measured speed, the best fixed γ of the
same run's sweep, paired bootstrap intervals).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from specdec_t5x import metrics
from specdec_t5x.auto import auto_gamma, auto_trees


class AutoRow:
    """The 'auto' row (`auto_gamma.AutoGammaDecoder` on the job's packed parameters)."""

    key = "auto"

    def __init__(self, spec_model, target_params, draft_params, *, settings, speculation, measure,
                 baseline_sampler: str):  # fmt: skip
        self.decoder = auto_gamma.AutoGammaDecoder(
            spec_model,
            target_params,
            draft_params,
            settings=settings,
            gamma_max=speculation.auto_gamma_max,
            cost_repeats=measure.cost_repeats,
            baseline_sampler=baseline_sampler,
            trees=speculation.trees if speculation.auto_trees else (),
            tree_rule=speculation.tree_rule,
        )
        self._plan, self._predicted, self._aux = None, None, None

    def compile(self, batch, rng) -> None:
        """Measures the cost curve and calibrates on the first batch, compiling its first plan."""
        self.decoder.compile(self.decoder.choose(batch)[0], batch)

    def prepare(self, batch) -> None:
        self._plan, self._predicted = self.decoder.choose(batch)
        self.decoder.compile(self._plan, batch)  # a no-op once this plan is compiled

    def decode(self, batch, rng):
        tokens, self._aux = self.decoder.decode(self._plan, batch, rng)
        return tokens, self._aux.get("stats")

    def observe(self, seconds: float, tokens, stats) -> tuple[Any, Any]:
        """Learns α and the call's time; returns (plan, its predicted speed-up) for the record."""
        self.decoder.update(self._aux)
        self.decoder.observe(self._plan, seconds, tokens, self._aux)  # measured vs modelled
        plan = self._plan if isinstance(self._plan, int) else auto_trees.plan_name(self._plan)
        return plan, self._predicted  # γ or 'tree(2,2)'

    def report(self, flat: dict[str, Any], runs: Mapping[Hashable, Any], context) -> None:
        """Adds `flat['auto']`; an auto headline also replaces the headline fields.

        `context`: the job's `ReportContext` (choices per example, headline, quality inputs).
        """
        add_auto_row(flat, runs, context.choices, context.headline == "auto", context.quality)
        controller = self.decoder.controller
        flat["auto"]["cost_curve"] = controller.curve.to_dict()
        flat["auto"]["calls"] = controller.history
        if self.decoder.trees:  # AUTO_TREES: what each tree measured
            flat["auto"]["tree_measured_speedup"] = self.decoder.tree_speedups()


def add_auto_row(flat, runs, choices, headline: bool, quality_args) -> None:
    """Adds the auto-γ row as `flat['auto']`; an auto headline also replaces the headline fields.

    The row (`auto_gamma.summarise_auto`) has the γ chosen per example (0 = off), the mean
    prediction of those choices, the measured speed, and the best fixed γ of the same run's sweep.
    """
    base, run = runs["baseline"], runs["auto"]
    row = auto_gamma.summarise_auto(
        base.seconds,
        run.seconds,
        run.stats,
        [g for g, _ in choices],
        [p for _, p in choices],
        identical=float(
            np.mean([np.array_equal(a, b) for a, b in zip(base.tokens, run.tokens, strict=True)])
        ),
    )
    sweep = flat["gamma_sweep"]
    best = max(sweep, key=lambda g: sweep[g]["speedup"])
    row.update(
        best_fixed_gamma=int(best),
        best_fixed_speedup=sweep[best]["speedup"],
        auto_over_best_fixed=row["speedup"] / sweep[best]["speedup"],
        **(
            {
                "speedup_vs_t5x_sampler": float(
                    np.sum(runs["baseline_t5x"].seconds) / np.sum(run.seconds)
                )
            }
            if "baseline_t5x" in runs
            else {}
        ),
        # Paired bootstrap over examples (5th, 95th percentiles): the run-to-run spread.
        speedup_interval=auto_gamma.bootstrap_interval(base.seconds, run.seconds),
        auto_over_best_fixed_interval=auto_gamma.bootstrap_interval(
            runs[int(best)].seconds, run.seconds
        ),
    )
    flat["auto"] = row
    if headline:
        for key in sweep[best]:
            if key != "quality":  # the top level's quality is {'baseline', 'speculative'}
                flat.pop(key, None)  # the placeholder headline's fields
        flat.update(row)
        predicted = row["predicted_speedup"]
        flat["measured_over_predicted"] = row["speedup"] / predicted if predicted else None
        seqio_task, vocabulary, examples, eos_id = quality_args
        flat["quality"]["speculative"] = metrics.quality(
            seqio_task, vocabulary, examples, run.tokens, eos_id
        )
