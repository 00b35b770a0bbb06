"""What the runs write: the eval job's metrics, tables, predictions and plot; the step-cost table.

`evaluation` decodes and times; this module turns its per-example records into what the paper
reports (Tables 2-4): α (counted, and the Corollary 3.6 β estimate, both from `theory`), the
Theorem 3.8 prediction (`theory.measured_walltime_improvement`, which also takes a measured
α = 1), quality metrics,
the near-tie report of argmax mode, `metrics.json`, `table_row.md`, `predictions.jsonl` and
`speedup.png`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import provenance, speculative, theory

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


def until_eos(tokens: Sequence[int] | np.ndarray, eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (the padding after it dropped)."""
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def decode_text(vocabulary, tokens: np.ndarray, eos_id: int) -> str:
    """Text of int32 [len] tokens up to EOS (space-separated ids without a vocabulary)."""
    ids = [t for t in until_eos(tokens, eos_id) if t != eos_id]
    return vocabulary.decode(ids) if vocabulary is not None else " ".join(map(str, ids))


def quality(seqio_task, vocabulary, examples, tokens, eos_id) -> dict[str, float]:
    """The task's own seqio metrics (BLEU, ROUGE, ...) of decoded tokens against the references."""
    predictions = [decode_text(vocabulary, t, eos_id) for t in tokens]
    targets = [e["targets_pretokenized"] for e in examples]
    scores = {}
    for metric_fn in seqio_task.metric_fns:
        scores.update({k: float(v) for k, v in metric_fn(targets, predictions).items()})
    return scores


def _teacher_forced_logits(module, params, encoder_input_tokens, tokens) -> np.ndarray:
    """float32 [len, vocab] logits of the full forward on int32 [len] `tokens` (shifted right)."""
    targets = jnp.asarray(tokens)[None]  # [1, len]
    dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # shifted right: start token 0
    return np.asarray(
        module.apply(
            {"params": params},
            jnp.asarray(encoder_input_tokens)[None],
            dec_in,
            jnp.ones_like(targets),
            enable_dropout=False,
        )[0]
    )


def near_tie_report(module, target_params, encoder_input_tokens, baseline, speculative_tokens):
    """Where greedy outputs differ: the first differing position and the target's top-2 gap there.

    Args:
      module: target network.
      target_params: its parameters.
      encoder_input_tokens: int32 [enc_len].
      baseline: int32 [max_decode_len] baseline greedy tokens.
      speculative_tokens: int32 [max_decode_len] speculative tokens (differing somewhere).

    Returns:
      dict with `position`, `baseline_token`, `speculative_token`, `top2_logit_gap` (float, logits
      units, computed with the teacher-forced full forward on the baseline prefix) and
      `speculative_is_runner_up`.
    """
    diff = np.nonzero(np.asarray(baseline) != np.asarray(speculative_tokens))[0]
    t = int(diff[0])
    logits = _teacher_forced_logits(module, target_params, encoder_input_tokens, baseline)[t]
    order = np.argsort(logits)
    top2 = logits[order[-2:]]
    return {
        "position": t,
        "baseline_token": int(baseline[t]),
        "speculative_token": int(speculative_tokens[t]),
        "top2_logit_gap": float(top2[1] - top2[0]),
        "speculative_is_runner_up": int(order[-2]) == int(speculative_tokens[t]),
    }


def weight_flip_report(
    module, float32_params, bfloat16_params, encoder_input_tokens, float32_tokens, bfloat16_tokens
):
    """What bfloat16-stored CPU weights flipped in a greedy decode (`CPU_WEIGHT_DTYPE='bfloat16'`).

    Both decodes share the prefix before the first differing position t; there the float32-weight
    model chose token a and the bfloat16-weight model token b. Each model's logits come from the
    teacher-forced full forward on its own decode.

    Args:
      module: target network.
      float32_params, bfloat16_params: its parameters with float32 / bfloat16 packed panels.
      encoder_input_tokens: int32 [enc_len].
      float32_tokens, bfloat16_tokens: int32 [max_decode_len] greedy decodes (differing somewhere).

    Returns:
      dict with `position` t, `float32_token` a, `bfloat16_token` b, `float32_logit_gap`
      (l32[a] - l32[b] >= 0: how far from a tie the float32 model was, logits units),
      `bfloat16_logit_gap` (l16[b] - l16[a] >= 0) and `bfloat16_is_float32_runner_up`.
    """
    diff = np.nonzero(np.asarray(float32_tokens) != np.asarray(bfloat16_tokens))[0]
    t = int(diff[0])
    a, b = int(float32_tokens[t]), int(bfloat16_tokens[t])
    l32 = _teacher_forced_logits(module, float32_params, encoder_input_tokens, float32_tokens)[t]
    l16 = _teacher_forced_logits(module, bfloat16_params, encoder_input_tokens, bfloat16_tokens)[t]
    return {
        "position": t,
        "float32_token": a,
        "bfloat16_token": b,
        "float32_logit_gap": float(l32[a] - l32[b]),
        "bfloat16_logit_gap": float(l16[b] - l16[a]),
        "bfloat16_is_float32_runner_up": int(np.argsort(l32)[-2]) == b,
    }


def _predicted(alpha: float, gamma: int, c: float, verify_cost_ratio: float) -> dict[str, float]:
    """Eq. 1 and Theorem 3.8 at a measured α (which may be exactly 1), from `theory`."""
    predict = functools.partial(theory.measured_walltime_improvement, alpha, gamma)
    return {
        "expected_tokens_per_iteration_eq1": float(predict(0.0)),  # c = 0, unit verify: Eq. 1
        "predicted_speedup_thm38": float(predict(c)),
        # Thm 3.8 with the measured verify cost instead of the paper's ~1x assumption.
        "predicted_speedup_measured_verify": float(predict(c, verify_cost_ratio)),
    }


def c_at_gamma(costs: dict[str, Any], g: int, gamma: int) -> float:
    """The draft's in-loop c at γ = g from step costs measured at γ = `gamma`.

    `benchmark.time_decoder_steps` measures c in the loop at one γ: the draft's lone step
    (`c_alone`) plus the iteration's interference (the draft reloaded into the CPU's caches after
    each verify call, `interference_ms`, once per iteration) spread over γ steps. At another γ the
    same interference is spread over g steps. Step costs without these keys (older metrics) give
    `costs['c']` unchanged.

    Args:
      costs: `benchmark.time_decoder_steps`'s dict; g: the γ to price (>= 1); gamma: the γ the
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
      runs: {'baseline': Run, γ: Run for each γ in gammas}.
      gammas: the γ values run; gamma: the headline one.
      costs: `benchmark.time_decoder_steps` result ('c', 'verify_cost_ratio', ...).
      examples, seqio_task, vocabulary, eos_id: for quality metrics.
      settings: the sampling settings dict, written as is.
      rows_per_call: rows of each decode call in example order (None: one example per call).

    Returns:
      The metrics dict (headline γ fields at top level, `gamma_sweep` per γ).
    """
    base = runs["baseline"]
    base_s = float(np.sum(base.seconds))
    base_lengths = [len(until_eos(t, eos_id)) for t in base.tokens]
    base_tokens = int(sum(base_lengths))
    rows_per_call = [1] * len(base_lengths) if rows_per_call is None else list(rows_per_call)
    sweep = {}
    for g in gammas:
        run = runs[g]
        st = {k: np.sum([getattr(s, k) for s in run.stats], axis=0) for k in STAT_KEYS}
        alpha_beta = float(theory.alpha_from_beta(st["beta_sum"], st["num_beta"]))
        alpha_counted = float(theory.alpha_counted(st["num_accepted"], st["num_draft_tokens"]))
        c = c_at_gamma(costs, g, gamma)
        predicted = _predicted(alpha_beta, g, c, costs["verify_cost_ratio"])
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
        sweep[g] = {
            "speedup": base_s / spec_s,
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
            "quality": quality(seqio_task, vocabulary, examples, run.tokens, eos_id),
        }
    head = sweep[gamma]
    return {
        **{k: head[k] for k in head if k not in ("quality",)},
        "c_measured": costs["c"],
        "c_alone": costs.get("c_alone"),
        "verify_cost_ratio": costs["verify_cost_ratio"],
        "step_costs": costs,
        "measured_over_predicted": head["speedup"] / head["predicted_speedup_thm38"],
        "baseline_seconds": base_s,
        "baseline_tokens_per_s": base_tokens / base_s,
        "quality": {
            "baseline": quality(seqio_task, vocabulary, examples, base.tokens, eos_id),
            "speculative": head["quality"],
        },
        "gamma_sweep": {str(g): v for g, v in sweep.items()},
        "sampling": settings,
    }


TABLE_HEADER = (
    "| Task | M_q | Temp | γ | α | c | verify/step | tokens/iter | Speed | Predicted (Thm 3.8) "
    "| Predicted (measured verify) | Predicted (measured verify, output lengths) "
    "| Predicted (measured costs) | identical |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(m: dict[str, Any]) -> str:
    """One markdown row shaped like the paper's Table 2, plus c, the verify cost, tokens per
    iteration, Thm 3.8 with the measured verify cost (E / (γc + verify)), the same with its
    iterations counted at the run's output lengths (`predicted_at_output_lengths`: the last block
    of each output cut at EOS; "–" in metrics written before it existed), the prediction from all
    measured component costs (`time_budget`: set-up, loop work, model calls) and identical_fraction
    (1.0 expected at T = 0; at T > 0 outputs are different samples of the same distribution).

    An auto-γ row (`m['gamma'] == 'auto'`) shows the γ chosen per example (off = the baseline
    alone), α or "off" when no example ran speculatively, its speed with the paired-bootstrap 5–95 %
    interval over examples, and its prediction from the measured cost curve (`gamma_control`) in
    the measured-verify column."""
    if m["gamma"] == "auto":
        return _auto_row(m)
    costs = m.get("predicted_speedup_measured_costs")  # absent: before `time_budget`, or skipped
    costs = "–" if costs is None else f"{costs:.2f}X"
    lengths = m.get("predicted_speedup_output_lengths")
    lengths = "–" if lengths is None else f"{lengths:.2f}X"
    return (
        f"| {m['task']} | {m['draft']} | {m['temperature']:g} | {m['gamma']} | "
        f"{m['alpha_beta']:.2f} | {c_cell(m)} | {m['verify_cost_ratio']:.2f} | "
        f"{m['tokens_per_iteration']:.2f} | {m['speedup']:.2f}X | {m['predicted_speedup_thm38']:.2f}X | "
        f"{m['predicted_speedup_measured_verify']:.2f}X | {lengths} | {costs} | "
        f"{m['identical_fraction']:.2f} |"
    )


def c_cell(m: dict[str, Any]) -> str:
    """The table's c: in the loop (the draft between verify calls), and its lone-loop value."""
    alone = m.get("c_alone")
    return f"{m['c_measured']:.3f}" + ("" if alone is None else f" ({alone:.3f} alone)")


def auto_choices(m: dict[str, Any]) -> str:
    """'off×a, baseline timing×b, 2×c, …' of an auto row (`gamma_control.summarise_auto`)."""
    timing = m.get("baseline_timing_examples", 0)
    parts = []
    for g, n in m["gamma_chosen"].items():
        if g != "0":
            parts.append(f"{g}×{n}")
            continue
        if n > timing:
            parts.append(f"off×{n - timing}")
        if timing:
            parts.append(f"baseline timing×{timing}")
    return ", ".join(parts)


def _auto_row(m: dict[str, Any]) -> str:
    chosen = auto_choices(m)
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    speed = f"{m['speedup']:.2f}X"
    if m.get("speedup_interval"):  # paired bootstrap 5–95 % over examples
        speed += " ({:.2f}–{:.2f})".format(*m["speedup_interval"])
    return (
        f"| {m['task']} | {m['draft']} | {m['temperature']:g} | auto ({chosen}) | "
        f"{m['alpha_display']} | {c_cell(m)} | {m['verify_cost_ratio']:.2f} | "
        f"{fmt(m['tokens_per_iteration'])} | {speed} | – | "
        f"{fmt(m['predicted_speedup'])}X | – | – | {fmt(m['identical_fraction'])} |"
    )


def auto_table_row(m: dict[str, Any]) -> str | None:
    """The auto-γ row of a run whose sweep included 'auto' (None otherwise)."""
    if "auto" not in m or m["gamma"] == "auto":
        return None
    keys = ("task", "draft", "temperature", "c_measured", "verify_cost_ratio")
    return _auto_row({**m["auto"], **{k: m[k] for k in keys}})


def results_table(metrics_files: Sequence[str | os.PathLike]) -> str:
    """Markdown table (Table 2 shape) of several runs' `metrics.json`, in the given order; a run
    whose sweep included 'auto' adds its auto-γ row (`auto_table_row`) after its own row."""
    rows = []
    for f in metrics_files:
        m = json.loads(pathlib.Path(f).read_text())
        rows += [r for r in (table_row(m), auto_table_row(m)) if r]
    return "\n".join([TABLE_HEADER, *rows])


def provenance_footer(metrics_files: Sequence[str | os.PathLike]) -> str:
    """Where a `results_table` of these runs came from: one line when every run has one commit,
    else one line per commit naming its runs' folders (with their parent folder when two runs'
    folders share a name), their first and last dates and hardware (a table assembled from runs
    at several commits must say which row came from which).

    Raises ValueError if metrics_files is empty.
    """
    if not metrics_files:
        raise ValueError("provenance_footer needs at least one metrics.json, got none")
    paths = [pathlib.Path(f) for f in metrics_files]
    runs = [json.loads(f.read_text()) for f in paths]
    first = runs[0]
    if len({m["commit"] for m in runs}) == 1:
        return f"Hardware: {first['hardware']}; commit `{first['commit']}`; {first['date']}."
    names = [f.parent.name for f in paths]
    if len(set(names)) < len(names):  # the same run folder name under several tables
        names = [f"{f.parent.parent.name}/{f.parent.name}" for f in paths]
    lines = []
    for commit in dict.fromkeys(m["commit"] for m in runs):
        rows = [(n, m) for n, m in zip(names, runs, strict=True) if m["commit"] == commit]
        dates = sorted(m["date"] for _, m in rows)
        lines.append(
            f"- {', '.join(name for name, _ in rows)}: commit `{commit}`, "
            f"{dates[0]} to {dates[-1]}; {rows[0][1]['hardware']}."
        )
    return "Rows from more than one run:\n\n" + "\n".join(lines)


RUN_TO_RUN_HEADER = (
    "| run | T | verify/step | T(1) | iteration | set-up share | speed | decode-loop speed "
    "| Predicted (measured verify) | counted iterations | Predicted (measured costs) "
    "| gap (measured verify) |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def run_to_run_table(run_dirs: Sequence[str | os.PathLike]) -> str:
    """One markdown row per eval run (a folder holding `metrics.json`), from what it recorded:
    where "Predicted (measured verify)" parts from the measured speed, run by run.

    Columns: verify/step; T(1) and one speculative iteration (ms, the decode loops' own slopes,
    `loops.loop_costs`); set-up share (the target's encoder and cache set-up summed over the
    run's calls, `time_budget.measure_setup_ms`, over the measured baseline wall time); the
    measured speed-up; the decode-loop speed-up (both measured wall times minus each side's
    modelled set-up); the ladder's rungs (`time_budget.time_budget`): Theorem 3.8 with the
    measured verify cost (Eq. 1 at α, model calls only: the tables' "Predicted (measured
    verify)"), the same at the counted iterations, and the full composition ("Predicted
    (measured costs)"); and "Predicted (measured verify)" over the measured speed, minus 1.

    Raises:
      FileNotFoundError: a folder without metrics.json.
      ValueError: a run without `time_budget` (run with `measure_time_budget=False`).
    """
    rows = []
    for d in map(pathlib.Path, run_dirs):
        m = json.loads((d / "metrics.json").read_text())
        if "time_budget" not in m:
            raise ValueError(
                f"{d / 'metrics.json'} has no 'time_budget': the run was made with "
                "measure_time_budget=False; re-run it with the default (True)."
            )
        tb, costs = m["time_budget"], m["step_costs"]
        base_ms, spec_ms = m["baseline_seconds"] * 1e3, m["speculative_seconds"] * 1e3
        setup_t = tb["baseline"]["setup_target"]
        setup_d = tb["speculative"].get("setup_draft", 0.0)
        decode_loop = (base_ms - setup_t) / (spec_ms - setup_t - setup_d)
        eq1 = tb["ladder"]["model calls, iterations from Eq. 1 at α"]
        counted = tb["ladder"]["model calls, counted iterations"]
        speed = m["speedup"]
        rows.append(
            f"| {d.parent.name}/{d.name} | {m['temperature']:g} | {m['verify_cost_ratio']:.2f} "
            f"| {costs['target_step_ms']:.3f} ms | {costs['iteration_ms']:.3f} ms "
            f"| {setup_t / base_ms:.0%} | {speed:.3f}X | {decode_loop:.3f}X | {eq1:.3f}X "
            f"| {counted:.3f}X | {m['predicted_speedup_measured_costs']:.3f}X "
            f"| {eq1 / speed - 1:+.1%} |"
        )
    return "\n".join([RUN_TO_RUN_HEADER, *rows])


def write_eval_outputs(out_dir, metrics, runs, gammas, gamma, examples, vocabulary, eos_id):
    """Writes `metrics.json`, `table_row.md`, `predictions.jsonl` and `speedup.png` to out_dir."""
    out_dir = pathlib.Path(out_dir)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float) + "\n")
    rows = [table_row(metrics), auto_table_row(metrics)]
    (out_dir / "table_row.md").write_text("\n".join([TABLE_HEADER, *(r for r in rows if r)]) + "\n")
    with open(out_dir / "predictions.jsonl", "w") as f:
        base, spec = runs["baseline"], runs[gamma]
        for i, ex in enumerate(examples):
            stats = spec.stats[i]  # None where an auto run chose γ = 0 (the baseline)
            st = (
                None
                if stats is None
                else {k: np.asarray(getattr(stats, k)).tolist() for k in STAT_KEYS}
            )
            row = {
                "input": ex["inputs_pretokenized"],
                "reference": ex["targets_pretokenized"],
                "baseline": decode_text(vocabulary, base.tokens[i], eos_id),
                "speculative": decode_text(vocabulary, spec.tokens[i], eos_id),
                "identical": bool(np.array_equal(base.tokens[i], spec.tokens[i])),
                "baseline_s": base.seconds[i],
                "speculative_s": spec.seconds[i],
                "stats": st,
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if metrics["gamma"] != "auto":  # the plot shows one fixed γ's histogram
        speedup_plot(out_dir / "speedup.png", metrics, gammas)


def speedup_plot(path, metrics, gammas) -> None:
    """Accept-length histogram and speedup against γ (Thm 3.8, with measured verify, measured)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    hist = metrics["accept_histogram"]
    ax.bar(range(len(hist)), hist)
    ax.set_xlabel("drafts accepted per iteration (n_accepted)")
    ax.set_ylabel("iterations")
    ax.set_title(f"γ={metrics['gamma']}, α={metrics['alpha_beta']:.2f}")
    ax = fig.add_subplot(1, 2, 2)
    grid = [int(g) for g in np.arange(1, max(10, max(gammas)) + 1)]
    alpha, v = metrics["alpha_beta"], metrics["verify_cost_ratio"]
    costs = metrics.get("step_costs") or {"c": metrics["c_measured"]}
    predicted = [_predicted(alpha, g, c_at_gamma(costs, g, metrics["gamma"]), v) for g in grid]
    ax.plot(grid, [p["predicted_speedup_thm38"] for p in predicted], label="Thm 3.8")
    ax.plot(
        grid,
        [p["predicted_speedup_measured_verify"] for p in predicted],
        "--",
        label="with measured verify cost",
    )
    sweep = metrics["gamma_sweep"]
    ax.plot(
        [int(g) for g in sweep],
        [sweep[g]["speedup"] for g in sweep],
        "o",
        label="measured",
    )
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("γ")
    ax.set_ylabel("walltime speedup")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def step_cost_table(result: dict[str, Any]) -> str:
    """One-row markdown table of a `benchmark.measure_step_costs` result, plus provenance lines."""
    target, draft = result.get("target", "target"), result.get("draft", "draft")
    header = (
        "| target | draft | dtype | batch | γ | target step ms | draft step ms | verify (γ+1) ms "
        "| c | verify_cost_ratio |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    row = (
        f"| {target} ({result['target_params'] / 1e6:.1f}M) "
        f"| {draft} ({result['draft_params'] / 1e6:.1f}M) | {result['target_config']['dtype']} "
        f"| {result['batch']} | {result['gamma']} | {result['target_step_ms']:.3f} "
        f"| {result['draft_step_ms']:.3f} | {result['verify_step_ms']:.3f} | {result['c']:.3f} "
        f"| {result['verify_cost_ratio']:.3f} |\n"
    )
    alone = result.get("c_alone")  # absent in results written before the in-loop c
    in_loop = (
        []
        if alone is None
        else [
            f"c is the draft's cost per step between verify calls ({result['gamma']} draft steps "
            f"and a verify call per iteration, one loop); alone (a loop of draft steps only) "
            f"c = {alone:.3f}; interference {result['interference_ms']:.3f} ms per iteration. "
            "Every cost is a loop's slope in its length (a call's fixed cost removed)."
        ]
    )
    notes = [
        f"enc_len {result['enc_len']}, cache length {result['max_len']}, median of "
        f"{result['repeats']} interleaved rounds after {result['warmup']} warm-up rounds; "
        "random weights.",
        *in_loop,
        *provenance.markdown_lines(result),
    ]
    return header + row + "\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def hf_comparison_table(result: dict[str, Any]) -> str:
    """Markdown table of a `hf_compare.compare_with_hf` result, plus provenance lines."""
    n = result["num_examples"]
    rows = [
        "| implementation | baseline s | speculative s | speed-up | speculative == greedy |",
        "|---|---|---|---|---|",
        f"| HF transformers {result['transformers_version']} (torch {result['torch_version']}) "
        f"| {result['hf_baseline_s']:.3f} | {result['hf_assisted_s']:.3f} "
        f"| {result['hf_speedup']:.2f}x | {result['hf_assisted_equals_greedy']}/{n} |",
        f"| ours (JAX {jax.__version__}) | {result['ours_baseline_s']:.3f} "
        f"| {result['ours_speculative_s']:.3f} | {result['ours_speedup']:.2f}x "
        f"| {result['ours_speculative_equals_greedy']}/{n} |",
    ]
    notes = [
        f"greedy, batch 1, γ = {result['gamma']}, {n} examples, "
        f"{result['num_generated_tokens']} tokens; ours == HF greedy on {result['ours_equals_hf']}/{n}.",
        *provenance.markdown_lines(result),
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {x}" for x in notes) + "\n"
