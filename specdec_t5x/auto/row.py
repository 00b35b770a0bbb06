"""Auto γ as a row of the eval job: γ (or none) chosen before each call, and its metrics.

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
from specdec_t5x.auto import auto_gamma


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
        """Learns α and the call's time; returns (γ, its predicted speed-up) for the record."""
        self.decoder.update(self._aux)
        self.decoder.observe(self._plan, seconds, tokens, self._aux)  # measured vs modelled
        return self._plan, self._predicted

    def report(self, flat: dict[str, Any], runs: Mapping[Hashable, Any], context) -> None:
        """Adds `flat['auto']`; an auto headline also replaces the headline fields.

        `context`: the job's `ReportContext` (choices per example, headline, quality inputs).
        """
        add_auto_row(flat, runs, context.choices, context.headline == "auto", context.quality)
        controller = self.decoder.controller
        flat["auto"]["cost_curve"] = controller.curve.to_dict()
        flat["auto"]["calls"] = controller.history


def add_auto_row(flat, runs, choices, headline: bool, quality_args) -> None:
    """Adds the auto-γ row as `flat['auto']`; an auto headline also replaces the headline fields.

    The row (`summarise_auto`) has the γ chosen per example (0 = off), the mean prediction of
    those choices, the measured speed, and the best fixed γ of the same run's sweep (none when
    auto runs alone beside the baseline).
    """
    base, run = runs["baseline"], runs["auto"]
    same = [np.array_equal(a, b) for a, b in zip(base.tokens, run.tokens, strict=True)]
    plans, predicted = [g for g, _ in choices], [p for _, p in choices]
    row = summarise_auto(
        base.seconds, run.seconds, run.stats, plans, predicted, identical=float(np.mean(same))
    )
    sweep = flat.get("gamma_sweep") or {}  # {}: auto alone beside the baseline (GAMMAS = [])
    # Paired bootstrap over examples (5th, 95th percentiles): the run-to-run spread.
    row["speedup_interval"] = bootstrap_interval(base.seconds, run.seconds)
    best = max(sweep, key=lambda g: sweep[g]["speedup"]) if sweep else None
    if best is not None:
        row.update(
            best_fixed_gamma=int(best),
            best_fixed_speedup=sweep[best]["speedup"],
            auto_over_best_fixed=row["speedup"] / sweep[best]["speedup"],
            auto_over_best_fixed_interval=bootstrap_interval(runs[int(best)].seconds, run.seconds),
        )
    if "baseline_t5x" in runs:
        t5x_seconds = np.sum(runs["baseline_t5x"].seconds)
        row["speedup_vs_t5x_sampler"] = float(t5x_seconds / np.sum(run.seconds))
    flat["auto"] = row
    if headline:
        for key in sweep[best] if best is not None else ():
            if key != "quality":  # the top level's quality is {'baseline', 'speculative'}
                flat.pop(key, None)  # the placeholder headline's fields
        flat.update(row)
        predicted = row["predicted_speedup"]
        flat["measured_over_predicted"] = row["speedup"] / predicted if predicted else None
        seqio_task, vocabulary, examples, eos_id = quality_args
        flat["quality"]["speculative"] = metrics.quality(
            seqio_task, vocabulary, examples, run.tokens, eos_id
        )


def bootstrap_interval(
    numerator_seconds, denominator_seconds, rounds: int = 2000, seed: int = 0
) -> list[float]:
    """[5th, 95th] percentiles of Σ numerator / Σ denominator over examples resampled in pairs
    (`rounds` resamples, NumPy `seed`): float [num_examples] wall seconds of two runs on the same
    examples (the baseline and auto: auto's speed-up).

    Raises:
      ValueError: the two runs have different lengths or no examples.
    """
    a, b = np.asarray(numerator_seconds, float), np.asarray(denominator_seconds, float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"need two equal non-empty 1-D runs; got shapes {a.shape}, {b.shape}.")
    idx = np.random.default_rng(seed).integers(0, a.size, size=(rounds, a.size))
    ratios = a[idx].sum(1) / b[idx].sum(1)
    return [float(np.percentile(ratios, 5)), float(np.percentile(ratios, 95))]


def summarise_auto(
    baseline_seconds, seconds, stats, chosen, predictions, identical=None
) -> dict[str, Any]:
    """The eval job's row for an auto-γ run (per-example records, same examples as the baseline).

    Args:
      baseline_seconds, seconds: float [examples] wall seconds of the baseline and auto.
      stats: per example `SpeculativeStats` (NumPy), None where γ = 0 ran.
      chosen: per example γ (an int, or its name: '2').
      predictions: per example the predicted speed-up, None for a measurement call (the probe,
        baseline timings).
      identical: optional fraction of examples equal to the baseline's tokens.

    Returns:
      {'gamma': 'auto', 'gamma_chosen' {γ as a str: count} (γ increasing),
      'baseline_timing_examples', 'probe_examples', 'speedup', 'median_example_speedup',
      'alpha_beta' (chains' β; None without), 'alpha_display', 'tokens_per_iteration',
      'predicted_speedup' (mean over predicted calls), 'identical_fraction',
      'speculative_seconds'}.
    """
    base, secs = np.asarray(baseline_seconds), np.asarray(seconds)
    ran = [s for s in stats if s is not None]
    beta_sum = sum(float(np.sum(s.beta_sum)) for s in ran)
    num_beta = sum(int(np.sum(s.num_beta)) for s in ran)
    iterations = sum(int(np.sum(s.num_iterations)) for s in ran)
    generated = sum(int(np.sum(s.num_generated)) for s in ran)
    alpha = beta_sum / num_beta if num_beta else None
    known = [p for p in predictions if p is not None]
    names = [str(g) for g in chosen]
    order = sorted(set(names), key=int)
    counts = {n: names.count(n) for n in order}
    measuring = [n for n, p in zip(names, predictions, strict=True) if p is None]
    return {
        "gamma": "auto",
        "gamma_chosen": counts,
        "baseline_timing_examples": sum(1 for n in measuring if n == "0"),
        "probe_examples": sum(1 for n in measuring if n != "0"),
        "speedup": float(base.sum() / secs.sum()),
        "median_example_speedup": float(np.median(base / secs)),
        "alpha_beta": alpha,
        "alpha_display": "off" if alpha is None else f"{alpha:.2f}",
        "tokens_per_iteration": generated / iterations if iterations else None,
        "predicted_speedup": float(np.mean(known)) if known else None,
        "identical_fraction": identical,
        "speculative_seconds": float(secs.sum()),
    }
