"""TODO docstring."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import provenance
from specdec_t5x.eval import summary

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
                else {k: np.asarray(getattr(stats, k)).tolist() for k in summary.STAT_KEYS}
            )
            row = {
                "input": ex["inputs_pretokenized"],
                "reference": ex["targets_pretokenized"],
                "baseline": metrics.decode_text(vocabulary, base.tokens[i], eos_id),
                "speculative": metrics.decode_text(vocabulary, spec.tokens[i], eos_id),
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
    predicted = [
        summary.predicted_speedups(alpha, g, summary.c_at_gamma(costs, g, metrics["gamma"]), v)
        for g in grid
    ]
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
