"""Speculative decoding at batch > 1: a sweep over the eval job, T(b, k) and the batch cost model.

    python -m benchmarks.batch_sweep --batches 1,2,4,8 --gammas 1,2,3 --temperatures 0 \
        --num_examples 32 --repeats 3 --out_dir results/batch
    python -m benchmarks.batch_sweep --render --out_dir results/batch   # table.md from the records
    python -m benchmarks.batch_sweep --smoke --out_dir /tmp/batch_smoke   # tiny shapes, < 1 min

A batch is a setting of the eval job's rows (`specdec_t5x.eval`, `--gin.BATCH_SIZE=b`), not a
new code path: every run is `python -m specdec_t5x.eval --gin_file=GIN --gin.BATCH_SIZE=b ...`
in a subprocess (the same first NUM_EXAMPLES DDTP En→De test examples at every batch, batched
in input order as T5X's infer does), its folder kept under `OUT/runs/`. Separately, in this
process, the step timer (`timing.step_timer.step_costs`: slopes of jitted loops) prices the
target's call on k tokens per row at each batch b, T(b, k) for k = 1..max γ + 1, and the draft's
step at b (`OUT/costs/b<b>.json`). `--render` turns the records into `OUT/table.md`: measured
speed beside `batch_theory.batch_walltime_improvement` (the batch cost model, paper §3.4-3.5 and
Thm 3.8 with T(b, k) and the idle rows of a batch) fed with each run's α, its rows' output lengths
(the baseline's tokens) and the T(b, k) probe.

`--smoke` runs the same pipeline in process (`job.evaluate`) on a tiny random pair.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from specdec_t5x import batch_theory

EOS_ID = 1
DEFAULT_GIN = "gin/experiments/embedded_ende_model_t0.gin"


def run_name(temperature: float, batch: int, repeat: int) -> str:
    return f"T{temperature:g}_b{batch}_r{repeat}"


def _gin_value(g) -> str:
    return "'auto'" if g == "auto" else str(int(g))


def job_command(args, temperature: float, batch: int, repeat: int, out_dir: str) -> list[str]:
    """The eval job's command line for one run (one batch size, all γ rows, one repeat)."""
    gammas = list(args.gammas)
    head, rest = gammas[0], gammas[1:]
    cmd = [
        sys.executable, "-m", "specdec_t5x.eval", f"--gin_file={args.gin_file}",
        f"--gin.NUM_EXAMPLES={args.num_examples}", f"--gin.BATCH_SIZE={batch}",
        f"--gin.TEMPERATURE={temperature}", f"--gin.GAMMA={_gin_value(head)}",
        f"--gin.GAMMAS=[{', '.join(_gin_value(g) for g in rest)}]",
        f"--gin.COST_REPEATS={args.cost_repeats}", f"--gin.SEED={repeat}",
        f"--gin.EVAL_OUTPUT_DIR='{out_dir}'", "--overwrite",
    ]  # fmt: skip
    if args.target_shape:
        cmd.append(f"--gin.TARGET_SHAPE='{args.target_shape}'")
    return cmd


def load_avg() -> float:
    return os.getloadavg()[0]


def run_jobs(args) -> None:
    """Every (repeat, temperature, batch) run, in that nesting (a repeat covers every batch before
    the next starts, so a change of load spreads over the batches); finished runs are kept."""
    runs = pathlib.Path(args.out_dir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for r in range(args.repeats):
        for t in args.temperatures:
            for b in args.batches:
                out = runs / run_name(t, b, r)
                if (out / "metrics.json").exists() and not args.redo:
                    print(f"[batch_sweep] keep {out}", flush=True)
                    continue
                cmd = job_command(args, t, b, r, str(out))
                print(f"[batch_sweep] {time.strftime('%H:%M:%S')} load {load_avg():.1f}: "
                      + shlex.join(cmd[1:]), flush=True)  # fmt: skip
                start = time.perf_counter()
                with open(str(out) + ".log", "w") as log:
                    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
                print(f"[batch_sweep] rc {proc.returncode} in {time.perf_counter() - start:.0f} s",
                      flush=True)  # fmt: skip


# --- T(b, k): the target's call on b rows of k tokens, and the draft's step, per batch ----------


def probe_gamma(gammas) -> int:
    """The γ of the probe's verify and iteration loops: the largest fixed γ (6 with auto only)."""
    fixed = [g for g in gammas if g != "auto"]
    return max(fixed) if fixed else 6


def call_costs(spec_model, target_params, draft_params, sources, batch, max_decode_len, gamma,
               repeats) -> dict[str, Any]:  # fmt: skip
    """T(b, k) for k = 1..γ + 1 and the draft's step at batch b (`step_timer.step_costs`: jitted
    loops' slopes, one probe), on the first b sources (cycled), int32 [b, enc_len]."""
    from specdec_t5x.timing import step_timer

    enc = np.stack([sources[i % len(sources)] for i in range(batch)]).astype(np.int32)
    start = time.perf_counter()
    load = [load_avg()]
    out = step_timer.step_costs(
        spec_model, target_params, draft_params, enc, max_decode_len, gamma,
        repeats=repeats, block_sizes=tuple(range(1, gamma + 2)),
    )  # fmt: skip
    load.append(load_avg())
    t1 = out["block_step_ms"][1]
    return {
        "batch": batch,
        "gamma": gamma,
        "T_ms": {str(k): v for k, v in out["block_step_ms"].items()},  # T(b, k), ms per call
        "target_step_ms": out["target_step_ms"],
        "verify_step_ms": out["verify_step_ms"],
        "draft_step_ms_alone": out["draft_step_ms"],
        "c_in_loop": out["c"],  # (iteration - verify) / (γ T(b, 1)): the draft as the loop pays it
        "draft_step_ms": out["c"] * out["target_step_ms"],  # d(b)
        "T_per_row_ms": t1 / batch,
        "load": load,
        "seconds": time.perf_counter() - start,
    }


def _padded_sources(examples, input_len: int) -> list[np.ndarray]:
    rows = []
    for ex in examples:
        row = np.zeros((input_len,), np.int32)
        tokens = np.asarray(ex["inputs"])[:input_len]
        row[: len(tokens)] = tokens
        rows.append(row)
    return rows


def measure_call_costs(args) -> None:
    """`OUT/costs/b<b>.json` per batch: the gin pair's T(b, k) and d(b), in this process."""
    from specdec_t5x import gin_utils
    from specdec_t5x import inputs as inputs_lib
    from specdec_t5x.eval import pairs

    bindings = [f"TARGET_SHAPE = '{args.target_shape}'"] if args.target_shape else []
    spec_model, tp, dp = pairs.load_pair_from_gin([args.gin_file], bindings)
    task = gin_utils.query_macro("TASK")
    input_len = gin_utils.query_macro("INPUT_LEN", 64)
    target_len = gin_utils.query_macro("TARGET_LEN", 64)
    examples, _, _ = inputs_lib.load_examples(
        task, "test", max(args.batches), input_len, target_len, spec_model.input_vocabulary
    )
    sources = _padded_sources(examples, input_len)
    costs = pathlib.Path(args.out_dir) / "costs"
    costs.mkdir(parents=True, exist_ok=True)
    gamma = probe_gamma(args.gammas)
    for b in args.batches:
        print(f"[batch_sweep] {time.strftime('%H:%M:%S')} T(b, k) at b = {b}, load "
              f"{load_avg():.1f}", flush=True)  # fmt: skip
        out = call_costs(spec_model, tp, dp, sources, b, target_len, gamma, args.probe_repeats)
        out["target_shape"] = args.target_shape
        (costs / f"b{b}.json").write_text(json.dumps(out, indent=1))


# --- The records and the table ---------------------------------------------------------------


def _row_length(tokens, max_len: int) -> int:
    """Output length in tokens, EOS counted (the decode limit when no EOS)."""
    tokens = list(tokens)
    return tokens.index(EOS_ID) + 1 if EOS_ID in tokens else max_len


def _stat(stats: dict, name: str) -> np.ndarray:
    value = stats[name]
    return np.asarray(value[1] if isinstance(value, list) and len(value) == 2 else value)


def _baseline_key(runs: dict) -> str:
    return "baseline" if "baseline" in runs else sorted(k for k in runs if "baseline" in k)[0]


CALLS_FILE = "batch_calls.json"  # per decode call: row lengths and loop iterations (committed)


def _calls(run_dir: pathlib.Path, max_len: int) -> tuple[list, dict]:
    """(row lengths per call, {γ row: [(max, mean over rows) iterations per call]}) of a run,
    from its records.jsonl (git-ignored: large), kept in `batch_calls.json` for later renders."""
    records, kept = run_dir / "records.jsonl", run_dir / CALLS_FILE
    if not records.exists():
        data = json.loads(kept.read_text())
        return data["lengths"], {k: [tuple(x) for x in v] for k, v in data["iterations"].items()}
    lengths, iterations = [], {}
    for line in records.read_text().splitlines():
        runs = json.loads(line)["runs"]
        base = runs[_baseline_key(runs)]
        lengths.append([_row_length(t, max_len) for t in base["tokens"]])
        for key, run in runs.items():
            if "baseline" in key or "num_iterations" not in run.get("stats", {}):
                continue
            n = _stat(run["stats"], "num_iterations")
            iterations.setdefault(key, []).append((int(n.max()), float(n.mean())))
    kept.write_text(json.dumps({"lengths": lengths, "iterations": iterations}))
    return lengths, iterations


def read_run(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    """One record per γ row of one eval run: the metrics and, from records.jsonl, each decode
    call's row lengths (the baseline's tokens) and loop iterations (max and mean over rows)."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    task = metrics["task"]
    batch, max_len = task["batch_size"], task["max_decode_len"]
    lengths, iterations = _calls(run_dir, max_len)
    speed, costs = metrics["speed"], metrics.get("costs", {})
    out = []
    for key, row in metrics.get("gamma_sweep", {}).items():
        its = iterations.get(str(key), [])
        out.append(
            {
                "run": run_dir.name,
                "temperature": float(metrics["decoding"]["temperature"]),
                "batch": batch,
                "gamma": key,
                "num_examples": task["num_examples"],
                "speedup": row["speedup"],
                "alpha": row.get("alpha_counted"),
                "tokens_per_call": row.get("tokens_per_iteration"),
                "baseline_tokens_per_s": speed.get("baseline_tokens_per_s"),
                "speculative_tokens_per_s": row.get("speculative_tokens_per_s"),
                "identical": row.get("identical_fraction"),
                "verify_per_step": costs.get("verify_cost_ratio"),  # the job's probe, headline γ
                "c_job": costs.get("c_measured"),  # the job's probe at this batch, in the loop
                "job_gamma": metrics["decoding"].get("gamma"),
                "load": speed.get("busy_machine", {}).get("load"),
                "loop_iterations": float(np.mean([m for m, _ in its])) if its else None,
                "row_iterations": float(np.mean([r for _, r in its])) if its else None,
                "lengths": lengths,
                "commit": metrics.get("provenance", {}).get("commit"),
                "hardware": metrics.get("provenance", {}).get("hardware"),
                "date": metrics.get("provenance", {}).get("date"),
            }
        )
    return out


def predict(record: dict[str, Any], costs: dict[str, Any] | None) -> dict[str, float | None]:
    """The batch cost model for one record: with the probe's T(b, k) and d(b) = c_b T(b, 1)
    ('predicted'; `costs['c_b']`, set by `render`: the median over the jobs at b of their own
    in-loop c, else the probe's), and with a flat cost curve, T(b, k) = T(b, 1) and c of batch 1
    ('flat': an accelerator's regime)."""
    out: dict[str, float | None] = {"predicted": None, "flat": None, "waste": None}
    g = record["gamma"]
    if g == "auto" or not str(g).isdigit() or record["alpha"] is None:
        return out
    g, alpha = int(g), min(float(record["alpha"]), 1.0)
    waste = batch_theory.batch_waste(record["lengths"], alpha, g)
    out["waste"] = waste["speculative_waste"]
    out["baseline_waste"] = waste["baseline_waste"]
    out["model_iterations"] = waste["speculative_iterations"]
    if costs and str(g + 1) in costs["T_ms"]:
        model = batch_theory.batch_speedup_from_costs(
            record["lengths"], alpha, g, costs["T_ms"]["1"], costs["T_ms"][str(g + 1)],
            costs.get("c_b", costs["c_in_loop"]) * costs["T_ms"]["1"],
        )  # fmt: skip
        out["predicted"] = model["speedup"]
        out["verify_b"] = model["verify_cost_ratio_b"]
        out["c_b"] = model["c_b"]
    if costs is not None:
        c1 = costs.get("c_batch_1")
        if c1 is not None:
            out["flat"] = batch_theory.batch_walltime_improvement(
                alpha, g, c1, 1.0, waste["baseline_waste"], waste["speculative_waste_eq1"]
            )
    return out


def _hardware(record) -> str:
    return str(record["hardware"]).split("; load average")[0]


def _fmt(x, spec=".2f", none="—"):
    return none if x is None else format(x, spec)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def render(out_dir: str) -> str:
    """`OUT/table.md` from `OUT/runs/*/metrics.json` (+ records.jsonl) and `OUT/costs/b*.json`."""
    root = pathlib.Path(out_dir)
    records = []
    for metrics in sorted(glob.glob(str(root / "runs" / "*" / "metrics.json"))):
        records.extend(read_run(pathlib.Path(metrics).parent))
    costs = {}
    for path in glob.glob(str(root / "costs" / "b*.json")):
        c = json.loads(pathlib.Path(path).read_text())
        costs[int(c["batch"])] = c
    # The draft's step at b: the median of the positive in-loop c's of the jobs at b and of the
    # probe (a busy machine often times the draft's slope as 0), else of every job's positive c.
    runs_c = {(r["run"], r["batch"], r["c_job"]) for r in records if (r["c_job"] or 0) > 0}
    for b, c in costs.items():
        here = [x for _, rb, x in runs_c if rb == b] + [c["c_in_loop"]] * (c["c_in_loop"] > 0)
        c["c_b"] = _median(here) if here else (_median([x for *_, x in runs_c]) or 0.0)
        c["draft_step_ms"] = c["c_b"] * c["T_ms"]["1"]
    if 1 in costs:
        for c in costs.values():
            c["c_batch_1"] = costs[1]["c_b"]
    groups: dict[tuple, list] = {}
    for r in records:
        r.update(predict(r, costs.get(r["batch"])))
        groups.setdefault((r["temperature"], r["batch"], str(r["gamma"])), []).append(r)
    loads = [r["load"] for r in records if r["load"] is not None]
    lines = [
        "# Speculative decoding at batch b: measured beside the batch cost model",
        "",
        f"Rendered by `python -m benchmarks.batch_sweep --render --out_dir {out_dir}` from "
        f"{len(records)} row records of {len({r['run'] for r in records})} eval runs"
        + (f" (commit {records[0]['commit'][:7]}, {_hardware(records[0])})" if records else "")
        + ". "
        f"Load average while timing: {_fmt(min(loads) if loads else None, '.1f')} to "
        f"{_fmt(max(loads) if loads else None, '.1f')} on 2 cores: **a busy machine; these speeds "
        "are not a quiet machine's**.",
        "",
        "Speed = the job's measured speed-up (baseline seconds / speculative seconds over the "
        "run), median over repeats (range). Predicted = `batch_theory.batch_speedup_from_costs` (the run's α "
        "and rows' lengths, T(b, 1), T(b, γ+1) and d(b) from the T(b, k) probe below); "
        "flat-T model = `batch_theory.batch_walltime_improvement` with T(b, k) = T(b, 1) and c of "
        "batch 1 (an accelerator's regime), same α and waste. Iterations per call: the speculative "
        "loop's iterations per decode call (max over rows) / the mean row's: the idle-row waste "
        "(model's in brackets). Baseline steps: the baseline loop's steps per call (max row "
        "length) / the mean row's length. verify/step: the job's own probe at its headline γ "
        "(γ = first of the list); identical: share of outputs equal to the baseline (T = 0).",
        "",
        "| T | b | γ | runs | speed | predicted | flat-T model | baseline tok/s | speculative "
        "tok/s | tokens/call/row | iterations per call: loop / mean row (model) | baseline "
        "steps: loop / mean row | α | verify/step (job) | T(b,γ+1)/T(b,1) | c_b | identical "
        "| load |",
        "|" + "---|" * 18,
    ]
    for (t, b, g), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        speeds = [r["speedup"] for r in rs]
        loop, row = (
            _median([r["loop_iterations"] for r in rs]),
            _median([r["row_iterations"] for r in rs]),
        )
        base = batch_theory.batch_waste(rs[0]["lengths"], 0.0, 1)
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{t:g}",
                    str(b),
                    g,
                    str(len(rs)),
                    f"{_fmt(_median(speeds))}X ({_fmt(min(speeds))}–{_fmt(max(speeds))})",
                    _fmt(_median([r["predicted"] for r in rs]), ".2f")
                    + "X" * bool(_median([r["predicted"] for r in rs])),
                    _fmt(_median([r["flat"] for r in rs]), ".2f")
                    + "X" * bool(_median([r["flat"] for r in rs])),
                    _fmt(_median([r["baseline_tokens_per_s"] for r in rs]), ".0f"),
                    _fmt(_median([r["speculative_tokens_per_s"] for r in rs]), ".0f"),
                    _fmt(_median([r["tokens_per_call"] for r in rs])),
                    f"{_fmt(loop, '.1f')} / {_fmt(row, '.1f')} = "
                    f"{_fmt(loop / row if loop and row else None)} "
                    f"({_fmt(_median([r['waste'] for r in rs]))})",
                    f"{base['baseline_iterations']:.1f} / {base['baseline_row_iterations']:.1f} = "
                    f"{base['baseline_waste']:.2f}",
                    _fmt(_median([r["alpha"] for r in rs])),
                    _fmt(_median([r["verify_per_step"] for r in rs])),
                    _fmt(_median([r.get("verify_b") for r in rs])),
                    _fmt(_median([r.get("c_b") for r in rs]), ".3f"),
                    _fmt(_median([r["identical"] for r in rs])),
                    _fmt(_median([r["load"] for r in rs]), ".1f"),
                ]
            )
            + " |"
        )
    if costs:
        ks = sorted({int(k) for c in costs.values() for k in c["T_ms"]})
        lines += [
            "",
            "## T(b, k): the target's cached call on b rows of k tokens (ms per call)",
            "",
            "The step timer's slopes (`timing.step_timer.step_costs`, jitted loops, median over "
            "rounds), separate calls per batch; d(b) = c_b × T(b, 1), c_b = the draft's step over "
            "the target's as the decode loop pays them: the median of the positive in-loop c's "
            "of the eval runs at b (the job's `c_measured`) and of this probe (a busy machine "
            "often times the draft's slope as 0), else of every run's positive c. Load average "
            "before and after each probe in the last column.",
            "",
            "| b | " + " | ".join(f"T(b,{k})" for k in ks) + " | T(b,1)/b per row | d(b) | c_b | "
            "T(b,γ+1)/T(b,1) | load |",
            "|" + "---|" * (len(ks) + 6),
        ]
        for b in sorted(costs):
            c = costs[b]
            t = c["T_ms"]
            top = str(c["gamma"] + 1)
            lines.append(
                f"| {b} | "
                + " | ".join(_fmt(t.get(str(k)), ".3f") for k in ks)
                + f" | {c['T_per_row_ms']:.3f} | {c['draft_step_ms']:.3f} | "
                f"{c['c_b']:.3f} | {t[top] / t['1']:.2f} (γ = {c['gamma']}) | "
                + " → ".join(f"{x:.1f}" for x in c["load"])
                + " |"
            )
    text = "\n".join(lines) + "\n"
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(text)
    (root / "records.json").write_text(
        json.dumps([{k: v for k, v in r.items() if k != "lengths"} for r in records], indent=1)
    )
    return text


# --- Smoke: the same pipeline on a tiny random pair, in process --------------------------------


def tiny_pair(seed: int = 0):
    """(spec model, target params): a tiny random target on the shipped vocabulary and a draft of
    its weights perturbed by 5 % noise (the tests' tiny pair)."""
    import jax

    from benchmarks import random_pair
    from specdec_t5x import drafts, models, network, vocab

    vocabulary = vocab.get_vocabulary()
    config = network.T5Config(
        vocab_size=vocab.model_vocab_size(vocabulary), emb_dim=8, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, head_dim=3, mlp_dim=16,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0,
    )  # fmt: skip
    module = network.Transformer(config)
    params = random_pair.random_params(module, seed)
    rng = np.random.default_rng(seed + 1)
    noisy = jax.tree_util.tree_map(
        lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype), params
    )
    spec = models.SpeculativeEncoderDecoderModel(
        module, drafts.T5Draft(module, noisy), vocabulary, vocabulary
    )
    return spec, params


def smoke(args) -> int:
    """Batches 1 and 2, γ = 2, T = 0, 4 DDTP examples of 32 / 12 tokens, the tiny pair:
    runs, T(b, k) and the table, in process (under a minute on 2 cores)."""
    from specdec_t5x import inputs as inputs_lib
    from specdec_t5x import sampling
    from specdec_t5x.eval import config, job
    from specdec_t5x.timing import step_timer

    spec, params = tiny_pair()
    root = pathlib.Path(args.out_dir)
    batches, gammas, n, input_len, target_len = [1, 2], [2], 4, 32, 12
    for b in batches:
        out = root / "runs" / run_name(0.0, b, 0)
        job.evaluate(
            spec, params, str(out),
            data=config.DataConfig("ddtp_ende", "test", n, b, input_len, target_len),
            speculation=config.SpeculationConfig(gammas[0], gammas[1:]),
            sampling_settings=sampling.SamplingSettings(0.0, 0, 0.0),
            measure=config.MeasureConfig(0, 3, True, False),
            command="python -m benchmarks.batch_sweep --smoke", overwrite=True,
        )  # fmt: skip
    examples, _, _ = inputs_lib.load_examples(
        "ddtp_ende", "test", max(batches), input_len, target_len
    )
    sources = _padded_sources(examples, input_len)
    tp, dp = step_timer.packed(spec, params, spec.draft.params)
    (root / "costs").mkdir(parents=True, exist_ok=True)
    for b in batches:
        out = call_costs(spec, tp, dp, sources, b, target_len, max(gammas), 3)
        (root / "costs" / f"b{b}.json").write_text(json.dumps(out, indent=1))
    print(render(str(root)))
    return 0


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


def _gamma(text: str):
    return "auto" if text == "auto" else int(text)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gin_file", default=DEFAULT_GIN)
    p.add_argument("--target_shape", default=None, help="e.g. base (TARGET_SHAPE); default shipped")
    p.add_argument("--batches", type=_csv(int), default=[1, 2, 4, 8])
    p.add_argument("--gammas", type=_csv(_gamma), default=[1, 2, 3], help="ints and/or auto")
    p.add_argument("--temperatures", type=_csv(float), default=[0.0])
    p.add_argument("--num_examples", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cost_repeats", type=int, default=30, help="the job's COST_REPEATS")
    p.add_argument("--probe_repeats", type=int, default=30, help="T(b, k) probe rounds")
    p.add_argument("--out_dir", default="results/batch")
    p.add_argument("--redo", action="store_true", help="rerun finished runs")
    p.add_argument("--skip_runs", action="store_true", help="only the T(b, k) probe and table")
    p.add_argument("--skip_costs", action="store_true", help="no T(b, k) probe")
    p.add_argument("--render", action="store_true", help="only render table.md from the records")
    p.add_argument("--smoke", action="store_true", help="tiny random pair in process, < 1 min")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.smoke:
        return smoke(args)
    if not args.render:
        if not args.skip_runs:
            run_jobs(args)
        if not args.skip_costs:
            measure_call_costs(args)
    print(render(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
