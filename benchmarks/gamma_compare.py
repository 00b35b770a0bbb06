"""The auto-γ comparison table: fixed γ, auto γ, auto γ + early exit, block verification.

`compare` decodes the first examples of a task split with the baseline (the target alone) and with
every speculative variant, interleaved example by example (the order rotates each example, so
machine noise hits all variants alike), each call compiled beforehand and timed with
`block_until_ready`, and reports per variant: tokens per iteration, α (Corollary 3.6 β estimate),
the measured speedup (total baseline seconds / total variant seconds, with the spread of the
per-example ratios) and the predicted speedup (`cost_curve.CostCurve.predicted_speedup` on the
measured cost curve at the measured α, for calls of the row's mean longest-row length, so the
per-call set-up counts; for auto rows the prediction for the γ chosen last; for block rows it is
Eq. 1's token-verification count, a lower bound). Auto rows also report the γ they chose (0 = off:
the baseline itself).

Variants (names used in the table):

* `γ=g`: token verification (Algorithm 1), fixed γ;
* `block γ=g`: block verification (Sun et al., ICLR 2025), same γ;
* `auto`: `auto_gamma.AutoGammaDecoder` (γ in 0..gamma_max, α learnt online);
* `auto+exit`: the same, drafting stopping early when max q < `exit_threshold`;
* `auto+block`: auto γ with block verification.
"""

from __future__ import annotations

import collections
import functools
import json
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import inputs as inputs_lib
from specdec_t5x import provenance
from specdec_t5x.auto import auto_gamma
from specdec_t5x.eval import tables
from specdec_t5x.timing import clock, cost_curve


def _stats_sums(stats_list) -> dict[str, float]:
    keys = ("num_iterations", "num_generated", "beta_sum", "num_beta", "num_proposed")
    return {k: float(sum(np.sum(np.asarray(getattr(s, k))) for s in stats_list)) for k in keys}


def compare(
    spec_model,
    target_params,
    encoder_inputs: Sequence[np.ndarray],
    *,
    settings: Mapping[str, Any],
    gammas: Sequence[int] = (1, 2, 3, 5),
    gamma_max: int = 6,
    exit_threshold: float = 0.5,
    block_gammas: Sequence[int] | None = None,
    max_decode_len: int = 64,
    input_len: int = 64,
    seed: int = 0,
    cost_repeats: int = 20,
) -> dict[str, Any]:
    """Times every variant against the baseline on the same inputs (batch 1, as the paper).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`.
      target_params: target parameters (the draft's are `spec_model.draft.params`).
      encoder_inputs: int32 token arrays, one per example (padded/cut to `input_len`).
      settings: {'temperature', 'topk', 'topp'}.
      gammas: fixed γ rows (token verification).
      gamma_max: largest γ the auto rows consider.
      exit_threshold: early-exit confidence threshold of the `auto+exit` row.
      block_gammas: fixed γ rows with block verification (default: `gammas`).
      max_decode_len, input_len: decode and encoder lengths.
      seed: example i uses `fold_in(PRNGKey(seed), i)` for every variant.
      cost_repeats: timing rounds of the cost curve.

    Returns:
      {'rows': {variant: metrics}, 'cost_curve': ..., 'settings': ...}.
    """
    block_gammas = list(gammas if block_gammas is None else block_gammas)
    draft_params = spec_model.draft.params
    common = dict(settings=settings, gamma_max=gamma_max, cost_repeats=cost_repeats)
    auto = {
        "auto": auto_gamma.AutoGammaDecoder(spec_model, target_params, **common),
        "auto+exit": auto_gamma.AutoGammaDecoder(
            spec_model, target_params, draft_confidence_threshold=exit_threshold, **common
        ),
        "auto+block": auto_gamma.AutoGammaDecoder(
            spec_model, target_params, verification="block", **common
        ),
    }
    fixed = {f"γ={g}": (g, "token") for g in gammas}
    fixed.update({f"block γ={g}": (g, "block") for g in block_gammas})
    # Fixed rows run through one auto decoder's per-γ functions (one jitted decoder per γ).
    runners = {
        "token": auto["auto"],
        "block": auto["auto+block"],
    }
    batches = [inputs_lib.decode_batch([t], input_len, max_decode_len) for t in encoder_inputs]
    first = batches[0]
    curve = cost_curve.measure_cost_curve(
        spec_model,
        target_params,
        draft_params,
        first["encoder_input_tokens"],
        max_decode_len,
        max([gamma_max, *gammas, *block_gammas]),
        settings,
        repeats=cost_repeats,
    )
    for decoder in auto.values():
        decoder.choose(first)  # measures (or reuses) its curve: outside the timed loop
    for g, verification in fixed.values():
        runners[verification].compile(g, first)
    runners["token"].compile(0, first)

    seconds = collections.defaultdict(list)
    longest = collections.defaultdict(list)  # per call: tokens of the longest row
    stats = collections.defaultdict(list)
    chosen = collections.defaultdict(list)
    predicted = collections.defaultdict(list)
    names = ["baseline", *fixed, *auto]
    for i, batch in enumerate(batches):
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), i)
        order = clock.call_order(names, i, seed)
        for name in order:
            if name in auto:
                decoder = auto[name]
                gamma, prediction = decoder.choose(batch)
                decoder.compile(gamma, batch)  # untimed; no-op once compiled
                chosen[name].append(gamma)
                predicted[name].append(prediction)
                call = functools.partial(decoder.decode, gamma, batch, rng)
            elif name == "baseline":
                call = functools.partial(runners["token"].decode, 0, batch, rng)
            else:
                g, verification = fixed[name]
                call = functools.partial(runners[verification].decode, g, batch, rng)
            start = time.perf_counter()
            decodes, aux = jax.block_until_ready(call())
            seconds[name].append(time.perf_counter() - start)
            longest[name].append(auto_gamma.call_counts(decodes)[0])
            if name in auto:
                auto[name].update(aux)
                auto[name].observe(gamma, seconds[name][-1], decodes, aux)  # vs modelled
            if "stats" in aux:
                stats[name].append(jax.tree_util.tree_map(np.asarray, aux["stats"]))

    base = np.asarray(seconds["baseline"])
    rows = {}
    for name in names[1:]:
        secs = np.asarray(seconds[name])
        ratios = base / secs
        sums = _stats_sums(stats[name]) if stats[name] else None
        alpha = sums["beta_sum"] / sums["num_beta"] if sums and sums["num_beta"] else None
        row = {
            "speedup": float(base.sum() / secs.sum()),
            "example_speedup_quartiles": [float(np.percentile(ratios, q)) for q in (25, 50, 75)],
            "alpha": alpha,
            "tokens_per_iteration": sums["num_generated"] / sums["num_iterations"]
            if sums
            else None,
            "drafts_per_iteration": sums["num_proposed"] / sums["num_iterations"] if sums else None,
            "seconds": float(secs.sum()),
        }
        if name in auto:
            counts = collections.Counter(chosen[name])
            row["gamma_chosen"] = {str(g): n for g, n in sorted(counts.items())}
            row["baseline_timing_examples"] = sum(
                1
                for g, p in zip(chosen[name], predicted[name], strict=True)
                if g == 0 and p is None
            )
            final_gamma, final_prediction = auto[name].choose(batches[0])
            row["gamma_final"] = final_gamma
            row["predicted_speedup"] = final_prediction
            row["alpha_online"] = auto[name].controller.alpha
        else:
            g = fixed[name][0]
            row["gamma"] = g
            tokens = float(np.mean(longest[name]))  # per call: set-up counts (`CostCurve`)
            row["predicted_speedup"] = (
                curve.predicted_speedup(min(alpha, 1.0), g, tokens) if alpha is not None else None
            )
        rows[name] = row
    return {
        "rows": rows,
        "baseline_seconds": float(base.sum()),
        "cost_curve": curve.to_dict(),
        "settings": dict(settings),
        "num_examples": len(batches),
        "gammas": list(gammas),
        "gamma_max": gamma_max,
        "exit_threshold": exit_threshold,
    }


def markdown(result: Mapping[str, Any], title: str) -> str:
    """The table of one `compare` result: one row per variant."""
    lines = [
        f"### {title}",
        "",
        "| variant | γ | α | tokens/iter | drafts/iter | speed | per-example p25–p75 | predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda x, spec: "–" if x is None else format(x, spec)  # noqa: E731
    for name, row in result["rows"].items():
        if "gamma_chosen" in row:
            gamma = tables.auto_choices(row)
        else:
            gamma = str(row["gamma"])
        alpha = "off" if row["alpha"] is None else f"{row['alpha']:.2f}"
        q = row["example_speedup_quartiles"]
        lines.append(
            f"| {name} | {gamma} | {alpha} | {fmt(row['tokens_per_iteration'], '.2f')} | "
            f"{fmt(row['drafts_per_iteration'], '.2f')} | {row['speedup']:.2f}X | "
            f"{q[0]:.2f}–{q[2]:.2f} | {fmt(row['predicted_speedup'], '.2f')}X |"
        )
    return "\n".join(lines)


def write(output_dir, results: Mapping[str, Mapping[str, Any]], command: str) -> str:
    """Writes `metrics.json` (all results + provenance) and `table.md`; returns the table."""
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = provenance.record(command)
    tables = [markdown(r, name) for name, r in results.items()]
    text = "\n\n".join(tables)
    text += (
        f"\n\n`{command}` at {record['commit']}, {record['date']}; "
        f"{provenance.hardware_description(record['hardware'])}.\n"
    )
    (out / "metrics.json").write_text(
        json.dumps({"results": results, "provenance": record}, indent=2, default=float) + "\n"
    )
    (out / "table.md").write_text(text)
    return text
