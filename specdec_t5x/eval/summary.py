"""What the runs write: the eval job's metrics, tables, predictions and plot; the step-cost table.

`eval.job` decodes and times; this module turns its per-example records into what the paper
reports (Tables 2-4): α (counted, and the Corollary 3.6 β estimate, both from `theory`), the
Theorem 3.8 prediction (`theory.measured_walltime_improvement`, which also takes a measured
α = 1), quality metrics,
the near-tie report of argmax mode, `metrics.json`, `table_row.md`, `predictions.jsonl` and
`speedup.png`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specdec_t5x import metrics, speculative, theory

STAT_KEYS = [f.name for f in dataclasses.fields(speculative.SpeculativeStats)]


@dataclasses.dataclass
class Run:
    """Per-example records of one decoder (baseline or speculative at one γ).

    Attributes:
      seconds: wall seconds per example (a batch's time split evenly over its rows).
      tokens: int32 [max_decode_len] decoded tokens per example.
      stats: per-example `speculative.SpeculativeStats` of NumPy scalars (None for the baseline).
    """

    seconds: list = dataclasses.field(default_factory=list)
    tokens: list = dataclasses.field(default_factory=list)
    stats: list = dataclasses.field(default_factory=list)


def predicted_speedups(
    alpha: float, gamma: int, c: float, verify_cost_ratio: float
) -> dict[str, float]:
    """Eq. 1 and Theorem 3.8 at a measured α (which may be exactly 1), from `theory`."""
    predict = functools.partial(theory.measured_walltime_improvement, alpha, gamma)
    return {
        "expected_tokens_per_iteration_eq1": float(predict(0.0)),  # c = 0, unit verify: Eq. 1
        "predicted_speedup_thm38": float(predict(c)),
        # Thm 3.8 with the measured verify cost instead of the paper's ~1x assumption.
        "predicted_speedup_measured_verify": float(predict(c, verify_cost_ratio)),
    }


def thm38_prediction(
    alpha: float | None, gamma_counts: Mapping[int, int], c: float, verify_cost_ratio: float
) -> float | None:
    """Theorem 3.8's speed-up of a table row, fixed γ or auto, from the inputs the table shows.

    Every row's "Predicted (Thm 3.8)" cell and every curve of `speedup.png` comes from here:
    E(α, γ) / (γc + verify/step) (`theory.measured_walltime_improvement`) with the row's α, the
    c and verify/step of the row. A fixed row is {γ: 1}. An auto row is its γ chosen per example
    ({γ: examples}, γ = 0 the baseline alone: 1X), each priced at the same α, c and verify/step,
    combined as the run's speed-up is (total baseline time over total speculative time, every
    example's baseline time alike: the examples' harmonic mean).

    Args:
      alpha: the row's α (None when no chain ran: only γ = 0 is then priced).
      gamma_counts: {γ: examples}, γ >= 0.
      c, verify_cost_ratio: the table's c and verify/step.

    Returns:
      Predicted speed-up (X), or None when a γ > 0 has no α or there are no examples.
    """
    total, time = 0, 0.0
    for g, n in gamma_counts.items():
        if not n:
            continue
        if g == 0:
            speedup = 1.0
        elif alpha is None:
            return None
        else:
            speedup = float(theory.measured_walltime_improvement(alpha, g, c, verify_cost_ratio))
        total += n
        time += n / speedup
    return total / time if total else None


def c_at_gamma(costs: dict[str, Any], g: int, gamma: int) -> float:
    """The draft's in-loop c at γ = g from step costs measured at γ = `gamma`.

    `timing.step_timer.time_decoder_steps` measures c in the loop at one γ: the draft's lone step
    (`c_alone`) plus the iteration's interference (the draft reloaded into the CPU's caches after
    each verify call, `interference_ms`, once per iteration) spread over γ steps. At another γ the
    same interference is spread over g steps. Step costs without these keys (older metrics) give
    `costs['c']` unchanged.

    Args:
      costs: `timing.step_timer.time_decoder_steps`'s dict; g: the γ to price (>= 1); gamma: the γ the
        costs were measured at.

    Returns:
      c at g (dimensionless, >= 0).
    """
    if g == gamma or "c_alone" not in costs or "interference_ms" not in costs:
        return float(costs["c"])
    extra = costs["interference_ms"] / (g * costs["target_step_ms"])
    return max(float(costs["c_alone"]) + extra, 0.0)


def group_by_call(values: Sequence[int], rows_per_call: Sequence[int]) -> np.ndarray:
    """Per-example integers grouped by decode call.

    Args:
      values: int [examples], in example order.
      rows_per_call: rows of each call, in order (sums to examples).

    Returns:
      int64 [calls, max rows], ragged calls padded with 0.
    """
    out = np.zeros((len(rows_per_call), max(rows_per_call, default=1)), np.int64)
    start = 0
    for i, n in enumerate(rows_per_call):
        out[i, :n] = values[start : start + n]
        start += n
    return out


def predicted_at_output_lengths(
    base_lengths: Sequence[int],
    lengths: Sequence[int],
    rows_per_call: Sequence[int],
    alpha: float,
    gamma: int,
    c: float,
    verify_cost_ratio: float,
) -> float:
    """Thm 3.8 with the measured verify cost, its iterations counted at the run's output lengths.

    Theorem 3.8 is E(α, γ) / (γc + verify): tokens per iteration from Eq. 1, i.e. outputs long
    enough that the last block of each output does not matter. Here the iterations are
    `theory.expected_iterations` of the same i.i.d. model at the lengths this run produced (the
    last block cut at EOS or at the length limit, a call running until its slowest row ends), and
    the baseline's target calls are its own (the longest row of each call). Same α, c and verify
    cost; nothing fitted. For long outputs and one row per call it tends to Theorem 3.8.

    Args:
      base_lengths: int [examples] the baseline's output lengths (tokens, EOS counted).
      lengths: int [examples] this speculative run's output lengths (equal to base_lengths at
        T = 0; other samples at T > 0).
      rows_per_call: rows of each decode call, in example order (sums to examples).
      alpha, gamma, c, verify_cost_ratio: as `theory.measured_walltime_improvement`.

    Returns:
      Predicted speedup (X).

    Raises:
      ValueError: rows_per_call does not add up to the examples; bad α, γ or lengths
        (`theory.expected_iterations`).
    """
    if sum(rows_per_call) != len(lengths) or len(base_lengths) != len(lengths):
        raise ValueError(
            f"rows_per_call adds up to {sum(rows_per_call)} rows for {len(lengths)} speculative and "
            f"{len(base_lengths)} baseline examples."
        )
    base_calls = float(np.sum(np.max(group_by_call(base_lengths, rows_per_call), axis=1)))
    iterations = float(
        np.sum(theory.expected_iterations(group_by_call(lengths, rows_per_call), alpha, gamma))
    )
    return base_calls / (iterations * (gamma * c + verify_cost_ratio))


def summarise(
    runs,
    gammas,
    gamma,
    costs,
    examples,
    seqio_task,
    vocabulary,
    eos_id,
    settings,
    rows_per_call=None,
):
    """Metrics of the headline γ and the γ sweep from `Run` records and measured step costs.

    Args:
      runs: {'baseline': Run, γ: Run for each γ in gammas}; at T > 0 also 'baseline_t5x' (T5X's
        sampler; `speedup_vs_t5x_sampler` beside `speedup`, which is against the fair baseline).
      gammas: the γ values run; gamma: the headline one (None: no fixed γ, auto alone).
      costs: `timing.step_timer.time_decoder_steps` result ('c', 'verify_cost_ratio', ...).
      examples, seqio_task, vocabulary, eos_id: for the quality metrics.
      settings: the sampling settings dict, written as is.
      rows_per_call: rows of each decode call in example order (None: one example per call).

    Returns:
      The metrics dict (headline γ fields at top level, `gamma_sweep` per γ).
    """
    base = runs["baseline"]
    base_s = float(np.sum(base.seconds))
    base_lengths = [len(metrics.until_eos(t, eos_id)) for t in base.tokens]
    base_tokens = int(sum(base_lengths))
    rows_per_call = [1] * len(base_lengths) if rows_per_call is None else list(rows_per_call)
    sweep = {}
    for g in gammas:
        run = runs[g]
        st = {k: np.sum([getattr(s, k) for s in run.stats], axis=0) for k in STAT_KEYS}
        alpha_beta = float(theory.alpha_from_beta(st["beta_sum"], st["num_beta"]))
        alpha_counted = float(theory.alpha_counted(st["num_accepted"], st["num_draft_tokens"]))
        c = c_at_gamma(costs, g, gamma)
        predicted = predicted_speedups(alpha_beta, g, c, costs["verify_cost_ratio"])
        predicted["predicted_speedup_output_lengths"] = predicted_at_output_lengths(
            base_lengths,
            [int(s.num_generated) for s in run.stats],
            rows_per_call,
            alpha_beta,
            g,
            c,
            costs["verify_cost_ratio"],
        )
        predicted["c_at_gamma"] = c
        spec_s = float(np.sum(run.seconds))
        t5x_sampler = {}  # T > 0: the speed-up against T5X's Gumbel draw too
        if "baseline_t5x" in runs:
            t5x_sampler["speedup_vs_t5x_sampler"] = (
                float(np.sum(runs["baseline_t5x"].seconds)) / spec_s
            )
        sweep[g] = {
            "speedup": base_s / spec_s,
            **t5x_sampler,
            "median_example_speedup": float(
                np.median(np.asarray(base.seconds) / np.asarray(run.seconds))
            ),
            "alpha_counted": alpha_counted,
            "alpha_beta": alpha_beta,
            "tokens_per_iteration": float(st["num_generated"] / max(st["num_iterations"], 1)),
            **predicted,
            "target_calls": int(st["num_iterations"]),
            "baseline_target_calls": base_tokens,
            "speculative_seconds": spec_s,
            "speculative_tokens_per_s": float(st["num_generated"]) / spec_s,
            "accept_histogram": [int(x) for x in st["accept_histogram"]],
            "identical_fraction": float(
                np.mean(
                    [np.array_equal(a, b) for a, b in zip(base.tokens, run.tokens, strict=True)]
                )
            ),
            "quality": metrics.quality(seqio_task, vocabulary, examples, run.tokens, eos_id),
        }
    head = sweep[gamma] if gamma is not None else {}  # None: auto alone (its row fills these)
    return {
        **{k: head[k] for k in head if k not in ("quality",)},
        "c_measured": costs["c"],
        "c_alone": costs.get("c_alone"),
        "verify_cost_ratio": costs["verify_cost_ratio"],
        "step_costs": costs,
        "measured_over_predicted": (
            head["speedup"] / head["predicted_speedup_thm38"] if head else None
        ),
        "baseline_seconds": base_s,
        "baseline_tokens_per_s": base_tokens / base_s,
        **(
            {"baseline_t5x_seconds": float(np.sum(runs["baseline_t5x"].seconds))}
            if "baseline_t5x" in runs
            else {}
        ),
        "quality": {
            "baseline": metrics.quality(seqio_task, vocabulary, examples, base.tokens, eos_id),
            "speculative": head.get("quality"),
        },
        "gamma_sweep": {str(g): v for g, v in sweep.items()},
        "sampling": settings,
    }


def tree_rows(runs, trees: Mapping[str, Any], headline) -> dict[str, dict[str, Any]]:
    """The tree rows of the sweep: speed, tokens per target call, acceptance per depth and rank.

    Args:
      runs: the job's {'baseline' | γ | tree name: Run}; trees: {tree row name: its shape}
      (`eval.config.SpeculationConfig.tree_rows`); headline: the headline γ (its tokens per
      target call is the chain's to beat).

    Returns:
      {name: {'speedup', 'speedup_vs_t5x_sampler' (T > 0), 'tokens_per_iteration', 'alpha_beta'
      (Corollary 3.6 over the tested depths' nodes), 'depth_acceptance' [D], 'rank_acceptance'
      [k_max] (accepted / tested over the run), 'accept_histogram' [D + 1], 'target_calls',
      'identical_fraction', 'tokens_per_call_over_chain', 'node_accepted' {node's child-rank
      path '0.1' or 'root': iterations whose accepted path passed it}, 'subtrees' {k: the name of
      the tree of
      k nodes within this one whose nodes were accepted most (`tree.optimal_paths` on
      node_accepted; at T = 0 exactly the k-node subtree that would have accepted the most on
      these iterations)}}}.
    """
    from specdec_t5x import tree as tree_lib  # local: imports the network

    base = runs["baseline"]
    chain = runs[headline]

    def total(run, field):
        return np.sum([np.asarray(getattr(s, field)) for s in run.stats], axis=0)

    chain_tpc = float(total(chain, "num_generated") / max(total(chain, "num_iterations"), 1))
    out = {}
    for name, spec in trees.items():
        run = runs[name]
        shape = tree_lib.parse_tree(spec)
        seconds = float(np.sum(run.seconds))
        generated, calls = total(run, "num_generated"), total(run, "num_iterations")
        ratio = lambda a, b: (a / np.maximum(b, 1)).tolist()  # noqa: E731
        row = {
            "speedup": float(np.sum(base.seconds)) / seconds,
            "tokens_per_iteration": float(generated / max(calls, 1)),
            "alpha_beta": float(
                theory.alpha_from_beta(total(run, "beta_sum"), total(run, "num_beta"))
            ),
            "depth_acceptance": ratio(total(run, "depth_accepted"), total(run, "depth_tested")),
            "rank_acceptance": ratio(
                total(run, "rank_accepted").sum(0), total(run, "rank_tested").sum(0)
            ),
            "accept_histogram": [int(x) for x in total(run, "accept_histogram")],
            "target_calls": int(calls),
            "identical_fraction": float(
                np.mean(
                    [np.array_equal(a, b) for a, b in zip(base.tokens, run.tokens, strict=True)]
                )
            ),
        }
        row["tokens_per_call_over_chain"] = row["tokens_per_iteration"] / chain_tpc
        per_node = np.reshape(total(run, "node_accepted"), (-1, shape.num_nodes)).sum(0)
        counts = dict(zip(shape.node_paths, per_node.tolist(), strict=True))
        row["node_accepted"] = {".".join(map(str, p)) or "root": c for p, c in counts.items()}
        row["subtrees"] = {
            k: tree_lib.tree_name(tree_lib.optimal_paths(counts, k))
            for k in range(2, shape.num_nodes)
            if any(counts[p] for p in shape.node_paths[1:])
        }
        if "baseline_t5x" in runs:
            row["speedup_vs_t5x_sampler"] = float(np.sum(runs["baseline_t5x"].seconds)) / seconds
        out[name] = row
    return out


# `metrics.json`'s top level: each flat key of the job's record goes in one group (keys no group
# names go in 'other'). `flat` undoes it: the flat view the tables read.
GROUPS = {
    "task": (
        "task",
        "split",
        "num_examples",
        "batch_size",
        "input_len",
        "max_decode_len",
        "draft",
        "inputs",
    ),
    "decoding": (
        "gamma",
        "temperature",
        "topk",
        "topp",
        "sampling",
        "baseline_sampler",
        "cpu_weight_dtype",
    ),
    "speed": (
        "speedup",
        "speedup_vs_t5x_sampler",
        "median_example_speedup",
        "speedup_interval",
        "baseline_seconds",
        "baseline_t5x_seconds",
        "speculative_seconds",
        "baseline_tokens_per_s",
        "speculative_tokens_per_s",
        "target_calls",
        "baseline_target_calls",
        "busy_machine",
    ),
    "acceptance": (
        "alpha_beta",
        "alpha_counted",
        "alpha_display",
        "tokens_per_iteration",
        "accept_histogram",
    ),
    "costs": ("c_measured", "c_alone", "verify_cost_ratio", "c_at_gamma", "step_costs"),
    "predictions": (
        "expected_tokens_per_iteration_eq1",
        "predicted_speedup_thm38",
        "predicted_speedup_measured_verify",
        "predicted_speedup_output_lengths",
        "predicted_speedup_measured_costs",
        "predicted_speedup",
        "measured_over_predicted",
    ),
    "exactness": (
        "identical_fraction",
        "near_ties",
        "max_near_tie_gap",
        "weight_flips",
        "compilations_during_timing",
    ),
    "provenance": (
        "command",
        "commit",
        "hardware",
        "cpu",
        "date",
        "switches",
        "resumed",
        "phases_s",
    ),
}
NESTED = ("quality", "gamma_sweep", "tree_sweep", "auto", "diagnostics")  # kept as they are
_GROUP_OF = {key: group for group, keys in GROUPS.items() for key in keys}


def group(flat_metrics: dict[str, Any]) -> dict[str, Any]:
    """The job's flat record grouped for `metrics.json` (`GROUPS`, then `NESTED` as they are).

    Keys of an auto headline's row that no group names (its γ counts, best fixed γ, ...) are
    in `metrics['auto']` already and are dropped from the top level.
    """
    out: dict[str, Any] = {name: {} for name in GROUPS}
    for key, value in flat_metrics.items():
        if key in NESTED:
            out[key] = value
        elif key in _GROUP_OF:
            out[_GROUP_OF[key]][key] = value
        elif "auto" not in flat_metrics or key not in flat_metrics["auto"]:
            out.setdefault("other", {})[key] = value
    return out


def flat(metrics_record: dict[str, Any]) -> dict[str, Any]:
    """The flat view of a grouped `metrics.json` record (`group`).

    Groups are merged into the top level; `diagnostics` also lifts its `time_budget`. A flat view
    passes through unchanged (`flat(flat(m)) == flat(m)`): the tables hand their flat rows back.
    """
    out = {}
    for key, value in metrics_record.items():
        if (key in GROUPS or key == "other") and isinstance(value, dict):
            out.update(value)
        else:
            out[key] = value
    if out.get("gamma") == "auto" and isinstance(out.get("auto"), dict):
        for key, value in out["auto"].items():  # an auto headline's row (γ counts, ...)
            out.setdefault(key, value)
    if isinstance(out.get("diagnostics"), dict) and "time_budget" in out["diagnostics"]:
        out["time_budget"] = out["diagnostics"]["time_budget"]
    return out
