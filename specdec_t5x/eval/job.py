"""The main job: baseline vs speculative decoding on a seqio task split, timed side by side.

`evaluate` decodes every example with the baseline (`decoding.temperature_sample`, the target
alone) and with `speculative.speculative_sample` (target + draft), same target weights, same
inputs, same sampling settings, and reports what the paper reports (Tables 2-4): γ, α (counted
and Corollary-3.6 β estimate), the cost coefficient c measured in the same run, tokens per
iteration, measured walltime speedup and the Theorem 3.8 prediction. It runs in labelled phases
(inputs, parameters, compile, decode, costs, report), each logged with its time (a heartbeat line
every `progress.HEARTBEAT_S` while it runs; the decode loop's progress with its ETA; the seconds in
`metrics.json`, `provenance.phases_s`), over a list of rows (`eval.rows.Row`, built by the row
factory `eval.lineup.build`): the baseline(s), one chain per fixed γ, one row per token tree and
auto γ's row (`specdec_t5x.auto.row`).

The costs phase prices c and verify/step with the step timer alone (one cheap probe: a few small
compiles of single decoder steps); the real decode loops (`timing.loops.loop_costs`) run only with
`MeasureConfig.diagnostics` (and `loop_costs`).

Timing rules (so ratios mean something):
* every jitted function is compiled and run once on the evaluation shapes before timing;
* baseline and speculative run interleaved batch by batch, in a seeded random order per batch
  (`timing.clock.call_order`: who goes first never correlates with the examples);
* each call ends with `jax.block_until_ready`; seconds are wall-clock (`time.perf_counter`);
* the whole prediction is timed for both (encoder pass + cache set-up + decode loop).

In argmax mode (temperature 0) the job checks itself (`eval.checks`): `identical_fraction` is the
share of examples whose speculative tokens equal the baseline's; each difference gets a near-tie
report (first differing position, the target's top-2 logit gap there). With bfloat16-stored CPU
weights (`CPU_WEIGHT_DTYPE='bfloat16'`) it also decodes the baseline with the float32 weights
(untimed) and reports every greedy token the rounding flipped (`weight_flips`).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import sys
import time
from collections.abc import Hashable
from typing import Any

import jax
import numpy as np
import tqdm

from specdec_t5x import cpu_kernel, models, multihost, provenance
from specdec_t5x import inputs as inputs_lib
from specdec_t5x import sampling as sampling_lib
from specdec_t5x.eval import checks, config, lineup, outputs, progress, summary, tables
from specdec_t5x.eval import rows as rows_lib
from specdec_t5x.eval.progress import phase

logger = logging.getLogger(__name__)

BASELINE_SAMPLER = rows_lib.BASELINE_SAMPLER  # the fair baseline's draw at T > 0


@dataclasses.dataclass
class ReportContext:
    """What a row's `report` may read: the headline row's key, auto's (plan, predicted) per
    example, and the quality inputs (seqio task, vocabulary, examples, eos id)."""

    headline: Hashable
    choices: list
    quality: tuple


def evaluate(
    spec_model: models.SpeculativeEncoderDecoderModel,
    target_params,
    output_dir: str,
    *,
    data: config.DataConfig,
    speculation: config.SpeculationConfig,
    sampling_settings: sampling_lib.SamplingSettings,
    measure: config.MeasureConfig | None = None,
    draft_params=None,
    command: str | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Runs baseline and speculative decoding side by side and writes the results folder.

    Args:
      spec_model: target + draft (`models.SpeculativeEncoderDecoderModel`).
      target_params: target parameters, raw or packed (`steps.pack_params`; gin/runs/eval.gin
        packs as it loads, so the job holds one copy of each decoder projection).
      output_dir: where `metrics.json`, `predictions.jsonl` (grown as examples finish),
        `records.jsonl` (what `resume` restores), `table_row.md` and `speedup.png` go.
      data: what to decode (`config.DataConfig`: task, split, num_examples, batch size, lengths).
      speculation: γ, the sweep and auto (`config.SpeculationConfig`).
      sampling_settings: the sampling settings, passed explicitly to every row.
      measure: seed, cost repeats, loop costs, diagnostics (`config.MeasureConfig`).
      draft_params: draft parameters (default `spec_model.draft.params`).
      command: the command line written with the results (default: `sys.argv`).
      overwrite: replace the outputs of another run in `output_dir`.
      resume: continue the interrupted run in `output_dir` (same configuration; not with auto γ,
        whose controller's state is not restorable).

    Returns:
      The metrics dict (also written to `metrics.json`): ≤ 25 top-level keys grouped as
      `summary.GROUPS` (task, decoding, speed, acceptance, costs, predictions, exactness,
      quality, gamma_sweep, auto, diagnostics, provenance); `summary.flat` gives the flat view.

    Raises:
      ValueError: bad settings (named), an unknown task or empty split, a used output folder
        (without `overwrite` / `resume`), a resume of auto γ or of another configuration.
      KeyboardInterrupt: on SIGINT, after the call in progress, with the finished batches on
        disk (`resume` continues them).
    """
    measure = measure or config.MeasureConfig()
    if not isinstance(sampling_settings, sampling_lib.SamplingSettings):
        raise ValueError(
            f"sampling_settings must be a SamplingSettings; got {sampling_settings!r}."
        )
    if resume and (speculation.auto or jax.process_count() > 1):
        raise ValueError(
            "--resume cannot restore auto γ's controller (its choices depend on every call "
            "before) nor a multi-process run: run it again with --overwrite."
        )
    vocabulary, eos_id = spec_model.output_vocabulary, spec_model.eos_id
    gammas, gamma = speculation.fixed_gammas, speculation.gamma
    # The γ c and verify/step are at (auto: its largest, as with the sweep 1..auto_gamma_max).
    costs_gamma = max(gammas, default=speculation.auto_gamma_max) if gamma == "auto" else gamma
    headline_key = "auto" if gamma == "auto" else gamma
    # The fixed γ summarised at the top level until an auto headline's row replaces it.
    placeholder = (gammas[0] if gammas else None) if gamma == "auto" else gamma
    settings = sampling_settings.decoder_params()

    phases: dict[str, float] = {}  # wall seconds per phase -> provenance.phases_s
    with phase("inputs", phases):  # before the output folder: a bad task leaves nothing behind
        examples, seqio_task, input_report = inputs_lib.load_examples(
            data.task, data.split, data.num_examples, data.input_len, data.target_len, vocabulary
        )
        batches = inputs_lib.example_batches(
            examples, data.batch_size, data.input_len, data.target_len
        )
    run_config = {
        **config.as_dict(data, speculation, measure),
        **settings,
        "draft": type(spec_model.draft).__name__,
        "target_shapes": provenance.tree_shapes(target_params),
    }
    out = outputs.OutputDir(output_dir).open(run_config, overwrite=overwrite, resume=resume)
    try:
        with phase("parameters", phases):  # decoder projections packed once per parameter set
            target_params, draft_params, reference_params = _parameters(
                spec_model, target_params, draft_params, sampling_settings
            )
            rows = lineup.build(
                spec_model, target_params, draft_params, sampling_settings, speculation, measure
            )
            baseline_sampler = rows[0].sampler
            for row in rows:  # a short run starts auto γ without calibration rounds
                if row.key == "auto":
                    row.decoder.expected_calls = len(batches)
        interrupts = outputs.Interrupts()
        with interrupts.watch():
            rng0 = jax.random.PRNGKey(measure.seed)
            first = batches[0][1]
            with phase(f"compile and warm up {len(rows)} rows", phases, "compile"):
                _compile(rows, first, rng0, interrupts)
            load_samples = [os.getloadavg()[0]]  # other work skews timings: start and end
            with phase(
                f"decode {len(examples)} examples in {len(batches)} batches", phases, "decode"
            ):
                desc = f"{data.task} T={sampling_settings.temperature}"
                runs, choices, compiles = _decode_all(
                    rows, batches, examples, headline_key, measure.seed, out, interrupts, (vocabulary, eos_id), desc,
                )  # fmt: skip
            interrupts.check()
            with phase("costs: c and verify/step", phases, "costs"):
                step_costs = lineup.measure_costs(
                    spec_model, target_params, draft_params, batches,
                    target_len=data.target_len, gamma=costs_gamma, settings=settings,
                    in_loop=measure.loop_costs and measure.diagnostics,
                    repeats=measure.cost_repeats, baseline_sampler=baseline_sampler,
                    budget_s=measure.cost_seconds or None,
                )  # fmt: skip
            step_costs["gamma"] = costs_gamma  # the γ its c and verify/step are at
            interrupts.check()
            load_samples.append(os.getloadavg()[0])
            busy = provenance.busy_machine(load_samples)
            if busy["busy"]:
                logger.warning(
                    "busy machine: load average %.1f on %d cores while timing: other work shared "
                    "the CPU, so the speed-up and c may not hold on a quiet machine.",
                    busy["load"],
                    busy["cores"],
                )
            rows_per_call = [n for n, _ in batches]
            with phase("report: summary", phases, "report_summary"):
                flat = summary.summarise(
                    runs, gammas, gamma=placeholder, costs=step_costs, examples=examples,
                    seqio_task=seqio_task, vocabulary=vocabulary, eos_id=eos_id,
                    settings=settings, rows_per_call=rows_per_call,
                )  # fmt: skip
                if speculation.trees:
                    flat["tree_sweep"] = summary.tree_rows(runs, speculation.tree_rows, placeholder)
                context = ReportContext(
                    headline_key, choices, (seqio_task, vocabulary, examples, eos_id)
                )
                for row in rows:
                    row.report(flat, runs, context)
            with phase("report: exactness checks", phases, "report_exactness"):
                flat.update(
                    _exactness(
                        spec_model, target_params, reference_params, runs, headline_key,
                        examples, data.input_len, batches, settings, rng0,
                    )
                )  # fmt: skip
        flat.update(
            task=data.task,
            split=data.split,
            num_examples=len(examples),
            batch_size=data.batch_size,
            gamma=gamma,
            **settings,
            draft=speculation.draft_name,
            input_len=data.input_len,
            max_decode_len=data.target_len,
            inputs=input_report,
            compilations_during_timing=compiles,
            busy_machine=busy,
            baseline_sampler=baseline_sampler,
            cpu_weight_dtype=cpu_kernel.packed_weight_dtype(target_params),
        )
        flat.update(provenance.record(command or " ".join(sys.argv)))
        flat["hardware"] = provenance.hardware_description(flat["hardware"])  # one line
        if out.restored:
            flat["resumed"] = {"batches_restored": len(out.restored), "batches": len(batches)}
        flat["phases_s"] = dict(phases)  # every phase before the outputs are written
        result = summary.group(flat)
        if jax.process_index() == 0:
            with phase("report: write outputs"):
                if jax.process_count() > 1:  # every process's examples, gathered
                    out.append_predictions(
                        _all_predictions(runs, headline_key, examples, vocabulary, eos_id)
                    )
                tables.write_eval_outputs(
                    out.path, result, runs, gammas, headline_key, examples, vocabulary, eos_id
                )
        return result
    finally:
        out.close()


def _parameters(spec_model, target_params, draft_params, sampling_settings):
    """(target, draft, float32 reference or None) parameters, each packed once for the CPU kernel
    (no-op when off or packed); the reference is the float32-weight target that bfloat16 CPU
    weights are checked against (greedy only)."""
    target_params = models.pack_params(spec_model.module, target_params)  # float32
    reference_params = None
    if spec_model.cpu_weight_dtype != "float32" and sampling_settings.greedy:
        if cpu_kernel.packed_weight_dtype(target_params) == "float32":
            reference_params = target_params
    target_params = spec_model.pack_params(target_params)  # CPU_WEIGHT_DTYPE
    draft = spec_model.draft
    draft_params = draft.params if draft_params is None else draft_params
    pack = getattr(draft, "pack_params", None)  # a T5 network draft
    return target_params, (draft_params if pack is None else pack(draft_params)), reference_params


def _exactness(
    spec_model,
    target_params,
    reference_params,
    runs,
    headline_key,
    examples,
    input_len,
    batches,
    settings,
    rng0,
) -> dict[str, Any]:
    """{'near_ties', 'max_near_tie_gap'} in argmax mode (`checks.near_ties`: each example whose
    speculative tokens differ from the baseline's, with the target's top-2 logit gap there), and
    'weight_flips' with bfloat16 CPU weights (`checks.weight_flips`)."""  # fmt: skip
    pad = inputs_lib.pad_rows([e["inputs"] for e in examples], input_len)
    near_ties = []
    if sampling_lib.is_greedy(settings["temperature"]):
        near_ties = checks.near_ties(
            spec_model.module,
            target_params,
            pad,
            runs["baseline"].tokens,
            runs[headline_key].tokens,
        )
    out = {
        "near_ties": near_ties,
        "max_near_tie_gap": max((r["top2_logit_gap"] for r in near_ties), default=None),
    }
    if reference_params is not None:
        out["weight_flips"] = checks.weight_flips(
            spec_model.module,
            settings,
            reference_params,
            target_params,
            batches,
            runs["baseline"].tokens,
            pad,
            rng0,
        )
    return out


def _compile(rows, first, rng0, interrupts) -> None:
    """Compiles and runs once every row on the evaluation shapes (excluded from timing); with
    encoder length buckets once per bucket. Auto γ measures its cost curve here."""
    for row in rows:
        row.compile(first, rng0)
        interrupts.check()


def _decode_all(
    rows, batches, examples, headline_key, seed, out, interrupts, texts, desc,
):  # fmt: skip
    """The timed loop: every batch decoded by every row, interleaved, in a seeded random order.

    Batches finished by an interrupted run (`out.restored`) are restored, not decoded again; every
    finished batch is appended to `records.jsonl` and `predictions.jsonl` at once. Statistics stay
    NumPy arrays; only the records written are JSON.

    Returns:
      ({'baseline' | γ | tree | 'auto': summary.Run}, auto's [(γ, predicted)] per example,
      compilations during the timed calls (must be 0)).
    """
    by_key = {row.key: row for row in rows}
    runs = {row.key: summary.Run() for row in rows}
    names = list(by_key)
    choices = []  # auto row: (γ chosen, its predicted speedup) per example
    compiles = rows_lib.CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(compiles)
    rng0 = jax.random.PRNGKey(seed)
    local = multihost.local_batches(len(batches))  # all batches with one process
    report_every = max(1, len(local) // 10)
    starts = np.cumsum([0] + [n for n, _ in batches]).tolist()
    t0 = time.perf_counter()
    next_log = t0 + progress.HEARTBEAT_S  # a progress line at least this often, besides every 10%
    for done, i in enumerate(tqdm.tqdm(local, desc=desc, unit="batch"), start=1):
        n, batch = batches[i]
        rng = jax.random.fold_in(rng0, i)
        record = out.restored.get(i)
        if record is None:
            results, chose = {}, None
            for name in lineup.call_order(names, i, seed):  # seeded random order per batch
                interrupts.check()
                tokens, seconds, stats, choice = _decode_one(by_key[name], batch, rng, compiles)
                chose = chose if choice is None else choice
                results[name] = (seconds, tokens[:n], stats)
            batch_choices = [] if chose is None else [tuple(chose)] * n
        else:
            results = {
                key: (
                    entry["seconds"],
                    np.asarray(entry["tokens"], np.int32),
                    outputs.decode_stats(entry["stats"]),
                )
                for key, entry in ((key, record["runs"][str(key)]) for key in runs)
            }
            batch_choices = [tuple(c) for c in record.get("choices", [])]
        choices += batch_choices
        per_row = {}
        for key, (seconds, tokens, stats) in results.items():
            per_row[key] = [
                None if stats is None else jax.tree_util.tree_map(operator.itemgetter(r), stats)
                for r in range(n)
            ]
            runs[key].seconds += [seconds / n] * n
            runs[key].tokens += [np.asarray(tokens[r], np.int32) for r in range(n)]
            runs[key].stats += per_row[key]
        if record is None:  # one process: its lines as the batch finishes; else all at the end
            lines = []
            if jax.process_count() == 1:
                lines = _predictions(
                    results, per_row, headline_key, examples[starts[i] :], n, texts
                )
            out.append_batch(_record(i, results, batch_choices), lines)
        if done % report_every == 0 or done == len(local) or time.perf_counter() >= next_log:
            next_log = time.perf_counter() + progress.HEARTBEAT_S
            progress.log_progress(
                done, len(local), starts[i] + n, len(examples), time.perf_counter() - t0
            )
    extra = {"choices": choices} if choices else {}
    choices = multihost.gather_runs(
        runs, [n for n, _ in batches], len(batches[0][1]["encoder_input_tokens"]), extra
    ).get("choices", choices)
    return runs, choices, compiles.count


def _decode_one(row, batch, rng, compiles):
    """One timed call of a row: (tokens int32 [batch, len], seconds, stats or None, the row's
    choice to record or None), NumPy."""
    row.prepare(batch)  # untimed (auto γ: choose and compile its plan)
    (tokens, stats), seconds = rows_lib.timed(row.decode, batch, rng, compiles=compiles)
    tokens, stats = rows_lib.host(tokens, stats)
    return tokens, seconds, stats, row.observe(seconds, tokens, stats)


def _record(i, results, choices) -> dict[str, Any]:
    """A finished batch as its `records.jsonl` line (what `resume` restores)."""
    record = {
        "batch": i,
        "runs": {
            str(key): {
                "seconds": seconds,
                "tokens": tokens.tolist(),
                "stats": outputs.encode_stats(stats),
            }
            for key, (seconds, tokens, stats) in results.items()
        },
    }
    if choices:
        record["choices"] = [list(c) for c in choices]
    return record


def _all_predictions(runs, headline_key, examples, vocabulary, eos_id) -> list[dict[str, Any]]:
    """Every example's `predictions.jsonl` line, from the gathered runs (several processes)."""
    base, head = runs["baseline"], runs[headline_key]
    return [
        tables.prediction_row(
            ex,
            (base.tokens[i], head.tokens[i]),
            (base.seconds[i], head.seconds[i]),
            head.stats[i],
            vocabulary,
            eos_id,
        )  # fmt: skip
        for i, ex in enumerate(examples)
    ]


def _predictions(results, per_row, headline_key, examples, n, texts) -> list[dict[str, Any]]:
    """A finished batch's `predictions.jsonl` lines (baseline beside the headline row)."""
    (base_s, base, _), (head_s, head, _) = results["baseline"], results[headline_key]
    return [
        tables.prediction_row(
            examples[r],
            (base[r], head[r]),
            (base_s / n, head_s / n),
            per_row[headline_key][r],
            *texts,
        )  # fmt: skip
        for r in range(n)
    ]
