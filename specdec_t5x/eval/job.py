"""The main job: baseline vs speculative decoding on a seqio task split, timed side by side.

`evaluate` decodes every example with the baseline (`decoding.temperature_sample`, the target
alone) and with `speculative.speculative_sample` (target + draft), same target weights, same
inputs, same sampling settings, and reports what the paper reports (Tables 2-4): γ, α (counted
and Corollary-3.6 β estimate), the cost coefficient c measured in the same run, tokens per
iteration, measured walltime speedup and the Theorem 3.8 prediction. It runs in labelled phases
(inputs, output folder, parameters, compile, decode, costs, summary, write), each logged with
its time.

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

import contextlib
import logging
import operator
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import tqdm

from specdec_t5x import cpu_kernel, models, multihost, provenance, steps
from specdec_t5x import inputs as inputs_lib
from specdec_t5x import sampling as sampling_lib
from specdec_t5x.auto import auto_gamma, auto_trees
from specdec_t5x.eval import checks, config, costs, diagnostics, outputs, summary, tables
from specdec_t5x.timing import clock

logger = logging.getLogger(__name__)

# The baseline's draw (`decoding.SAMPLERS`): the speculative loop's own (one uniform per row,
# inverse CDF), so that a T > 0 speed-up is speculation alone; T5X's Gumbel draw is timed beside it
# ('baseline_t5x', `speedup_vs_t5x_sampler`). At T = 0 both are the argmax: one baseline.
BASELINE_SAMPLER = "inverse_cdf"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Logs `name` as it starts and its wall time as it ends (one line each)."""
    logger.info("%s ...", name)
    start = time.perf_counter()
    yield
    logger.info("%s: done in %.1f s", name, time.perf_counter() - start)


def _pack_draft(draft, draft_params):
    """Draft parameters packed for the CPU kernel when the draft is a T5 network (else as given)."""
    pack = getattr(draft, "pack_params", None)
    return draft_params if pack is None else pack(draft_params)


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
      sampling_settings: the sampling settings, passed explicitly to both decoders.
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
    costs_gamma = max(gammas) if gamma == "auto" else gamma  # the γ c and verify/step are at
    headline_key = "auto" if gamma == "auto" else gamma
    settings = sampling_settings.decoder_params()

    with phase("inputs"):  # before the output folder: a bad task leaves nothing behind
        examples, seqio_task, input_report = inputs_lib.load_examples(
            data.task, data.split, data.num_examples, data.input_len, data.target_len, vocabulary
        )
    run_config = {
        **config.as_dict(data, speculation, measure),
        **settings,
        "draft": type(spec_model.draft).__name__,
        "target_shapes": provenance.tree_shapes(target_params),
    }
    out = outputs.OutputDir(output_dir).open(run_config, overwrite=overwrite, resume=resume)
    try:
        with phase("parameters"):  # decoder projections packed once per parameter set
            target_params = models.pack_params(spec_model.module, target_params)  # float32
            reference_params = None  # float32-weight target: what bfloat16 CPU weights flipped
            if spec_model.cpu_weight_dtype != "float32" and sampling_settings.greedy:
                if cpu_kernel.packed_weight_dtype(target_params) == "float32":
                    reference_params = target_params
            target_params = spec_model.pack_params(target_params)  # CPU_WEIGHT_DTYPE
            draft_params = spec_model.draft.params if draft_params is None else draft_params
            draft_params = _pack_draft(spec_model.draft, draft_params)
        fns = _decoders(
            spec_model, target_params, draft_params, settings, speculation, measure, costs_gamma
        )
        batches = inputs_lib.example_batches(
            examples, data.batch_size, data.input_len, data.target_len
        )
        interrupts = outputs.Interrupts()
        with interrupts.watch():
            rng0 = jax.random.PRNGKey(measure.seed)
            first = batches[0][1]
            _warm_up(fns, first, rng0, interrupts)
            load_samples = [os.getloadavg()[0]]  # other work skews timings: start and end
            with phase(f"decode {len(examples)} examples in {len(batches)} batches"):
                desc = f"{data.task} T={sampling_settings.temperature}"
                runs, choices, compiles = _decode_all(
                    fns, batches, examples, headline_key, costs_gamma, measure.seed, out,
                    interrupts, vocabulary, eos_id, desc,
                )  # fmt: skip
            interrupts.check()
            with phase("costs: c and verify/step"):
                run_costs, work = costs.measure(
                    spec_model,
                    target_params,
                    draft_params,
                    batches,
                    data.target_len,
                    costs_gamma,
                    settings,
                    fns["cost_calls"],
                    measure.cost_repeats,
                    baseline_sampler=fns["baseline_model"].default_decoder_params["sampler"],
                )
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
            with phase("summary"):
                flat = summary.summarise(
                    runs,
                    gammas,
                    gammas[0] if gamma == "auto" else gamma,
                    run_costs,
                    examples,
                    seqio_task,
                    vocabulary,
                    eos_id,
                    settings,
                    rows_per_call=[n for n, _ in batches],
                )
                if speculation.trees:
                    flat["tree_sweep"] = summary.tree_rows(
                        runs, speculation.tree_rows, gammas[0] if gamma == "auto" else gamma
                    )
                if speculation.auto:
                    quality_args = (seqio_task, vocabulary, examples, eos_id)
                    summary.add_auto_row(flat, runs, choices, gamma == "auto", quality_args)
                    flat["auto"]["cost_curve"] = fns["auto"].controller.curve.to_dict()
                    flat["auto"]["calls"] = fns["auto"].controller.history
                    if fns["auto"].trees:  # AUTO_TREES: what each tree measured
                        flat["auto"]["tree_measured_speedup"] = fns["auto"].tree_speedups()
            if measure.diagnostics and gamma != "auto":
                with phase("diagnostics: where the time goes"):
                    budget = diagnostics.eval_time_budget(
                        spec_model, target_params, draft_params, first, flat, runs,
                        [n for n, _ in batches], gamma=gamma, settings=settings,
                        repeats=measure.cost_repeats, loop=work,
                        sources=[b["encoder_input_tokens"] for _, b in batches],
                    )  # fmt: skip
                    flat["diagnostics"] = {"time_budget": budget}
                    flat["predicted_speedup_measured_costs"] = budget["predicted_speedup"]
            with phase("exactness checks"):
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
            baseline_sampler=fns["baseline_model"].default_decoder_params["sampler"],
            cpu_weight_dtype=cpu_kernel.packed_weight_dtype(target_params),
        )
        flat.update(provenance.record(command or " ".join(sys.argv)))
        flat["hardware"] = provenance.hardware_description(flat["hardware"])  # one line
        if out.restored:
            flat["resumed"] = {"batches_restored": len(out.restored), "batches": len(batches)}
        result = summary.group(flat)
        if jax.process_index() == 0:
            with phase("write outputs"):
                tables.write_eval_outputs(
                    out.path, result, runs, gammas, headline_key, examples, vocabulary, eos_id
                )
        return result
    finally:
        out.close()


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


def _decoders(spec_model, target_params, draft_params, settings, speculation, measure, costs_gamma):
    """The run's jitted decoders: {'base_fn', 'spec_fns' {γ: fn}, 'cost_calls' (or None),
    'auto' (an `auto_gamma.AutoGammaDecoder` or None), 'tp', 'dp' (the packed parameters)}."""
    fns = {"tp": target_params, "dp": draft_params, "auto": None}
    baselines = {"baseline": "t5x"}  # T = 0: both draws are the argmax (T5X's path, bit for bit)
    if not sampling_lib.is_greedy(settings["temperature"]):
        baselines = {"baseline": BASELINE_SAMPLER, "baseline_t5x": "t5x"}  # T5X's beside it
    for key, sampler in baselines.items():
        model = models.EncoderDecoderModel(
            spec_model.module,
            spec_model.output_vocabulary,
            spec_model.output_vocabulary,
            cpu_weight_dtype=spec_model.cpu_weight_dtype,
            sampler=sampler,
        )
        fns[key] = jax.jit(
            lambda tp, b, rng, m=model: m.predict_batch_with_aux(
                tp, b, rng, decoder_params=settings
            )[0]
        )
        fns[f"{key}_model"] = model
    baseline = fns["baseline_model"]
    fns["spec_fns"] = {
        g: costs.speculative_fn(spec_model, {**settings, "gamma": g})
        for g in speculation.fixed_gammas
    }
    for name, shape in speculation.tree_rows.items():  # one target call per tree per iteration
        params = {**settings, "tree": shape, "tree_rule": speculation.tree_rule}
        fns["spec_fns"][name] = costs.speculative_fn(spec_model, params)
    fns["cost_calls"] = (
        costs.RunCostCalls(spec_model, baseline, settings, costs_gamma)
        if measure.loop_costs
        else None
    )
    if speculation.auto:
        fns["auto"] = auto_gamma.AutoGammaDecoder(
            spec_model,
            target_params,
            draft_params,
            settings=settings,
            gamma_max=speculation.auto_gamma_max,
            cost_repeats=measure.cost_repeats,
            baseline_sampler=fns["baseline_model"].default_decoder_params["sampler"],
            trees=speculation.trees if speculation.auto_trees else (),
            tree_rule=speculation.tree_rule,
        )
    return fns


def _warm_up(fns, first, rng0, interrupts) -> None:
    """Compiles and runs once every decoder on the evaluation shapes (excluded from timing); with
    encoder length buckets once per bucket. Auto γ measures its cost curve here."""
    tp, dp = fns["tp"], fns["dp"]
    baselines = [key for key in ("baseline", "baseline_t5x") if key in fns]
    with phase(f"compile and warm up {len(baselines) + len(fns['spec_fns'])} decoders"):
        for enc in steps.warmup_sources(tp, first["encoder_input_tokens"]):
            warm = {**first, "encoder_input_tokens": enc}
            for key in baselines:
                logger.info("compiling %s (encoder length %d)", key, enc.shape[1])
                jax.block_until_ready(fns[key](tp, warm, rng0))
                interrupts.check()
            for g, fn in fns["spec_fns"].items():
                logger.info("compiling γ = %s (encoder length %d)", g, enc.shape[1])
                jax.block_until_ready(fn(tp, dp, warm, rng0))
                interrupts.check()
            if fns["cost_calls"] is not None:
                fns["cost_calls"].warm_up(tp, dp, warm, rng0)
    if fns["auto"] is not None:
        with phase("auto γ: cost curve and calibration"):
            fns["auto"].compile(fns["auto"].choose(first)[0], first)
    interrupts.check()


def _decode_all(
    fns,
    batches,
    examples,
    headline_key,
    costs_gamma,
    seed,
    out,
    interrupts,
    vocabulary,
    eos_id,
    desc,
):
    """The timed loop: every batch decoded by every row, interleaved, in a seeded random order.

    Batches finished by an interrupted run (`out.restored`) are restored, not decoded again; every
    finished batch is appended to `records.jsonl` and `predictions.jsonl` at once.

    Returns:
      ({'baseline' | γ | 'auto': summary.Run}, auto's [(γ, predicted)] per example, compilations
      during the timed calls (must be 0)).
    """
    tp, dp, cost_calls, auto = fns["tp"], fns["dp"], fns["cost_calls"], fns["auto"]
    keys = ["baseline", *(["baseline_t5x"] if "baseline_t5x" in fns else [])]
    keys += [*fns["spec_fns"], *(["auto"] if auto is not None else [])]
    runs = {key: summary.Run() for key in keys}
    keys += [] if cost_calls is None else list(cost_calls.fns)  # beside them, same order
    choices = []  # auto row: (γ chosen, its predicted speedup) per example
    compiles = costs.CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(compiles)
    rng0 = jax.random.PRNGKey(seed)
    local = multihost.local_batches(len(batches))  # all batches with one process
    report_every = max(1, len(local) // 10)
    starts = np.cumsum([0] + [n for n, _ in batches])
    for done, i in enumerate(tqdm.tqdm(local, desc=desc, unit="batch"), start=1):
        n, batch = batches[i]
        rng = jax.random.fold_in(rng0, i)
        record = out.restored.get(i)
        if record is None:
            record = {"batch": i, "runs": {}, "costs": []}
            for key in clock.call_order(keys, i, seed):  # seeded random order per batch
                interrupts.check()
                if cost_calls is not None and key in cost_calls.fns:
                    record["costs"].append(cost_calls.time(key, tp, dp, batch, rng, compiles))
                    continue
                tokens, seconds, stats, chose = _decode_one(fns, key, batch, rng, compiles)
                if chose is not None:
                    record["choices"] = [chose] * n
                if cost_calls is not None and key in ("baseline", costs_gamma):
                    record["costs"].append(cost_calls.record(key, seconds, tokens, stats))
                record["runs"][str(key)] = {
                    "seconds": seconds,
                    "tokens": np.asarray(tokens)[:n].tolist(),
                    "stats": outputs.encode_stats(stats),
                }
        elif cost_calls is not None:  # restored: its timings count as they were measured
            for call, length, seconds, units in record["costs"]:
                cost_calls.add(call, length, seconds, units)
        choices += [tuple(c) for c in record.get("choices", [])]
        per_row = {}
        for key in runs:
            entry = record["runs"][str(key)]
            stats = outputs.decode_stats(entry["stats"])
            per_row[key] = [
                None if stats is None else jax.tree_util.tree_map(operator.itemgetter(r), stats)
                for r in range(n)
            ]
            for r in range(n):
                runs[key].seconds.append(entry["seconds"] / n)
                runs[key].tokens.append(np.asarray(entry["tokens"][r], np.int32))
                runs[key].stats.append(per_row[key][r])
        if i not in out.restored:
            base, head = record["runs"]["baseline"], record["runs"][str(headline_key)]
            rows = [
                tables.prediction_row(
                    examples[int(starts[i]) + r],
                    (base["tokens"][r], head["tokens"][r]),
                    (base["seconds"] / n, head["seconds"] / n),
                    per_row[headline_key][r],
                    vocabulary,
                    eos_id,
                )
                for r in range(n)
            ]
            out.append_batch(record, rows)
        if done % report_every == 0 or done == len(local):
            logger.info("decoded %d/%d batches (%d%%)", done, len(local), 100 * done // len(local))
    extra = {"choices": choices} if choices else {}
    choices = multihost.gather_runs(
        runs, [n for n, _ in batches], len(batches[0][1]["encoder_input_tokens"]), extra
    ).get("choices", choices)
    return runs, choices, compiles.count


def _decode_one(fns, key, batch, rng, compiles):
    """(tokens int32 [batch, len], seconds, stats or None, auto's (γ, predicted) or None)."""
    tp, dp = fns["tp"], fns["dp"]
    if key in ("baseline", "baseline_t5x"):
        tokens, seconds = costs.timed(fns[key], tp, batch, rng, compiles=compiles)
        return np.asarray(tokens), seconds, None, None
    if key == "auto":
        auto = fns["auto"]
        g, predicted = auto.choose(batch)
        auto.compile(g, batch)  # untimed; a no-op once this γ is compiled
        (tokens, aux), seconds = costs.timed(auto.decode, g, batch, rng, compiles=compiles)
        auto.update(aux)
        auto.observe(g, seconds, tokens, aux)  # measured vs modelled
        stats = aux.get("stats")
        stats = None if stats is None else jax.tree_util.tree_map(np.asarray, stats)
        plan = g if isinstance(g, int) else auto_trees.plan_name(g)  # 'tree(2,2)'
        return np.asarray(tokens), seconds, stats, (plan, predicted)
    (tokens, aux), seconds = costs.timed(
        fns["spec_fns"][key], tp, dp, batch, rng, compiles=compiles
    )
    return np.asarray(tokens), seconds, jax.tree_util.tree_map(np.asarray, aux["stats"]), None
