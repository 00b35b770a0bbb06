"""The main job: baseline vs speculative decoding on a seqio task split, timed side by side.

`evaluate` decodes every example with the baseline (`decoding.temperature_sample`, the target
alone) and with `speculative.speculative_sample` (target + draft), same target weights, same
inputs, same sampling settings, and reports what the paper reports (Tables 2-4): γ, α (counted
and Corollary-3.6 β estimate), the cost coefficient c measured in the same run, tokens per
iteration, measured walltime speedup and the Theorem 3.8 prediction.

Timing rules (so ratios mean something):
* every jitted function is compiled and run once on the evaluation shapes before timing;
* baseline and speculative run interleaved example by example, alternating which goes first;
* each call ends with `jax.block_until_ready`; seconds are wall-clock (`time.perf_counter`);
* the whole prediction is timed for both (encoder pass + cache set-up + decode loop).

In argmax mode (temperature 0) the job checks itself: `identical_fraction` is the share of examples
whose speculative tokens equal the baseline's; each difference gets a near-tie report (first
differing position, the target's top-2 logit gap there).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specdec_t5x import benchmark, gamma_control, models, sampling, speculative, theory


def load_examples(
    task_name: str,
    split: str,
    num_examples: int,
    input_len: int,
    target_len: int,
    vocabulary=None,
):
    """Tokenised examples of a registered seqio task (T5's preprocessing, EOS appended).

    T5's paper tasks (`wmt_t2t_ende_v003`, `cnn_dailymail_v002`) are re-registered with
    `vocabulary` (the model's, from gin) when given, so tokeniser and model always agree.

    Returns:
      list of dicts with `inputs` / `targets` int32 NumPy arrays (unpadded, <= the lengths) and
      their `*_pretokenized` strings.

    Raises:
      ValueError: the task yields no examples for `split`.
    """
    import seqio

    from specdec_t5x import tasks  # registers the tasks

    if vocabulary is not None and task_name in (tasks.WMT_TASK, tasks.CNN_DM_TASK):
        tasks.register_t5_paper_tasks(vocabulary)
    task = seqio.get_mixture_or_task(task_name)
    ds = task.get_dataset(
        {"inputs": input_len, "targets": target_len},
        split=split,
        shuffle=False,
        num_epochs=1,
        use_cached=False,
    )
    examples = []
    for ex in ds.take(num_examples).as_numpy_iterator():
        examples.append(
            {
                "inputs": np.asarray(ex["inputs"], np.int32),
                "targets": np.asarray(ex["targets"], np.int32),
                "inputs_pretokenized": ex.get("inputs_pretokenized", b"").decode(),
                "targets_pretokenized": ex.get("targets_pretokenized", b"").decode(),
            }
        )
    if not examples:
        raise ValueError(f"task {task_name!r} has no examples in split {split!r}.")
    return examples, task


def _pad(rows: Sequence[np.ndarray], length: int) -> np.ndarray:
    out = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:length]
    return out


def _timed(fn, *args, compiles=None) -> tuple[Any, float]:
    """(result, wall seconds) of `fn(*args)` including `block_until_ready`."""
    if compiles is not None:
        compiles.active = True
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    if compiles is not None:
        compiles.active = False
    return out, seconds


def _strip(tokens: np.ndarray, eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (zeros after it dropped)."""
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


# ----------------------------------------------------------------------------------------------
# Step costs: c and the verify-call ratio, measured on the same positions.


def measure_step_costs(
    spec_model: models.SpeculativeEncoderDecoderModel,
    target_params,
    draft_params,
    encoder_input_tokens: np.ndarray,
    max_decode_len: int,
    gamma: int,
    position: int = 8,
    repeats: int = 30,
) -> dict[str, float]:
    """c and the verify-cost ratio of this run's target and draft, on the same positions.

    One cached target step, one draft step and one γ+1 verify step at decoder position
    `position`, caches built from `encoder_input_tokens` (int32 [batch, enc_len]); timed by
    `benchmark.time_decoder_steps` (compiled first, interleaved, medians, steps timed inside a
    `fori_loop` with the cache as carry, as in the decode loops).

    Returns:
      {'target_step_ms', 'draft_step_ms', 'verify_step_ms', their IQRs, 'c' (draft step / target
      step, the paper's c), 'verify_cost_ratio' (verify step / target step; the paper assumes ~1)}.
    """
    return gamma_control.step_costs(
        spec_model,
        target_params,
        draft_params,
        encoder_input_tokens,
        max_decode_len,
        gamma,
        position=position,
        repeats=repeats,
    )


# ----------------------------------------------------------------------------------------------
# Near-tie report for argmax mode.


def near_tie_report(module, target_params, encoder_input_tokens, baseline, speculative_tokens):
    """Where greedy outputs differ: the first differing position and the target's top-2 gap there.

    Args:
      module: target network.
      target_params: its parameters.
      encoder_input_tokens: int32 [enc_len].
      baseline: int32 [max_decode_len] baseline greedy tokens.
      speculative_tokens: int32 [max_decode_len] speculative tokens.

    Returns:
      dict with `position`, `baseline_token`, `speculative_token`, `top2_logit_gap` (float, logits
      units, computed with the teacher-forced full forward on the baseline prefix) and
      `speculative_is_runner_up`.
    """
    diff = np.nonzero(np.asarray(baseline) != np.asarray(speculative_tokens))[0]
    t = int(diff[0])
    targets = jnp.asarray(baseline)[None]
    dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    logits = module.apply(
        {"params": target_params},
        jnp.asarray(encoder_input_tokens)[None],
        dec_in,
        jnp.ones_like(targets),
        enable_dropout=False,
    )[0, t]
    top2 = np.sort(np.asarray(logits))[-2:]
    return {
        "position": t,
        "baseline_token": int(baseline[t]),
        "speculative_token": int(speculative_tokens[t]),
        "top2_logit_gap": float(top2[1] - top2[0]),
        "speculative_is_runner_up": int(np.argsort(np.asarray(logits))[-2])
        == int(speculative_tokens[t]),
    }


# ----------------------------------------------------------------------------------------------
# Provenance.


def hardware_description() -> str:
    """One line: CPU model, cores, JAX devices and load average (from `benchmark.hardware_info`)."""
    hw = benchmark.hardware_info()
    load = ", ".join(f"{x:.1f}" for x in hw["load_average"])
    return (
        f"{hw['cpu_model']} ({hw['nproc']} cores); jax {hw['jax_version']} "
        f"{', '.join(hw['jax_devices'])}; load average {load}"
    )


# ----------------------------------------------------------------------------------------------
# The job.


class _CompileCounter:
    """Counts XLA compilations while active (the timed loop must cause none)."""

    def __init__(self):
        self.count, self.active = 0, False

    def __call__(self, event: str, duration_s: float, **kwargs) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


@dataclasses.dataclass
class _Run:
    """Per-example records of one decoder (baseline or speculative at one γ)."""

    seconds: list = dataclasses.field(default_factory=list)
    tokens: list = dataclasses.field(default_factory=list)
    stats: list = dataclasses.field(default_factory=list)


def evaluate(
    spec_model: models.SpeculativeEncoderDecoderModel,
    target_params,
    task: str,
    output_dir: str,
    *,
    gamma: int,
    temperature: float,
    topk: int = 0,
    topp: float = 0.0,
    split: str = "test",
    num_examples: int = 100,
    batch_size: int = 1,
    input_len: int = 64,
    target_len: int = 64,
    gammas: Sequence[int] | None = None,
    draft_name: str = "draft",
    draft_params=None,
    seed: int = 0,
    cost_repeats: int = 30,
    command: str | None = None,
    operative_config: str | None = None,
) -> dict[str, Any]:
    """Runs baseline and speculative decoding side by side and writes the results directory.

    Args:
      spec_model: target + draft (`models.SpeculativeEncoderDecoderModel`).
      target_params: target parameters.
      task: registered seqio task name (e.g. 'ddtp_ende', 'wmt_t2t_ende_v003').
      output_dir: where `metrics.json`, `predictions.jsonl`, `table_row.md`, plots and the
        operative config go (created).
      gamma: γ of the headline row.
      temperature, topk, topp: sampling settings, passed explicitly to both decoders.
      split: task split.
      num_examples: examples decoded (the first ones of the split, unshuffled).
      batch_size: examples per decode call (the paper: 1).
      input_len, target_len: encoder length (inputs padded to it) and max_decode_len.
      gammas: optional extra γ values for the speedup-vs-γ sweep (each timed the same way).
      draft_name: label of the draft in tables.
      draft_params: draft parameters (default `spec_model.draft.params`).
      seed: sampling seed (example i uses `fold_in(PRNGKey(seed), i)` for both decoders).
      cost_repeats: repeats of the step-cost measurement.
      command, operative_config: provenance written with the results.

    Returns:
      The metrics dict (also written to `metrics.json`).

    Raises:
      ValueError: bad γ / sampling settings (from the samplers) or an empty split.
    """
    sampling.validate(temperature, topk, topp)
    gammas = sorted({int(gamma), *(int(g) for g in (gammas or ()))})
    draft_params = spec_model.draft.params if draft_params is None else draft_params
    out_dir = pathlib.Path(output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocabulary = spec_model.output_vocabulary
    examples, seqio_task = load_examples(
        task, split, num_examples, input_len, target_len, vocabulary
    )
    eos_id = spec_model.eos_id
    baseline = models.EncoderDecoderModel(spec_model.module, vocabulary, vocabulary)
    settings = {"temperature": temperature, "topk": topk, "topp": topp}

    base_fn = jax.jit(
        lambda tp, b, rng: baseline.predict_batch_with_aux(tp, b, rng, decoder_params=settings)[0]
    )
    spec_fns = {
        g: jax.jit(
            lambda tp, dp, b, rng, g=g: spec_model.predict_batch_with_aux(
                tp, b, rng, decoder_params={**settings, "gamma": g}, draft_params=dp
            )
        )
        for g in gammas
    }
    batches = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        rows = chunk + [chunk[-1]] * (batch_size - len(chunk))  # pad the last batch
        batches.append(
            (
                len(chunk),
                {
                    "encoder_input_tokens": jnp.asarray(
                        _pad([e["inputs"] for e in rows], input_len)
                    ),
                    "decoder_input_tokens": jnp.zeros((batch_size, target_len), jnp.int32),
                },
            )
        )

    # Compile and warm up every function on the evaluation shapes (excluded from timing).
    rng0 = jax.random.PRNGKey(seed)
    jax.block_until_ready(base_fn(target_params, batches[0][1], rng0))
    for fn in spec_fns.values():
        jax.block_until_ready(fn(target_params, draft_params, batches[0][1], rng0))

    runs = {"baseline": _Run(), **{g: _Run() for g in gammas}}
    compiles = _CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(compiles)
    for i, (n, batch) in enumerate(
        tqdm.tqdm(batches, desc=f"{task} T={temperature}", unit="batch")
    ):
        rng = jax.random.fold_in(rng0, i)
        order = ["baseline", *gammas]
        if i % 2:
            order.reverse()  # alternate who goes first
        for key in order:
            if key == "baseline":
                tokens, seconds = _timed(base_fn, target_params, batch, rng, compiles=compiles)
                stats = None
            else:
                (tokens, aux), seconds = _timed(
                    spec_fns[key], target_params, draft_params, batch, rng, compiles=compiles
                )
                stats = jax.tree_util.tree_map(np.asarray, aux["stats"])
            run, tokens = runs[key], np.asarray(tokens)
            for r in range(n):
                run.seconds.append(seconds / n)
                run.tokens.append(tokens[r])
                run.stats.append(
                    None if stats is None else jax.tree_util.tree_map(lambda x: x[r], stats)
                )

    costs = measure_step_costs(
        spec_model,
        target_params,
        draft_params,
        batches[0][1]["encoder_input_tokens"],
        target_len,
        gamma,
        repeats=cost_repeats,
    )
    metrics = _summarise(
        runs, gammas, gamma, costs, examples, seqio_task, vocabulary, eos_id, settings
    )
    near_ties = []
    if sampling.is_greedy(temperature):
        for idx, (b, s) in enumerate(zip(runs["baseline"].tokens, runs[gamma].tokens, strict=True)):
            if not np.array_equal(b, s):
                report = near_tie_report(
                    spec_model.module,
                    target_params,
                    _pad([examples[idx]["inputs"]], input_len)[0],
                    b,
                    s,
                )
                near_ties.append({"example": idx, **report})
    metrics.update(
        task=task,
        split=split,
        num_examples=len(examples),
        batch_size=batch_size,
        gamma=gamma,
        temperature=temperature,
        topk=topk,
        topp=topp,
        draft=draft_name,
        input_len=input_len,
        max_decode_len=target_len,
        near_ties=near_ties,
        compilations_during_timing=compiles.count,
        max_near_tie_gap=max((r["top2_logit_gap"] for r in near_ties), default=None),
        hardware=hardware_description(),
        commit=benchmark.git_commit(pathlib.Path(__file__).resolve().parents[1]),
        command=command or " ".join(sys.argv),
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    _write_outputs(
        out_dir, metrics, runs, gammas, gamma, examples, vocabulary, eos_id, operative_config
    )
    return metrics


def _decode_text(vocabulary, tokens: np.ndarray, eos_id: int) -> str:
    ids = [t for t in _strip(tokens, eos_id) if t != eos_id]
    return vocabulary.decode(ids) if vocabulary is not None else " ".join(map(str, ids))


def _quality(seqio_task, vocabulary, examples, tokens, eos_id) -> dict[str, float]:
    predictions = [_decode_text(vocabulary, t, eos_id) for t in tokens]
    targets = [e["targets_pretokenized"] for e in examples]
    scores = {}
    for metric_fn in seqio_task.metric_fns:
        scores.update({k: float(v) for k, v in metric_fn(targets, predictions).items()})
    return scores


def _summarise(runs, gammas, gamma, costs, examples, seqio_task, vocabulary, eos_id, settings):
    base = runs["baseline"]
    base_s = float(np.sum(base.seconds))
    base_tokens = int(sum(len(_strip(t, eos_id)) for t in base.tokens))
    sweep = {}
    for g in gammas:
        run = runs[g]
        st = {k: np.sum([getattr(s, k) for s in run.stats], axis=0) for k in _STAT_KEYS}
        alpha_beta = float(st["beta_sum"] / max(st["num_beta"], 1))
        alpha_counted = float(st["num_accepted"] / max(st["num_draft_tokens"], 1))
        spec_s = float(np.sum(run.seconds))
        alpha_for_theory = min(alpha_beta, 1 - 1e-9)
        predicted = float(theory.walltime_improvement(alpha_for_theory, g, costs["c"]))
        tokens_per_iter = float(theory.expected_tokens_per_iteration(alpha_for_theory, g))
        sweep[g] = {
            "speedup": base_s / spec_s,
            "median_example_speedup": float(
                np.median(np.asarray(base.seconds) / np.asarray(run.seconds))
            ),
            "alpha_counted": alpha_counted,
            "alpha_beta": alpha_beta,
            "tokens_per_iteration": float(st["num_generated"] / max(st["num_iterations"], 1)),
            "expected_tokens_per_iteration_eq1": tokens_per_iter,
            "predicted_speedup_thm38": predicted,
            # Thm 3.8 with the measured verify cost instead of the paper's ~1x assumption.
            "predicted_speedup_measured_verify": tokens_per_iter
            / (g * costs["c"] + costs["verify_cost_ratio"]),
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
            "quality": _quality(seqio_task, vocabulary, examples, run.tokens, eos_id),
        }
    head = sweep[gamma]
    return {
        **{k: head[k] for k in head if k not in ("quality",)},
        "c_measured": costs["c"],
        "verify_cost_ratio": costs["verify_cost_ratio"],
        "step_costs": costs,
        "measured_over_predicted": head["speedup"] / head["predicted_speedup_thm38"],
        "baseline_seconds": base_s,
        "baseline_tokens_per_s": base_tokens / base_s,
        "quality": {
            "baseline": _quality(seqio_task, vocabulary, examples, base.tokens, eos_id),
            "speculative": head["quality"],
        },
        "gamma_sweep": {str(g): v for g, v in sweep.items()},
        "sampling": settings,
    }


_STAT_KEYS = [f.name for f in dataclasses.fields(speculative.SpeculativeStats)]

TABLE_HEADER = (
    "| Task | M_q | Temp | γ | α | c | verify/step | tokens/iter | Speed | Predicted (Thm 3.8) "
    "| Predicted (measured verify) | identical |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(m: dict[str, Any]) -> str:
    """One markdown row shaped like the paper's Table 2, plus c, the verify cost, tokens per
    iteration, Thm 3.8 with the measured verify cost (E / (γc + verify)) and identical_fraction
    (1.0 expected at T = 0; at T > 0 outputs are different samples of the same distribution)."""
    return (
        f"| {m['task']} | {m['draft']} | {m['temperature']:g} | {m['gamma']} | "
        f"{m['alpha_beta']:.2f} | {m['c_measured']:.3f} | {m['verify_cost_ratio']:.2f} | "
        f"{m['tokens_per_iteration']:.2f} | {m['speedup']:.2f}X | {m['predicted_speedup_thm38']:.2f}X | "
        f"{m['predicted_speedup_measured_verify']:.2f}X | {m['identical_fraction']:.2f} |"
    )


def results_table(metrics_files: Sequence[str | os.PathLike]) -> str:
    """Markdown table (Table 2 shape) of several runs' `metrics.json`, in the given order."""
    rows = [table_row(json.loads(pathlib.Path(f).read_text())) for f in metrics_files]
    return "\n".join([TABLE_HEADER, *rows])


def _write_outputs(out_dir, metrics, runs, gammas, gamma, examples, vocabulary, eos_id, config):
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float) + "\n")
    (out_dir / "table_row.md").write_text(TABLE_HEADER + "\n" + table_row(metrics) + "\n")
    if config:
        (out_dir / "operative_config.gin").write_text(config)
    with open(out_dir / "predictions.jsonl", "w") as f:
        base, spec = runs["baseline"], runs[gamma]
        for i, ex in enumerate(examples):
            st = {k: np.asarray(getattr(spec.stats[i], k)).tolist() for k in _STAT_KEYS}
            row = {
                "input": ex["inputs_pretokenized"],
                "reference": ex["targets_pretokenized"],
                "baseline": _decode_text(vocabulary, base.tokens[i], eos_id),
                "speculative": _decode_text(vocabulary, spec.tokens[i], eos_id),
                "identical": bool(np.array_equal(base.tokens[i], spec.tokens[i])),
                "baseline_s": base.seconds[i],
                "speculative_s": spec.seconds[i],
                "stats": st,
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    _plots(out_dir, metrics, gammas)


def _plots(out_dir, metrics, gammas):
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
    grid = np.arange(1, max(10, max(gammas)) + 1)
    alpha, c, v = metrics["alpha_beta"], metrics["c_measured"], metrics["verify_cost_ratio"]
    alpha = min(alpha, 1 - 1e-9)
    ax.plot(grid, [theory.walltime_improvement(alpha, int(g), c) for g in grid], label="Thm 3.8")
    e = [theory.expected_tokens_per_iteration(alpha, int(g)) for g in grid]
    ax.plot(
        grid,
        [x / (g * c + v) for x, g in zip(e, grid, strict=True)],
        "--",
        label="with measured verify cost",
    )
    sweep = metrics["gamma_sweep"]
    ax.plot([int(g) for g in sweep], [sweep[g]["speedup"] for g in sweep], "o", label="measured")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("γ")
    ax.set_ylabel("walltime speedup")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "speedup.png", dpi=120)
