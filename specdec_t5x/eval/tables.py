"""What the eval job's records look like on paper: table rows, the provenance footer, the plot,
the step-cost and Hugging Face tables, the medians of repeated runs, and the job's output files.

Every function here reads a `metrics.json` record, grouped (`summary.group`) or flat (written
before grouping): `summary.flat` gives both one view, so a committed table re-renders from its
committed records without re-running anything (`scripts/render_tables.py`). One run's rows and
the provenance footer are in `table_rows`; every public name there is importable from here.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import metrics, provenance
from specdec_t5x.eval import summary
from specdec_t5x.eval.table_rows import (
    HEADLINE_HEADER,
    T5X_SAMPLER_MARK,
    TABLE_HEADER,
    THM38_LEGEND,
    auto_choices,
    auto_row_record,
    c_cell,
    degenerate,
    fmt,
    headline_row,
    predicted_thm38,
    provenance_footer,
    results_table,
    rows,
    table_row,
    thm38_gammas,
    tree_row_records,
)

__all__ = [  # this module's and, re-exported, `table_rows`'
    "HEADLINE_HEADER",
    "MEDIAN_HEADER",
    "MEDIAN_HEADLINE_HEADER",
    "SWEEP_MEDIAN_HEADER",
    "T5X_SAMPLER_MARK",
    "TABLE_HEADER",
    "THM38_LEGEND",
    "auto_choices",
    "auto_row_record",
    "c_cell",
    "degenerate",
    "fmt",
    "headline_row",
    "hf_comparison_table",
    "kernel_path",
    "median_row",
    "plot_series",
    "predicted_thm38",
    "prediction_row",
    "provenance_footer",
    "results_table",
    "rows",
    "speedup_plot",
    "step_cost_table",
    "sweep_median_rows",
    "table_row",
    "thm38_gammas",
    "tree_row_records",
    "write_eval_outputs",
]


def write_eval_outputs(out_dir, record, runs, gammas, headline, examples, vocabulary, eos_id):
    """Writes `metrics.json`, `table_row.md` and `speedup.png`, each whole (`predictions.jsonl`
    is the job's, grown batch by batch: `outputs.OutputDir.append_batch`).

    Args:
      out_dir: the run's folder; record: the grouped metrics (`summary.group`).
      runs: {'baseline' | γ | 'auto': summary.Run}; gammas: the fixed γ rows; headline: the
        headline row's key (γ or 'auto').
      examples, vocabulary, eos_id: for the predictions' texts.
    """
    from specdec_t5x.eval import outputs

    out_dir = pathlib.Path(out_dir)
    table = [TABLE_HEADER, *rows(record), "", THM38_LEGEND]
    outputs.write_atomic(out_dir / "table_row.md", "\n".join(table) + "\n")
    tmp = out_dir / ".speedup.tmp.png"
    speedup_plot(tmp, summary.flat(record), gammas)
    os.replace(tmp, out_dir / "speedup.png")
    outputs.write_json(out_dir / "metrics.json", record)  # last: its presence means finished


def prediction_row(example, tokens, seconds, stats, vocabulary, eos_id: int) -> dict[str, Any]:
    """One `predictions.jsonl` line: input, reference, both outputs, identical, both times, stats.

    Args:
      example: a `inputs.load_examples` dict; tokens: (baseline, speculative) int32 [max_len];
      seconds: (baseline, speculative) wall seconds of the example; stats: its
      `SpeculativeStats` (NumPy), None where auto chose γ = 0; vocabulary, eos_id: for the texts.
    """
    return {
        "input": example["inputs_pretokenized"],
        "reference": example["targets_pretokenized"],
        "baseline": metrics.decode_text(vocabulary, np.asarray(tokens[0]), eos_id),
        "speculative": metrics.decode_text(vocabulary, np.asarray(tokens[1]), eos_id),
        "identical": bool(np.array_equal(tokens[0], tokens[1])),
        "baseline_s": seconds[0],
        "speculative_s": seconds[1],
        "stats": None
        if stats is None
        else {k: np.asarray(getattr(stats, k)).tolist() for k in summary.STAT_KEYS},
    }


def _tree_depth(row: dict[str, Any], name: str) -> int:
    """A tree row's depth (its x on the plot): levels of its acceptance, or its name's numbers."""
    depths = row.get("depth_acceptance")
    if depths:
        return len(depths)
    return max(1, len(re.findall(r"\d+", name)))


def plot_series(m: dict[str, Any], gammas) -> dict[str, tuple[list[float], list[float]]]:
    """What `speedup_plot`'s right panel draws, {label: (x, y)}: every row of the run's table.

    'Thm 3.8' is the fixed rows' prediction over γ = 1..max(10, γ) from the table's own α, c and
    verify/step (`table_rows.predicted_thm38`, the column's function; left out when the cost
    measurement is degenerate); 'measured' the fixed γ rows; 'auto (measured)' and 'auto (Thm
    3.8)' the auto row at its examples' mean chosen γ; 'tree(...)' each tree row at its depth.

    Args:
      m: a flat record (`summary.flat`); gammas: the fixed γ rows run.
    """
    m = summary.flat(m)
    auto = auto_row_record(m) or (m if m["gamma"] == "auto" else None)
    sweep = m["gamma_sweep"]
    series: dict[str, tuple[list[float], list[float]]] = {}
    fixed = [g for g in sweep if str(g).isdigit()]
    if not degenerate(m) and fixed:
        head = m if m["gamma"] != "auto" else {**m, **sweep[str(max(map(int, fixed)))]}
        grid = [int(g) for g in np.arange(1, max(10, max(gammas)) + 1)]
        curve = [predicted_thm38({**head, "gamma": g}) for g in grid]
        series["Thm 3.8"] = (grid, curve)
    series["measured"] = ([int(g) for g in fixed], [sweep[g]["speedup"] for g in fixed])
    if auto is not None:
        chosen = thm38_gammas({**auto, "gamma": "auto"})
        n = sum(chosen.values())
        x = sum(g * k for g, k in chosen.items()) / n if n else 0.0
        series["auto (measured)"] = ([x], [auto["speedup"]])
        predicted = None if degenerate(m) else predicted_thm38({**auto, "gamma": "auto"})
        if predicted is not None:
            series["auto (Thm 3.8)"] = ([x], [predicted])
    for name, row in (m.get("tree_sweep") or {}).items():
        series[name] = ([_tree_depth(row, name)], [row["speedup"]])
    return series


def speedup_plot(path, m, gammas) -> None:
    """Accept-length histogram (the headline row, or with an auto headline its largest fixed γ)
    and speed-up against γ: every row of the run's table (fixed γ, auto, trees) with Theorem 3.8
    from the table's own α, c and verify/step (`plot_series`). `m`: a flat record."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    m = summary.flat(m)
    fig = Figure(figsize=(9, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    hist_row = m
    if "accept_histogram" not in m:  # an auto headline: its largest fixed γ's histogram
        fixed = [g for g in m.get("gamma_sweep") or {} if str(g).isdigit()]
        top = max(fixed, key=int, default=None)  # None: auto alone, no fixed γ
        hist_row = None if top is None else {"gamma": top, **m["gamma_sweep"][top]}
    if hist_row is not None:
        hist = hist_row["accept_histogram"]
        ax.bar(range(len(hist)), hist)
        ax.set_xlabel("drafts accepted per iteration (n_accepted)")
        ax.set_ylabel("iterations")
        ax.set_title(f"γ={hist_row['gamma']}, α={hist_row['alpha_beta']:.2f}")
    else:
        ax.set_title("auto alone: no fixed γ to show")
    ax = fig.add_subplot(1, 2, 2)
    styles = {"Thm 3.8": "-", "measured": "o", "auto (measured)": "*", "auto (Thm 3.8)": "x"}
    for label, (x, y) in plot_series(m, gammas).items():
        ax.plot(x, y, styles.get(label, "s"), label=label, ms=8 if "auto" in label else 6)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("γ (auto: mean chosen γ; trees: depth)")
    ax.set_ylabel("walltime speedup")
    c, v = m.get("c_measured"), m.get("verify_cost_ratio")
    if c is not None and v is not None:
        ax.set_title(f"Thm 3.8 at c = {c:.3f}, verify/step = {v:.2f}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")


def step_cost_table(result: dict[str, Any]) -> str:
    """One-row markdown table of a `bench.random_pair.measure_step_costs` result, plus provenance lines."""
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
    """Markdown table of a `bench.vs_hf.compare_with_hf` result, plus notes and provenance lines.

    One row per decoder: seconds per example, speed-up against its own library's greedy
    baseline, target calls per example, tokens per target call, drafts proposed per target call,
    accepted / proposed, and on how many examples its output equals its own baseline's, HF's
    greedy output and ours. The notes say what HF's prompt lookup searches for an
    encoder-decoder model (the decoder's prefix) with the measured `input_ids` length at its
    first lookup, and where in transformers that is.
    """
    n = result["num_examples"]
    equal = result["equal"]
    library = {
        "hf": f"HF transformers {result['transformers_version']} (torch {result['torch_version']})",
        "ours": f"ours (JAX {jax.__version__})",
    }
    rows = [
        "| implementation | decoder | s / example | speed-up vs own greedy | target calls / example "
        "| tokens per target call | drafts proposed per call | accepted / proposed "
        "| == own greedy | == HF greedy | == ours greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["methods"]:
        ours_greedy = (
            "–" if m["name"] == "ours_baseline" else f"{equal[m['name']]['ours_baseline']}/{n}"
        )
        hf_greedy = "–" if m["name"] == "hf_baseline" else f"{equal[m['name']]['hf_baseline']}/{n}"
        own = "–" if not m["baseline"] else f"{m['equals_baseline']}/{n}"
        proposed = None if not m["baseline"] else m["proposed_per_call"]
        rows.append(
            f"| {library[m['library']]} | {m['label']} | {m['s_per_example']:.4f} "
            f"| {fmt(m['speedup'], '.2f', 'x')} | {m['target_calls'] / n:.1f} "
            f"| {fmt(m['tokens_per_target_call'])} | {fmt(proposed)} "
            f"| {fmt(m['acceptance'])} | {own} | {hf_greedy} | {ours_greedy} |"
        )
    searched = result.get("hf_lookup_first_searched_len", [])
    measured = (
        "measured: `input_ids` held 1 token (the decoder start token) at each example's first lookup"
        if searched == [1]
        else f"measured: `input_ids` held {searched or 'no'} token(s) at the first lookups, not the "
        "decoder start token alone: check the transformers version"
    )
    notes = [
        f"greedy, batch 1, γ = {result['gamma']}, {n} examples (encoder input "
        f"{result['encoder_len_mean']:.1f} tokens on average), {result['num_generated_tokens']} "
        f"tokens (ours greedy), at most {result['max_decode_len']} new tokens; order of the "
        "decoders drawn per example (`clock.call_order`); compilation and warm-up excluded.",
        f"{result.get('num_without_eos', '?')}/{n} greedy outputs reached the length limit without "
        "EOS (an output that repeats itself is where a lookup in the decoder's own prefix finds "
        "drafts).",
        "HF's prompt lookup on an encoder-decoder model searches the decoder's own prefix, never "
        f"the encoder input ({measured}). Source: {result['prompt_lookup_source']}.",
        "target calls: HF counted by a forward pre-hook on the target (the encoder runs outside "
        "it); ours from the speculative statistics; our greedy baseline makes one call per token "
        "(not counted). Drafts proposed: HF's `get_candidates` outputs, ours `num_proposed`; "
        "accepted: HF generated tokens - target calls, ours `num_accepted`.",
        *provenance.markdown_lines(result),
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {x}" for x in notes) + "\n"


MEDIAN_HEADER = (
    "| Task | Draft | Target | T | γ | α | c | verify/step | tokens per target call "
    "| Speed: median (min–max) | Predicted (Thm 3.8) | Predicted (measured costs) | identical "
    "| runs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


MEDIAN_HEADLINE_HEADER = (
    "| Task | Draft | Target | T | γ | α | c | tokens per target call "
    "| Speed: median (min–max) | identical | runs |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def kernel_path(flat_record: dict[str, Any]) -> str:
    """The CPU kernel path a run's record names (`provenance.cpu_identity`); 'unrecorded' for
    records written before it was recorded. Runs of different paths never share a median."""
    return (flat_record.get("cpu") or {}).get("kernel_path") or "unrecorded"


def median_row(records: Sequence[dict[str, Any]], target: str = "", headline: bool = False) -> str:
    """One `MEDIAN_HEADER` row of repeated runs of one configuration: the median speed with the
    range over runs, and the median of every other column (a degenerate run's costs excluded);
    runs timed on a busy machine are counted beside the speed ("⚠ busy (1 of 3 runs)").

    Args:
      records: the runs' `metrics.json` records (grouped or flat), >= 1.
      target: the target's label (e.g. 'T5 1.1 base shape (211M)').
      headline: the README's columns (`MEDIAN_HEADLINE_HEADER`), not `MEDIAN_HEADER`'s.

    Raises:
      ValueError: no records, or records of different tasks, drafts, temperatures, γ or CPU
        kernel paths.
    """
    flats = [summary.flat(m) for m in records]
    if not flats:
        raise ValueError("median_row needs at least one record.")
    keys = {
        (m["task"], m["draft"], m["temperature"], str(m["gamma"]), kernel_path(m)) for m in flats
    }
    if len(keys) > 1:
        raise ValueError(
            f"median_row got runs of different configurations or kernel paths: {sorted(keys)}."
        )

    def med(xs):  # None where no run recorded the value (an auto run that never speculated)
        xs = [x for x in xs if x is not None]
        return float(np.median(xs)) if xs else None

    sound = [m for m in flats if not degenerate(m)]
    speeds = [m["speedup"] for m in flats]
    m0 = flats[0]
    greedy = m0["temperature"] == 0
    fair = all("speedup_vs_t5x_sampler" in m for m in flats)
    speed = f"{med(speeds):.2f}X ({min(speeds):.2f}–{max(speeds):.2f})"
    if not greedy and fair:
        speed += f"; vs T5X sampler {med([m['speedup_vs_t5x_sampler'] for m in flats]):.2f}X"
    elif not greedy:
        speed += T5X_SAMPLER_MARK
    busy = sum(bool((m.get("busy_machine") or {}).get("busy")) for m in flats)
    if busy:
        speed += f" ⚠ busy ({busy} of {len(flats)} runs)"
    cells = [
        m0["task"],
        m0["draft"],
        target,
        f"{m0['temperature']:g}",
        str(m0["gamma"]),
        fmt(med([m["alpha_beta"] for m in flats if m.get("alpha_beta") is not None])),
        fmt(med([m["c_measured"] for m in sound]), ".3f") if sound else "n/a (degenerate)",
        fmt(med([m["verify_cost_ratio"] for m in sound])) if sound else "n/a",
        fmt(med([m.get("tokens_per_iteration") for m in flats])),
        speed,
        fmt(med([m.get("predicted_speedup_measured_verify") for m in sound]), ".2f", "X"),
        fmt(
            med([m["predicted_speedup_measured_costs"] for m in sound
                 if m.get("predicted_speedup_measured_costs") is not None]),
            ".2f",
            "X",
        ),
        fmt(med([m["identical_fraction"] for m in flats])),
        str(len(flats)),
    ]  # fmt: skip
    if headline:  # no verify/step, no predictions
        cells = cells[:7] + cells[8:10] + cells[12:]
    return "| " + " | ".join(cells) + " |"


SWEEP_MEDIAN_HEADER = (
    "| Task | Draft | Target | T | chain γ or tree | rows verified | α | tokens per target call "
    "| × fastest chain's | Speed: median (min–max) | × fastest chain's: median (min–max) "
    "| identical | runs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _sweep_entries(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run's chains (`'γ = g'`), trees (`'tree(…)'`) and auto row, each with its speed-up,
    tokens per target call, α, identical fraction and verified rows per call."""
    from specdec_t5x import tree  # local: imports the network

    m = summary.flat(m)
    out = {}
    for g, row in (m.get("gamma_sweep") or {}).items():
        out[f"γ = {g}"] = {**row, "rows": int(g) + 1, "chain": True}
    for name, row in (m.get("tree_sweep") or {}).items():
        shape = tree.shape_from_name(name)
        out[name] = {**row, "rows": shape.num_nodes, "chain": False}
    auto = auto_row_record(m)
    if auto is not None:
        label = "auto (chains, trees, off)" if "tree_measured_speedup" in auto else "auto"
        out[label] = {**auto, "rows": None, "chain": False}
    return out


def sweep_median_rows(records: Sequence[dict[str, Any]], target: str = "") -> list[str]:
    """`SWEEP_MEDIAN_HEADER` rows of repeated runs of one sweep (chains and trees timed in each
    run): per chain γ, tree and auto row the median speed with its range over runs, and the
    ratio to the *fastest chain of the same run* (speed and tokens per target call), median and
    range over runs.

    Args:
      records: the runs' `metrics.json` records, >= 1, each with a `gamma_sweep`.
      target: the target's label (e.g. 'T5 1.1 base shape').

    Raises:
      ValueError: no records, records of different tasks, drafts, temperatures or CPU kernel
        paths, or a run without chains.
    """
    flats = [summary.flat(m) for m in records]
    if not flats:
        raise ValueError("sweep_median_rows needs at least one record.")
    keys = {(m["task"], m["draft"], m["temperature"], kernel_path(m)) for m in flats}
    if len(keys) > 1:
        raise ValueError(
            f"sweep_median_rows got runs of different configurations or kernel paths: {keys}."
        )
    runs = [_sweep_entries(m) for m in flats]
    fastest = []
    for entries in runs:
        chains = [e for e in entries.values() if e["chain"]]
        if not chains:
            raise ValueError("sweep_median_rows needs runs whose sweep has chains (gamma_sweep).")
        fastest.append(max(chains, key=lambda e: e["speedup"]))
    med = lambda xs: float(np.median(xs))  # noqa: E731
    span = lambda xs: f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"  # noqa: E731
    m0, out = flats[0], []
    for name in runs[0]:
        have = [(e[name], f) for e, f in zip(runs, fastest, strict=True) if name in e]
        speeds = [e["speedup"] for e, _ in have]
        tokens = [e["tokens_per_iteration"] for e, _ in have]
        alphas = [e["alpha_beta"] for e, _ in have if e.get("alpha_beta") is not None]
        cells = [
            m0["task"],
            m0["draft"],
            target,
            f"{m0['temperature']:g}",
            name,
            "–" if have[0][0]["rows"] is None else str(have[0][0]["rows"]),
            fmt(med(alphas)) if alphas else "–",
            fmt(med(tokens)),
            fmt(med([e["tokens_per_iteration"] / f["tokens_per_iteration"] for e, f in have])),
            span(speeds).replace(" (", "X (", 1),
            span([e["speedup"] / f["speedup"] for e, f in have]),
            fmt(med([e["identical_fraction"] for e, _ in have])),
            str(len(have)),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out
