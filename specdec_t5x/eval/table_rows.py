"""One run's table rows: the results table (the paper's Table 2 shape), the README's headline
row, a run's tree and auto-γ rows, and the provenance footer of a table of several runs.

Each reads a `metrics.json` record, grouped (`summary.group`) or flat (`summary.flat`); `tables`
builds the job's output files, the repeated-run medians and the benchmark tables on these rows and
re-exports every public name here.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from specdec_t5x import provenance
from specdec_t5x.eval import summary

TABLE_HEADER = (
    "| Task | Draft | T | γ | α | c | verify/step | tokens per target call | Speed "
    "| Predicted (Thm 3.8) | identical |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
# The README's headline table: what a T5X user asks first.
HEADLINE_HEADER = (
    "| Task | Draft | T | γ | α | c | tokens per target call | Speed | identical |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
# What the "Predicted (Thm 3.8)" column and the plot's curves are (under every results table).
THM38_LEGEND = (
    "Predicted (Thm 3.8) = E(α, γ) / (γ·c + verify/step), E = Eq. 1's tokens per iteration, with "
    "the row's own α, c (in the loop) and verify/step as shown; an auto row prices each example's "
    "chosen γ with the same three (γ = 0: 1X) and combines them as its speed-up is combined "
    "(total time); tree rows: –."
)
T5X_SAMPLER_MARK = "†"  # a T > 0 speed-up measured against T5X's Gumbel sampler alone


def fmt(x, spec: str = ".2f", unit: str = "") -> str:
    """A table cell: `x` formatted with `spec` and `unit`, or '–' when x is None."""
    return "–" if x is None else f"{x:{spec}}{unit}"


def degenerate(m: dict[str, Any]) -> list[str]:
    """Why this record's cost measurement is not a cost (`eval.costs.degenerate`; [] if sound),
    checked from its step costs with today's rule (also for records written before the check).
    """
    from specdec_t5x.eval import costs as costs_lib

    step_costs = m.get("step_costs") or {}
    gamma = m["gamma"] if isinstance(m.get("gamma"), int) else step_costs.get("gamma")
    gamma = gamma or max(map(int, m["gamma_sweep"]))  # records before 'gamma' was kept
    measured = {"c": m.get("c_measured"), "verify_cost_ratio": m.get("verify_cost_ratio")}
    return costs_lib.degenerate({**step_costs, **measured}, gamma)


def _cells(m: dict[str, Any]) -> dict[str, str]:
    """The table cells of one flat record (`summary.flat`)."""
    bad = degenerate(m)
    auto = m["gamma"] == "auto"
    speed = f"{m['speedup']:.2f}X"
    if m.get("speedup_interval"):  # paired bootstrap 5–95 % over examples (auto rows)
        speed += " ({:.2f}–{:.2f})".format(*m["speedup_interval"])
    greedy = m["temperature"] == 0
    if not greedy and "speedup_vs_t5x_sampler" in m:  # fair baseline; T5X's sampler beside it
        speed += f" (vs T5X sampler {m['speedup_vs_t5x_sampler']:.2f}X)"
    elif not greedy:
        speed += T5X_SAMPLER_MARK
    busy = provenance.busy_note(m.get("busy_machine"))  # timed while other work shared the CPU
    speed += f" {busy}" if busy else ""
    tree = str(m["gamma"]).startswith("tree")  # Theorem 3.8 and the chain's verify/step: n/a
    predicted = None if tree or bad else predicted_thm38(m)
    return {
        "task": m["task"],
        "draft": m["draft"],
        "T": f"{m['temperature']:g}",
        "γ": f"auto ({auto_choices(m)})" if auto else str(m["gamma"]),
        "α": m["alpha_display"] if auto else f"{m['alpha_beta']:.2f}",
        "c": f"n/a (degenerate: {'; '.join(bad)})" if bad else c_cell(m),
        "verify/step": "–" if tree else "n/a" if bad else f"{m['verify_cost_ratio']:.2f}",
        "tokens": fmt(m["tokens_per_iteration"]),
        "speed": speed,
        "predicted": "–" if tree else "n/a" if bad else fmt(predicted, ".2f", "X"),
        "identical": fmt(m["identical_fraction"]),
    }


def thm38_gammas(m: dict[str, Any]) -> dict[int, int] | None:
    """{γ: examples} a flat record's row ran: {γ: 1} for a fixed γ, an auto row's chosen γ
    (its tree choices left out), None for a tree row."""
    if m["gamma"] == "auto":
        return {int(g): n for g, n in m["gamma_chosen"].items() if str(g).isdigit()}
    if str(m["gamma"]).startswith("tree"):
        return None
    return {int(m["gamma"]): 1}


def predicted_thm38(m: dict[str, Any]) -> float | None:
    """A row's "Predicted (Thm 3.8)": `summary.thm38_prediction` with the α, c and verify/step
    its table row shows (`THM38_LEGEND`); None for a tree row or a record without costs."""
    m = summary.flat(m)
    gammas = thm38_gammas(m)
    if gammas is None or m.get("c_measured") is None or m.get("verify_cost_ratio") is None:
        return None
    return summary.thm38_prediction(
        m.get("alpha_beta"), gammas, m["c_measured"], m["verify_cost_ratio"]
    )


def table_row(m: dict[str, Any]) -> str:
    """One row of `TABLE_HEADER` (the paper's Table 2 with c, verify/step and tokens per target
    call): γ, α (Corollary 3.6), c of the draft in the loop (its lone-loop value in brackets),
    verify/step (the γ + 1-token verify call over one target step), tokens per target call, the
    measured speed-up, Theorem 3.8 with the row's α, c and verify/step (`predicted_thm38`, the
    same function for fixed and auto rows: `THM38_LEGEND`), and identical_fraction
    (1.0 expected at T = 0; at T > 0 outputs are different samples of the same distribution).

    At T > 0 the speed is against the fair baseline (the same draw as the speculative loop) with
    T5X's sampler beside it; records from before the fair baseline are marked `T5X_SAMPLER_MARK`.
    A degenerate cost measurement (`degenerate`) prints "n/a (degenerate: ...)", not numbers; a
    run timed on a busy machine (`provenance.busy_machine`) has its speed marked
    "⚠ busy (load 5.2 on 2 cores)". An auto-γ row shows the γ chosen per example (off = the
    baseline alone), α or "off", its speed with the paired-bootstrap 5–95 % interval and Theorem
    3.8 at its chosen γ (the controller's own cost-curve prediction stays in metrics.json,
    `auto.predicted_speedup`).

    Args:
      m: a `metrics.json` record, grouped or flat (`summary.flat`).
    """
    c = _cells(summary.flat(m))
    keys = ("task", "draft", "T", "γ", "α", "c", "verify/step", "tokens", "speed", "predicted")
    return "| " + " | ".join(c[k] for k in (*keys, "identical")) + " |"


def headline_row(m: dict[str, Any]) -> str:
    """One row of `HEADLINE_HEADER` (the README's table) from a `metrics.json` record."""
    c = _cells(summary.flat(m))
    keys = ("task", "draft", "T", "γ", "α", "c", "tokens", "speed", "identical")
    return "| " + " | ".join(c[k] for k in keys) + " |"


def c_cell(m: dict[str, Any]) -> str:
    """The table's c: in the loop (the draft between verify calls), and its lone-loop value."""
    alone = m.get("c_alone")
    return f"{m['c_measured']:.3f}" + ("" if alone is None else f" ({alone:.3f} alone)")


def auto_choices(m: dict[str, Any]) -> str:
    """'off×a, baseline timing×b, 2×c, …' of an auto row (`auto.row.summarise_auto`)."""
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


def auto_row_record(m: dict[str, Any]) -> dict[str, Any] | None:
    """The auto-γ row of a run whose sweep included 'auto', as a flat record (None otherwise)."""
    m = summary.flat(m)
    if "auto" not in m or m["gamma"] == "auto":
        return None
    keys = (
        "task",
        "draft",
        "temperature",
        "c_measured",
        "c_alone",
        "verify_cost_ratio",
        "step_costs",
        "gamma_sweep",
    )
    return {**m["auto"], **{k: m[k] for k in keys if k in m}}


def tree_row_records(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The tree rows of a run whose sweep had trees, as flat records (γ column: the tree)."""
    m = summary.flat(m)
    keys = ("task", "draft", "temperature", "c_measured", "c_alone", "step_costs", "gamma_sweep")
    keys += ("verify_cost_ratio",)  # the run's (the chain's) costs: for `degenerate` only
    return [
        {**row, "gamma": name, **{k: m[k] for k in keys if k in m}}
        for name, row in (m.get("tree_sweep") or {}).items()
    ]


def rows(m: dict[str, Any], row=table_row) -> list[str]:
    """A record's rows: its own, its sweep's tree rows, then its auto-γ row if it had them."""
    auto = auto_row_record(m)
    trees = [row(t) for t in tree_row_records(m)]
    return [row(m), *trees] + ([] if auto is None else [row(auto)])


def results_table(metrics_files: Sequence[str | os.PathLike]) -> str:
    """Markdown table (Table 2 shape) of several runs' `metrics.json`, in the given order; a run
    whose sweep included 'auto' adds its auto-γ row (`auto_table_row`) after its own row; the
    legend (`THM38_LEGEND`) names the costs the prediction column uses."""
    out = []
    for f in metrics_files:
        out += rows(json.loads(pathlib.Path(f).read_text()))
    return "\n".join([TABLE_HEADER, *out, "", THM38_LEGEND])


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
    runs = [summary.flat(json.loads(f.read_text())) for f in paths]
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
