"""Paper-scale speculative decoding on one accelerator, in one command, with real α.

    python -m benchmarks.accelerator --out_dir results/accelerator [--smoke]

No pretrained T5 weights are reachable, so the models are our trained ones *widened* to the paper's
shapes (`widen`, function-preserving): the shipped embedded target -> T5 1.1 XXL shape (24+24
layers, d_model 4096, 64 heads, d_ff 10240, ~10.7B parameters with our 8192-row vocabulary) and the
shipped embedded draft -> T5 1.1 small/base/large shapes. Their α is the embedded pair's real α;
their step costs are those of the paper's models. Parameters are bfloat16 (as T5X's T5 1.1
checkpoints are restored for inference) and activations bfloat16 (`ACTIVATION_DTYPE` of T5X's gins).
Layers run under `nn.scan` (`T5Config.scan_layers`) so XXL compiles one layer, not 48.

Measures (written to `DIR/<device>.json` and a Table-2-shaped `DIR/<device>.md`):

(a) step costs, batch 1 and 8: the XXL target's cached decoder call on k tokens, T(k) for
    k in {1, 2, 4, 8, 16, 32, 64} (T(γ+1)/T(1) is the verify cost the paper assumes ~1), and each
    draft's one-token step, c = draft step / T(1). Timed inside a `fori_loop` (`steps_per_call`
    steps per call), interleaved rounds, medians. The ordinary k-token call is also a token tree's
    verify cost: a tree call on K nodes feeds the same K tokens through the same matmuls, only
    the attention mask differs, and on CPU it costs what a K-token call costs; T(32), T(64) tell
    whether a 32-64-node tree verifies for about one step.
(b) end to end on real DDTP inputs (`data/export_tokens` file, batch 1): baseline (target alone)
    vs speculative (XXL target + small draft) at T = 0 and 1, timed example by example in a
    seeded random order (`clock.call_order`); γ from the cost model
    E(α, γ) / (γ c + T(γ+1)/T(1)) with α from a pilot γ and the measured c and T(k); at T = 0 also
    a small γ sweep. Token trees (`speculative.speculative_sample(tree=(2, 2, 2, 1),
    tree_rule='without_replacement')`, K <= 64 nodes, caches of max_decode_len + K - 1 slots)
    run at both temperatures in the same run as the cost-model γ, against the same baseline:
    tokens per target call, speed-up, identical fraction, acceptance per depth and rank
    (`tree.TreeStats`).
(c) the XXL one-token step against the weight-streaming floor (bytes read by one decoder step:
    decoder parameters except the cross-attention key/value kernels, plus the KV caches, divided by
    the measured device copy bandwidth), and what a 32128-way logits layer (T5's vocabulary, random
    weights) adds to a step compared with our 8192-way one.
(d) batches (`accelerator_measure.batch_sweep`): the 64 DDTP examples of the tokens file decoded
    b rows per call for b in {1, 8, 32, 128} (b = 128: each example twice in the one call, counted
    once) at T = 0 and the cost-model γ: speed, both loops' tokens/s,
    tokens per target call per row, loop iterations per call (max over rows) vs the mean row's (the
    idle-row waste), identical fraction, T(b, 1), T(b, γ + 1) and d(b) at each batch, beside the
    batch cost model (`batch_theory.batch_speedup_from_costs`). `--batch_sweep_only` runs (d) alone
    (after the widening) at the pilot γ, into `DIR/<device>_batch.json` and `.md`.

This module builds the models and settings, runs the phases and writes the report; the measurements
themselves are in `accelerator_measure`. Imports only JAX-side modules (jax, flax, numpy, msgpack
via flax); no gin, seqio, TensorFlow. Prints elapsed time and the remaining budget after every
phase; optional work (token trees, then extra γ values) is skipped when the budget is short, and
the output says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import accelerator_measure as measure
from benchmarks import random_pair
from specdec_t5x import embedded, network, provenance, steps, widen
from specdec_t5x.data import export_tokens

TOKENS_FILE = pathlib.Path(__file__).resolve().parents[1] / "results/accelerator/ddtp_tokens.npz"
T5_VOCAB = measure.T5_VOCAB
# Public names of the measurements, importable from here as before the split.
param_bytes, verify_ratio = measure.param_bytes, measure.verify_ratio
predicted_speedup, cost_model_gamma = measure.predicted_speedup, measure.cost_model_gamma


def _shape(d, h, enc, dec, m, k=64):
    return network.T5Config(
        vocab_size=8192,
        dtype=jnp.bfloat16,
        emb_dim=d,
        num_heads=h,
        num_encoder_layers=enc,
        num_decoder_layers=dec,
        head_dim=k,
        mlp_dim=m,
        mlp_activations=("gelu", "linear"),
        dropout_rate=0.0,
        scan_layers=True,
    )


# The shipped models (gin/models/embedded_ende_{target,draft}.gin; tests check they agree).
EMBEDDED = {
    "embedded_ende_target": dataclasses.replace(
        _shape(256, 4, 4, 4, 1024), dtype=jnp.float32, scan_layers=False
    ),
    "embedded_ende_draft": dataclasses.replace(
        _shape(128, 2, 2, 1, 256), dtype=jnp.float32, scan_layers=False
    ),
}

# T5X's t5_1_1/{small,base,large,xxl}.gin shapes; smoke shapes are small widenings for CPU tests.
# The tree of 32 nodes (root included) that accepts the most at T = 0 on 200 DDTP En→De validation
# sentences with the shipped draft (`tree.optimal_paths`; results/trees/ceiling/
# ceiling_ende_validation_t0_base.md, 2.91 tokens per call on the test split against 2.16 for any
# chain): each node's child-rank path.
OPTIMAL_32 = (
    (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1),
    (2, 0), (3, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 2, 0), (1, 0, 0), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0),
)  # fmt: skip
SETTINGS = {
    "paper": {
        "target": ("xxl", _shape(4096, 64, 24, 24, 10240)),
        "drafts": {
            "small": _shape(512, 6, 8, 8, 1024),
            "base": _shape(768, 12, 12, 12, 2048),
            "large": _shape(1024, 16, 24, 24, 2816),
        },
        "ks": (1, 2, 4, 8, 16, 32, 64),  # 32, 64: token-tree verify calls
        "batches": (1, 8),
        "num_examples": 32,
        "max_decode_len": 64,
        "gamma_sweep": (1, 2, 3, 5, 7),
        "pilot_gamma": 3,
        "gamma_candidates": tuple(range(1, 16)),  # γ + 1 <= 16
        # Token trees, K nodes incl. the root: 32 (the tree of 32 nodes that accepts the most on
        # 200 DDTP validation sentences, results/trees/ceiling/), 23, 45, 61 (K <= 64, the
        # largest measured k).
        "trees": (OPTIMAL_32, (2, 2, 2, 1), (4, 2, 2, 1), (4, 2, 2, 1, 1)),
        "tree_rule": "without_replacement",
        "repeats": 10,
        "steps_per_call": 8,
        "copy_mib": 2048,
        "budget_s": 480,
        # (d) batches: T = 0, the cost-model γ (the pilot γ with --batch_sweep_only), the first
        # `batch_examples` examples at every batch.
        "batch_sweep": (1, 8, 32, 128),
        "batch_examples": 64,  # every example of the tokens file; b = 128 holds each twice
    },
    "smoke": {
        "target": ("target_smoke", _shape(320, 5, 4, 5, 1024)),
        "drafts": {"small_smoke": _shape(128, 2, 2, 2, 256)},
        "ks": (1, 2),
        "batches": (1,),
        "num_examples": 2,
        "max_decode_len": 12,
        "gamma_sweep": (2,),
        "pilot_gamma": 2,
        "gamma_candidates": (2,),  # one compile fewer; cost_model_gamma is tested on its own
        "trees": ((2, 1),),  # 5 nodes
        "tree_rule": "without_replacement",
        "repeats": 2,
        "steps_per_call": 2,
        "copy_mib": 4,
        "budget_s": 600,
        "batch_sweep": (1, 2),
        "batch_examples": 3,  # a ragged last call at batch 2
    },
}


class Budget:
    """Wall-clock budget: `log` prints elapsed and remaining seconds after each phase."""

    def __init__(self, total_s: float):
        self.total_s, self.start, self.phases = total_s, time.perf_counter(), {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def log(self, phase: str) -> None:
        self.phases[phase] = round(self.elapsed(), 1)
        print(
            f"[budget] {phase}: {self.elapsed():.0f}s elapsed, {self.left():.0f}s of "
            f"{self.total_s:.0f}s left",
            flush=True,
        )


def device_name() -> str:
    """File-name form of the first device's kind, e.g. 'nvidia_h200', 'cpu'."""
    kind = jax.devices()[0].device_kind or jax.default_backend()
    return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or "device"


def widened_params(name: str, shape: network.T5Config) -> tuple[network.T5Config, Any]:
    """The shipped model `name` widened to `shape` on the default device, bfloat16 leaves."""
    config = EMBEDDED[name]
    params = jax.device_put(embedded.load_params(name))
    new_config = widen.widen_config(config, shape)
    grow = jax.jit(lambda p: widen.widen(p, config, new_config, dtype=jnp.bfloat16))
    return new_config, jax.block_until_ready(grow(params))


# ----------------------------------------------------------------------------------------------
# Driver and output.


def run_batch_sweep(
    out_dir: str, smoke: bool, tokens_file: str, command: str, commit: str | None = None
) -> dict[str, Any]:
    """(d) alone (`--batch_sweep_only`): the batch sweep at the pilot γ, written to
    `out_dir/<device>_batch.json` and `.md`; returns the result."""
    s = SETTINGS["smoke" if smoke else "paper"]
    budget = Budget(s["budget_s"])
    data = export_tokens.read_tokens(tokens_file)
    target_name, target_shape = s["target"]
    draft_name, draft_shape = next(iter(s["drafts"].items()))
    target = widened_params("embedded_ende_target", target_shape)
    draft = widened_params("embedded_ende_draft", draft_shape)
    budget.log("widen + load (bfloat16 on device)")
    sweep = measure.batch_sweep(target, draft, data["inputs"], s, budget, s["pilot_gamma"])
    result = {
        "device": str(jax.devices()[0].device_kind),
        "jax_version": jax.__version__,
        "command": command,
        "commit": commit or provenance.git_commit(),
        "date": provenance.utc_date(),
        "hardware": provenance.hardware_info(),
        "smoke": smoke,
        "target": {"name": target_name, "params": random_pair.count_params(target[1])},
        "draft": draft_name,
        "batch_sweep": sweep,
        "total_s": round(budget.elapsed(), 1),
    }
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = device_name() + "_batch"
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    header = [
        f"# Speculative decoding at batch b on {result['device']} (widened models, bfloat16)",
        "",
        f"- command: `{command}`; commit `{result['commit']}`; jax {jax.__version__}; "
        f"{result['date']}; target {target_name} ({result['target']['params'] / 1e9:.2f}B), "
        f"draft {draft_name}",
    ]
    (out / f"{name}.md").write_text("\n".join(header) + "\n" + batch_markdown(sweep))
    budget.log(f"wrote {out / name}.json and .md")
    return result


def batch_markdown(sweep: dict[str, Any]) -> str:
    """The (d) table: one row per batch size."""
    lines = [
        "",
        f"## (d) Batches (T = 0, γ = {sweep['gamma']}, the same examples at every batch)",
        "",
        "| b | examples | speed | predicted (batch model) | flat-T model | baseline tok/s "
        "| speculative tok/s | tokens/call/row | iterations per call: loop / mean row (model) "
        "| baseline steps: loop / mean row | α | T(b,1) ms | T(b,γ+1)/T(b,1) | c_b | identical |",
        "|" + "---|" * 15,
    ]
    for r in sweep["rows"]:
        loop, row = r["loop_iterations"], r["row_iterations"]
        lines.append(
            f"| {r['batch']} | {r['num_examples']} | {r['speedup']:.2f}X "
            f"| {r['predicted_speedup']:.2f}X | {r['predicted_speedup_flat']:.2f}X "
            f"| {r['baseline_tokens_per_s']:.0f} | {r['speculative_tokens_per_s']:.0f} "
            f"| {r['tokens_per_call_per_row']:.2f} | {loop:.1f} / {row:.1f} = {loop / row:.2f} "
            f"({r['predicted_waste']:.2f}) | {r['baseline_waste']:.2f} | {r['alpha']:.2f} "
            f"| {r['T_ms']['1']:.3f} | {r['verify_cost_ratio']:.2f} | {r['c']:.3f} "
            f"| {r['identical_fraction']:.2f} |"
        )
    lines += [
        "",
        "predicted: `batch_theory.batch_speedup_from_costs` (α and the rows' lengths of this run, "
        "T(b, 1), T(b, γ+1), d(b) measured at b); flat-T: `batch_theory.batch_walltime_improvement` "
        "with T(b, k) = T(b, 1) and batch 1's c. Iterations per call: the speculative loop's "
        "(max over rows) over the mean row's: the idle-row waste.",
    ]
    if sweep.get("skipped_for_budget"):
        lines.append(f"- batches skipped for the time budget: {sweep['skipped_for_budget']}")
    return "\n".join(lines) + "\n"


def run_benchmark(
    out_dir: str, smoke: bool, tokens_file: str, command: str, commit: str | None = None
) -> dict[str, Any]:
    """Runs (a), (c), (b), (d) and writes `out_dir/<device>.json` and `.md`; returns the result."""
    s = SETTINGS["smoke" if smoke else "paper"]
    budget = Budget(s["budget_s"])
    data = export_tokens.read_tokens(tokens_file)
    target_name, target_shape = s["target"]
    print(
        f"devices: {jax.devices()}; jax {jax.__version__}; settings: {'smoke' if smoke else 'paper'}"
    )
    loaded = {"target": widened_params("embedded_ende_target", target_shape)}
    for name, shape in s["drafts"].items():
        loaded[name] = widened_params("embedded_ende_draft", shape)
    budget.log("widen + load (bfloat16 on device)")
    costs = measure.step_costs(loaded, data["inputs"], s, budget)

    tcfg, tparams = loaded["target"]
    module = network.Transformer(tcfg)
    enc = jnp.asarray(data["inputs"][:1])
    cache = jax.eval_shape(
        lambda p, e: steps.prepare_cache(module, p, e, s["max_decode_len"]), tparams, enc
    )
    bandwidth = measure.copy_bandwidth(s["copy_mib"], s["repeats"])
    step_bytes = measure.decoder_step_bytes(tparams, cache)
    floor_ms = step_bytes / (bandwidth * 1e9) * 1e3
    floor = {
        "copy_bandwidth_gb_s": bandwidth,
        "decoder_step_bytes": step_bytes,
        "floor_ms": floor_ms,
        "target_step_ms_batch1": costs["1"]["target_step_ms"]["1"],
        "step_over_floor": costs["1"]["target_step_ms"]["1"] / floor_ms,
        **measure.logits_layer_cost(tcfg.emb_dim, 1, s),
    }
    budget.log("(c) weight-streaming floor, logits layer")

    first_draft = next(iter(s["drafts"]))
    e2e = measure.end_to_end(
        loaded["target"], loaded[first_draft], data["inputs"], s, costs, budget
    )
    sweep = measure.batch_sweep(
        loaded["target"], loaded[first_draft], data["inputs"], s, budget,
        e2e["cost_model"]["0"]["gamma"],
    )  # fmt: skip
    result = {
        "device": str(jax.devices()[0].device_kind),
        "devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
        "command": command,
        "commit": commit or provenance.git_commit(),
        "date": provenance.utc_date(),
        "hardware": provenance.hardware_info(),
        "smoke": smoke,
        "tokens_file": {"path": str(tokens_file), **data["meta"]},
        "target": {
            "name": target_name,
            "params": random_pair.count_params(tparams),
            "param_bytes": param_bytes(tparams),
            "config": random_pair.config_dict(tcfg),
        },
        "drafts": {
            n: {"params": random_pair.count_params(p), "config": random_pair.config_dict(c)}
            for n, (c, p) in loaded.items()
            if n != "target"
        },
        "settings": {k: v for k, v in s.items() if k not in ("target", "drafts")},
        "step_costs": costs,
        "floor": floor,
        "end_to_end": e2e,
        "batch_sweep": sweep,
        "budget_phases_s": {k: v for k, v in budget.phases.items() if not k.startswith("_")},
        "total_s": round(budget.elapsed(), 1),
    }
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = device_name()
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown(result))
    budget.log(f"wrote {out / name}.json and .md")
    return result


def markdown(r: dict[str, Any]) -> str:
    """Table 2 shape for (b) (chains and token trees, γ column 'tree(2,2,2,1)' for a tree, nodes =
    tokens per verify call) and the trees' acceptance per depth and rank, then the T(k) / c table
    (a) and the floor (c), with provenance."""
    draft = next(iter(r["drafts"]))
    lines = [
        f"# Speculative decoding on {r['device']} (widened models, bfloat16)",
        "",
        f"- command: `{r['command']}`",
        f"- commit: `{r['commit']}`; jax {r['jax_version']}; devices {r['devices']}; {r['date']}",
        f"- target: {r['target']['name']} shape, {r['target']['params'] / 1e9:.2f}B parameters "
        "(shipped embedded target widened, function-preserving); "
        f"draft: {draft} shape (shipped embedded draft widened); vocabulary 8192",
        f"- inputs: {r['tokens_file'].get('task')} {r['tokens_file'].get('split')}, "
        f"{r['end_to_end']['num_examples']} examples, batch 1, max decode length "
        f"{r['settings']['max_decode_len']}; total run {r['total_s']} s",
        "",
        "## (b) End to end (Table 2 shape)",
        "",
        "| Task | M_q | Temp | γ | nodes | α | c | verify/step | tokens/iter | Speed "
        "| Predicted (Thm 3.8) | Predicted (measured verify) | identical | cost-model γ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    e2e = r["end_to_end"]
    tree_rows = e2e.get("tree_rows", [])
    chains = sorted(e2e["rows"], key=lambda x: (x["temperature"], x["gamma"]))
    trees = sorted(tree_rows, key=lambda x: (x["temperature"], x["nodes"]))
    for row in sorted(chains + trees, key=lambda x: x["temperature"]):  # stable: chains first
        tree = "tree" in row
        predicted = (
            ("–", "–")
            if tree
            else (
                f"{row['predicted_speedup_thm38']:.2f}X",
                f"{row['predicted_speedup_measured_verify']:.2f}X",
            )
        )
        lines.append(
            f"| {r['tokens_file'].get('task')} | {draft} | {row['temperature']:g} "
            f"| {row['name'] if tree else row['gamma']} | {row['nodes']} "
            f"| {row['alpha']:.2f} | {row['c']:.3f} | {row['verify_cost_ratio']:.2f} "
            f"| {row['tokens_per_iteration']:.2f} | {row['speedup']:.2f}X "
            f"| {predicted[0]} | {predicted[1]} | {row['identical_fraction']:.2f} "
            f"| {'yes' if row.get('cost_model_gamma') else ''} |"
        )
    lines += [
        "",
        "nodes: tokens of one verify call (γ + 1 for a chain, K for a tree, root included); "
        "verify/step: T(nodes)/T(1) from (a); a tree's α is Corollary 3.6's over its tested "
        "depths' nodes; tree rule: " + str(r["settings"].get("tree_rule", "without_replacement")),
    ]
    if trees:
        lines += [
            "",
            "### Token trees: acceptance per depth and per rank (accepted / tested)",
            "",
            "| Temp | tree | nodes | tokens/iter | over cost-model chain | per depth | per rank |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in trees:
            over = row.get("tokens_per_call_over_chain")
            lines.append(
                f"| {row['temperature']:g} | {row['name']} | {row['nodes']} "
                f"| {row['tokens_per_iteration']:.2f} | {'' if over is None else f'{over:.2f}x'} "
                f"| {', '.join(f'{a:.2f}' for a in row['depth_acceptance'])} "
                f"| {', '.join(f'{a:.2f}' for a in row['rank_acceptance'])} |"
            )
    ks = list(r["step_costs"][next(iter(r["step_costs"]))]["target_step_ms"])
    lines += [
        "",
        "## (a) Step costs (ms per cached decoder call; c = draft step / T(1))",
        "",
        "| batch | "
        + " | ".join(f"T({k})" for k in ks)
        + " | "
        + " | ".join(f"c {n}" for n in r["drafts"])
        + " |",
        "|---|" + "---|" * (len(ks) + len(r["drafts"])),
    ]
    for batch, row in r["step_costs"].items():
        lines.append(
            f"| {batch} | "
            + " | ".join(
                f"{row['target_step_ms'][k]:.2f} ({row['verify_cost_ratio'][k]:.2f}x)" for k in ks
            )
            + " | "
            + " | ".join(f"{row['c'][n]:.3f}" for n in r["drafts"])
            + " |"
        )
    f = r["floor"]
    lines += [
        "",
        "## (c) One-token XXL step vs the weight-streaming floor (batch 1)",
        "",
        f"- copy bandwidth {f['copy_bandwidth_gb_s']:.0f} GB/s; bytes read per decoder step "
        f"{f['decoder_step_bytes'] / 1e9:.2f} GB -> floor {f['floor_ms']:.3f} ms; measured "
        f"T(1) {f['target_step_ms_batch1']:.3f} ms = {f['step_over_floor']:.2f}x the floor",
        f"- logits layer per step: 8192-way {f['logits_8192_ms']:.3f} ms, {T5_VOCAB}-way "
        f"{f[f'logits_{T5_VOCAB}_ms']:.3f} ms: T5's vocabulary adds {f['t5_vocab_extra_ms']:.3f} "
        "ms per step (random weights)",
        f"- phases (s since start): {r['budget_phases_s']}",
    ]
    skipped = r["end_to_end"]["cost_model"].get("skipped_for_budget")
    if skipped:
        lines.append(f"- skipped for the time budget (T, γ or tree): {skipped}")
    text = "\n".join(lines) + "\n"
    return text + (batch_markdown(r["batch_sweep"]) if r.get("batch_sweep") else "")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few seconds of work")
    parser.add_argument("--tokens", default=str(TOKENS_FILE), help="export_tokens .npz file")
    parser.add_argument("--commit", help="commit to record where the tree has no .git (a copy)")
    parser.add_argument(
        "--batch_sweep_only", action="store_true", help="only (d), the batch sweep, at the pilot γ"
    )
    args = parser.parse_args(argv)
    if not args.smoke and jax.default_backend() == "cpu":
        parser.exit(
            2,
            "error: the full benchmark widens the target to T5 1.1 XXL (~10.7B parameters) and "
            "needs an accelerator; JAX sees only the CPU here (add --smoke for tiny shapes).\n",
        )
    command = "python -m benchmarks.accelerator " + " ".join(argv)
    if args.batch_sweep_only:
        return run_batch_sweep(args.out_dir, args.smoke, args.tokens, command, args.commit)
    return run_benchmark(args.out_dir, args.smoke, args.tokens, command, args.commit)


if __name__ == "__main__":
    main()
