"""The main job: baseline vs speculative decoding on a seqio task split, timed side by side.

`evaluate` decodes every example with the baseline (`decoding.temperature_sample`, the target
alone) and with `speculative.speculative_sample` (target + draft), same target weights, same
inputs, same sampling settings, and reports what the paper reports (Tables 2-4): γ, α (counted
and Corollary-3.6 β estimate), the cost coefficient c measured in the same run, tokens per
iteration, measured walltime speedup and the Theorem 3.8 prediction.

Timing rules (so ratios mean something):
* every jitted function is compiled and run once on the evaluation shapes before timing;
* baseline and speculative run interleaved example by example, in a seeded random order per
  example (`clock.call_order`: who goes first never correlates with the examples);
* each call ends with `jax.block_until_ready`; seconds are wall-clock (`time.perf_counter`);
* the whole prediction is timed for both (encoder pass + cache set-up + decode loop).

In argmax mode (temperature 0) the job checks itself (`eval_checks`): `identical_fraction` is the
share of examples whose speculative tokens equal the baseline's; each difference gets a near-tie
report (first differing position, the target's top-2 logit gap there). With bfloat16-stored CPU
weights (`CPU_WEIGHT_DTYPE='bfloat16'`) it also decodes the baseline with the float32 weights
(untimed) and reports every greedy token the rounding flipped (`weight_flips`: position, both
tokens, both logit gaps); that run keeps the float32 panels beside the bfloat16 ones (1.5 copies), the default float32
run holds one copy of each decoder projection.
"""

from __future__ import annotations

import collections
import operator
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import tqdm
from absl import logging as absl_logging

from specdec_t5x import (
    auto_gamma,
    cpu_kernel,
    models,
    multihost,
    provenance,
    sampling,
    steps,
)
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.eval import checks, summary, tables
from specdec_t5x.eval import diagnostics as diagnostics_lib
from specdec_t5x.timing import clock, loops


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


# ----------------------------------------------------------------------------------------------
# Step costs: c and the verify-call ratio, measured on the same positions.


def _pack_draft(draft, draft_params):
    """Draft parameters packed for the CPU kernel when the draft is a T5 network (else as given)."""
    pack = getattr(draft, "pack_params", None)
    return draft_params if pack is None else pack(draft_params)


# ----------------------------------------------------------------------------------------------
# The job.


def _speculative_fn(spec_model, decoder_params: dict[str, Any]):
    """Jitted `(target_params, draft_params, batch, rng) -> (tokens, aux)` at fixed settings."""

    def predict(target_params, draft_params, batch, rng):
        return spec_model.predict_batch_with_aux(
            target_params,
            batch,
            rng,
            decoder_params=decoder_params,
            draft_params=draft_params,
        )

    return jax.jit(predict)


def _add_auto_row(metrics, runs, choices, headline, quality_args) -> None:
    """Adds the auto-γ row as `metrics['auto']`; an auto headline also replaces the top level.

    The row (`auto_gamma.summarise_auto`) has the γ chosen per example (0 = off), the mean
    prediction of those choices, the measured speed, and the best fixed γ of the same run's sweep.
    """
    base, run = runs["baseline"], runs["auto"]
    row = auto_gamma.summarise_auto(
        base.seconds,
        run.seconds,
        run.stats,
        [g for g, _ in choices],
        [p for _, p in choices],
        identical=float(
            np.mean([np.array_equal(a, b) for a, b in zip(base.tokens, run.tokens, strict=True)])
        ),
    )
    sweep = metrics["gamma_sweep"]
    best = max(sweep, key=lambda g: sweep[g]["speedup"])
    row.update(
        best_fixed_gamma=int(best),
        best_fixed_speedup=sweep[best]["speedup"],
        auto_over_best_fixed=row["speedup"] / sweep[best]["speedup"],
        # Paired bootstrap over examples (5th, 95th percentiles): the run-to-run spread.
        speedup_interval=auto_gamma.bootstrap_interval(base.seconds, run.seconds),
        auto_over_best_fixed_interval=auto_gamma.bootstrap_interval(
            runs[int(best)].seconds, run.seconds
        ),
    )
    metrics["auto"] = row
    if headline:
        for key in sweep[best]:
            metrics.pop(key, None)  # the placeholder headline's fields
        metrics.update(row)
        predicted = row["predicted_speedup"]
        metrics["measured_over_predicted"] = row["speedup"] / predicted if predicted else None
        seqio_task, vocabulary, examples, eos_id = quality_args
        metrics["quality"]["speculative"] = metrics.quality(
            seqio_task, vocabulary, examples, run.tokens, eos_id
        )


class _RunCostCalls:
    """The extra calls `loops.run_costs` prices the run's steps from, and their timings.

    Per batch, beside the timed calls: the baseline and the speculative call at γ stopped after 2
    tokens, and the speculative call with `loops.ZeroCostDraft` in full and stopped after 2
    tokens. The full baseline and speculative calls are the run's own (`record`).
    """

    SHORT = 2  # max_decode_steps of the short calls

    def __init__(self, spec_model, baseline, settings, gamma: int):
        self.gamma, self.eos_id = gamma, spec_model.eos_id
        short = {**settings, "max_decode_steps": self.SHORT}
        free = models.SpeculativeEncoderDecoderModel(
            spec_model.module,
            loops.ZeroCostDraft(spec_model.module.config.vocab_size, spec_model.eos_id),
            spec_model.input_vocabulary,
            spec_model.output_vocabulary,
            cpu_weight_dtype=spec_model.cpu_weight_dtype,
        )
        base_short = jax.jit(
            lambda tp, b, rng: baseline.predict_batch_with_aux(tp, b, rng, decoder_params=short)[0]
        )
        spec_short = _speculative_fn(spec_model, {**short, "gamma": gamma})
        free_full = _speculative_fn(free, {**settings, "gamma": gamma})
        free_short = _speculative_fn(free, {**short, "gamma": gamma})
        self.fns = {
            "cost:baseline:short": lambda tp, dp, b, rng: base_short(tp, b, rng),
            "cost:speculative:short": spec_short,
            "cost:verify_only:full": lambda tp, dp, b, rng: free_full(tp, {}, b, rng),
            "cost:verify_only:short": lambda tp, dp, b, rng: free_short(tp, {}, b, rng),
        }
        self.seconds = collections.defaultdict(list)
        self.units = collections.defaultdict(list)

    def warm_up(self, target_params, draft_params, batch, rng) -> None:
        for fn in self.fns.values():
            jax.block_until_ready(fn(target_params, draft_params, batch, rng))

    def _units(self, tokens, stats) -> int:
        if stats is not None:  # speculative: the loop's iterations (its slowest row)
            return int(np.max(np.asarray(stats.num_iterations)))
        tokens = np.asarray(tokens)  # baseline: the longest row's tokens, EOS counted
        hit = tokens == self.eos_id
        lengths = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, (tokens != 0).sum(axis=1))
        return int(lengths.max())

    def time(self, key, target_params, draft_params, batch, rng, compiles) -> None:
        out, seconds = _timed(
            self.fns[key], target_params, draft_params, batch, rng, compiles=compiles
        )
        _, call, length = key.split(":")
        stats = out[1]["stats"] if isinstance(out, tuple) else None
        self.seconds[(call, length)].append(seconds)
        self.units[(call, length)].append(self._units(out, stats))

    def record(self, key, seconds: float, tokens, stats) -> None:
        call = "baseline" if key == "baseline" else "speculative"
        self.seconds[(call, "full")].append(seconds)
        self.units[(call, "full")].append(self._units(tokens, stats))

    def measured(self):
        return dict(self.seconds), dict(self.units)


class _CompileCounter:
    """Counts XLA compilations while active (the timed loop must cause none)."""

    def __init__(self):
        self.count, self.active = 0, False

    def __call__(self, event: str, duration_s: float, **kwargs) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def evaluate(
    spec_model: models.SpeculativeEncoderDecoderModel,
    target_params,
    task: str,
    output_dir: str,
    *,
    gamma: int,
    sampling_settings: sampling.SamplingSettings | None = None,
    temperature: float | None = None,
    topk: int | None = None,
    topp: float | None = None,
    split: str = "test",
    num_examples: int = 100,
    batch_size: int = 1,
    input_len: int = 64,
    target_len: int = 64,
    gammas: Sequence[int | str] | None = None,
    draft_name: str = "draft",
    draft_params=None,
    seed: int = 0,
    cost_repeats: int = 60,
    auto_gamma_max: int = 6,
    measure_time_budget: bool = True,
    measure_loop_costs: bool = True,
    command: str | None = None,
) -> dict[str, Any]:
    """Runs baseline and speculative decoding side by side and writes the results directory.

    Args:
      spec_model: target + draft (`models.SpeculativeEncoderDecoderModel`).
      target_params: target parameters, raw or packed (`steps.pack_params`; gin/runs/eval.gin
        packs as it loads, so the job holds one copy of each decoder projection).
      task: registered seqio task name (e.g. 'ddtp_ende', 'wmt_t2t_ende_v003').
      output_dir: where `metrics.json`, `predictions.jsonl`, `table_row.md` and the plot go
        (created; the entry point adds the operative gin config).
      gamma: γ of the headline row: an int >= 1, or 'auto' (`auto_gamma.AutoGammaDecoder`:
        γ in 0..auto_gamma_max chosen before each call from the measured cost curve and the
        running α; 0 = the baseline alone). An auto headline without fixed `gammas` sweeps
        1..auto_gamma_max too, so the best fixed γ in hindsight is in the same run.
      sampling_settings: the sampling settings, passed explicitly to both decoders (what
        `gin/runs/eval.gin` binds).
      temperature, topk, topp: the same as loose keywords (for existing callers); not together
        with `sampling_settings`. Unset ones default as in `sampling.SamplingSettings`.
      split: task split.
      num_examples: examples decoded (the first ones of the split, unshuffled).
      batch_size: examples per decode call (the paper: 1).
      input_len, target_len: encoder length (inputs padded to it) and max_decode_len.
      gammas: optional extra γ values for the speedup-vs-γ sweep (each timed the same way);
        'auto' adds an auto-γ row (`metrics['auto']`) beside the fixed ones.
      draft_name: label of the draft in tables.
      draft_params: draft parameters (default `spec_model.draft.params`).
      seed: sampling seed (example i uses `fold_in(PRNGKey(seed), i)` for both decoders).
      cost_repeats: repeats of the step-cost measurement (and of the auto row's cost curve).
      auto_gamma_max: largest γ the auto row considers.
      measure_time_budget: True (the default): measure where the time goes after the timed runs
        (`diagnostics_lib.eval_time_budget`: set-up, zero-cost loops at two lengths, in-loop
        diagnostics; about 8 extra small compiles) into `metrics['time_budget']` and
        `predicted_speedup_measured_costs`. False skips it (those two keys are then absent; the
        timed runs, step costs and every other metric are unchanged). Auto headlines never have it.
      measure_loop_costs: True (the default): c and verify/step as the run's own decode calls pay
        them (`loops.run_costs`: per batch, beside the timed calls, the baseline and the
        speculative call stopped after 2 tokens and the speculative call with a zero-cost draft,
        4 extra compiles); False: from the step
        timer's stand-alone loops alone (`step_timer.step_costs`), which price the verify call and
        the draft below what the decode loops pay (results/verify_cost/loop_interference.md).
      command: the command line written with the results (default: `sys.argv`).

    Returns:
      The metrics dict (also written to `metrics.json`).

    Raises:
      ValueError: bad γ / sampling settings, num_examples or batch_size < 1, both
        `sampling_settings` and loose keywords given, `measure_time_budget` not a bool, or an
        empty split.
    """
    if not isinstance(measure_loop_costs, bool):
        raise ValueError(
            f"measure_loop_costs takes True or False; got {measure_loop_costs!r} "
            f"({type(measure_loop_costs).__name__})."
        )
    if not isinstance(measure_time_budget, bool):
        raise ValueError(
            f"measure_time_budget takes True or False; got {measure_time_budget!r} "
            f"({type(measure_time_budget).__name__})."
        )
    loose = {"temperature": temperature, "topk": topk, "topp": topp}
    loose = {k: v for k, v in loose.items() if v is not None}
    if sampling_settings is not None and loose:
        raise ValueError(
            f"pass sampling_settings or loose sampling keywords, not both; got {sampling_settings} "
            f"and {loose}."
        )
    sampling_settings = sampling_settings or sampling.SamplingSettings(**loose)
    requested = [gamma, *(gammas or ())]
    bad = [
        g
        for g in requested
        if g != "auto" and (isinstance(g, bool) or not isinstance(g, int) or g < 1)
    ]
    if bad:
        raise ValueError(
            f"gamma and gammas (gin: GAMMA, GAMMAS) take ints >= 1 or 'auto'; got {bad}. "
            "The baseline runs in every eval anyway; 'auto' may also switch speculation off (γ 0)."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size (gin: BATCH_SIZE) must be an int >= 1; got {batch_size!r}.")
    # num_examples is checked by inputs_lib.load_examples (before the output folder is made).
    auto = "auto" in requested
    gammas = sorted({g for g in requested if g != "auto"})
    if gamma == "auto" and not gammas:
        gammas = list(range(1, auto_gamma_max + 1))  # the best fixed γ in hindsight, same run
    draft_params = spec_model.draft.params if draft_params is None else draft_params
    # Decoder projections packed for the CPU kernel once per parameter set (a no-op when it is
    # off, or already done: gin/runs/eval.gin packs as it loads, so no raw copy stays alive). The
    # packed trees serve the whole run, near-tie report included.
    target_params = models.pack_params(spec_model.module, target_params)  # float32 panels
    reference_params = None  # float32-weight target: what bfloat16 CPU weights flipped
    if spec_model.cpu_weight_dtype != "float32" and sampling_settings.greedy:
        if cpu_kernel.packed_weight_dtype(target_params) == "float32":
            reference_params = target_params
    target_params = spec_model.pack_params(target_params)  # CPU_WEIGHT_DTYPE (narrows panels)
    draft_params = _pack_draft(spec_model.draft, draft_params)
    vocabulary = spec_model.output_vocabulary
    examples, seqio_task = inputs_lib.load_examples(
        task, split, num_examples, input_len, target_len, vocabulary
    )
    out_dir = pathlib.Path(output_dir)  # made once the inputs load (a bad task leaves no folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos_id = spec_model.eos_id
    baseline = models.EncoderDecoderModel(
        spec_model.module, vocabulary, vocabulary, cpu_weight_dtype=spec_model.cpu_weight_dtype
    )
    settings = sampling_settings.decoder_params()

    base_fn = jax.jit(
        lambda tp, b, rng: baseline.predict_batch_with_aux(tp, b, rng, decoder_params=settings)[0]
    )
    spec_fns = {g: _speculative_fn(spec_model, {**settings, "gamma": g}) for g in gammas}
    costs_gamma = max(gammas) if gamma == "auto" else gamma  # the γ c and verify/step are at
    cost_calls = None
    if measure_loop_costs:
        cost_calls = _RunCostCalls(spec_model, baseline, settings, costs_gamma)
    auto_decoder = None
    if auto:
        auto_decoder = auto_gamma.AutoGammaDecoder(
            spec_model,
            target_params,
            draft_params,
            settings=settings,
            gamma_max=auto_gamma_max,
            cost_repeats=cost_repeats,
        )
    batches = inputs_lib.example_batches(examples, batch_size, input_len, target_len)

    # Compile and warm up every function on the evaluation shapes (excluded from timing).
    # With encoder length buckets, once per bucket: each branch's first run is slow.
    rng0 = jax.random.PRNGKey(seed)
    first = batches[0][1]
    for enc in steps.warmup_sources(target_params, first["encoder_input_tokens"]):
        warm = {**first, "encoder_input_tokens": enc}
        jax.block_until_ready(base_fn(target_params, warm, rng0))
        for fn in spec_fns.values():
            jax.block_until_ready(fn(target_params, draft_params, warm, rng0))
        if cost_calls is not None:
            cost_calls.warm_up(target_params, draft_params, warm, rng0)
    if auto_decoder is not None:  # measures the cost curve (untimed)
        auto_decoder.compile(auto_decoder.choose(batches[0][1])[0], batches[0][1])
    choices = []  # auto row: (γ chosen, its predicted speedup) per example

    keys = ["baseline", *gammas, *(["auto"] if auto else [])]
    runs = {key: summary.Run() for key in keys}
    keys += [] if cost_calls is None else list(cost_calls.fns)  # beside them, in the same order
    compiles = _CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(compiles)
    for i in tqdm.tqdm(
        multihost.local_batches(len(batches)),
        desc=f"{task} T={sampling_settings.temperature}",
        unit="batch",
    ):  # all batches with one process; batch i -> process i mod P with several
        n, batch = batches[i]
        rng = jax.random.fold_in(rng0, i)
        for key in clock.call_order(keys, i, seed):  # seeded random order per batch
            if cost_calls is not None and key in cost_calls.fns:
                cost_calls.time(key, target_params, draft_params, batch, rng, compiles)
                continue
            if key == "baseline":
                tokens, seconds = _timed(base_fn, target_params, batch, rng, compiles=compiles)
                stats = None
            elif key == "auto":
                g, predicted = auto_decoder.choose(batch)
                auto_decoder.compile(g, batch)  # untimed; a no-op once this γ is compiled
                (tokens, aux), seconds = _timed(
                    auto_decoder.decode, g, batch, rng, compiles=compiles
                )
                auto_decoder.update(aux)
                auto_decoder.observe(g, seconds, tokens, aux)  # measured vs modelled
                choices += [(g, predicted)] * n
                stats = jax.tree_util.tree_map(np.asarray, aux.get("stats"))
            else:
                (tokens, aux), seconds = _timed(
                    spec_fns[key],
                    target_params,
                    draft_params,
                    batch,
                    rng,
                    compiles=compiles,
                )
                stats = jax.tree_util.tree_map(np.asarray, aux["stats"])
            run, tokens = runs[key], np.asarray(tokens)
            if cost_calls is not None and key in ("baseline", costs_gamma):
                cost_calls.record(key, seconds, tokens, stats)
            for r in range(n):
                run.seconds.append(seconds / n)
                run.tokens.append(tokens[r])
                run.stats.append(
                    None if stats is None else jax.tree_util.tree_map(operator.itemgetter(r), stats)
                )

    extra = {"choices": choices} if choices else {}
    choices = multihost.gather_runs(runs, [n for n, _ in batches], batch_size, extra).get(
        "choices", choices
    )
    costs = loops.measure_step_costs(
        spec_model,
        target_params,
        draft_params,
        batches[0][1]["encoder_input_tokens"],
        target_len,
        costs_gamma,
        repeats=cost_repeats,
    )
    work = None  # the decode loops' own work (`loops.measure_loop_ms`), measured once
    if cost_calls is not None:  # c and verify/step from the run's own calls (`run_costs`)
        work = loops.measure_loop_ms(
            batch_size,
            spec_model.module.config.vocab_size,
            target_len,
            costs_gamma,
            {k: settings[k] for k in ("temperature", "topk", "topp") if k in settings},
            eos_id,
            cost_repeats,
        )
        try:
            costs = loops.run_costs(*cost_calls.measured(), costs_gamma, work, costs)
        except ValueError as err:  # every output within 2 tokens or one iteration
            absl_logging.warning("%s; c and verify/step from the decode loops instead.", err)
            costs = loops.loop_costs(
                spec_model,
                target_params,
                draft_params,
                [b["encoder_input_tokens"] for _, b in batches[:4]],
                target_len,
                costs_gamma,
                {k: settings[k] for k in ("temperature", "topk", "topp") if k in settings},
                costs,
                repeats=max(3, cost_repeats // 2),
            )
    headline = gammas[0] if gamma == "auto" else gamma
    metrics = summary.summarise(
        runs,
        gammas,
        headline,
        costs,
        examples,
        seqio_task,
        vocabulary,
        eos_id,
        settings,
        rows_per_call=[n for n, _ in batches],
    )
    if (
        gamma != "auto" and measure_time_budget
    ):  # where the time goes: component costs composed (`time_budget`)
        budget = diagnostics_lib.eval_time_budget(
            spec_model,
            target_params,
            draft_params,
            batches[0][1],
            metrics,
            runs,
            [n for n, _ in batches],
            gamma=gamma,
            settings=settings,
            repeats=cost_repeats,
            sources=[b["encoder_input_tokens"] for _, b in batches],
            loop=work,
        )
        metrics["time_budget"] = budget
        metrics["predicted_speedup_measured_costs"] = budget["predicted_speedup"]
    if auto:
        quality_args = (seqio_task, vocabulary, examples, eos_id)
        _add_auto_row(metrics, runs, choices, gamma == "auto", quality_args)
        # The calibrated cost curve auto chose from (ms; `cost_curve.CostCurve.to_dict`).
        metrics["auto"]["cost_curve"] = auto_decoder.controller.curve.to_dict()
        # Per call, in order: γ, why it was chosen, its prediction, wall ms, tokens, iterations.
        metrics["auto"]["calls"] = auto_decoder.controller.history
    inputs = inputs_lib.pad_rows([e["inputs"] for e in examples], input_len)
    near_ties = []
    if sampling_settings.greedy:
        near_ties = checks.near_ties(
            spec_model.module, target_params, inputs, runs["baseline"].tokens, runs[gamma].tokens
        )
    if reference_params is not None:
        metrics["weight_flips"] = checks.weight_flips(
            spec_model.module,
            settings,
            reference_params,
            target_params,
            batches,
            runs["baseline"].tokens,
            inputs,
            rng0,
        )
    metrics.update(
        task=task,
        split=split,
        num_examples=len(examples),
        batch_size=batch_size,
        gamma=gamma,
        **settings,
        draft=draft_name,
        input_len=input_len,
        max_decode_len=target_len,
        near_ties=near_ties,
        compilations_during_timing=compiles.count,
        cpu_weight_dtype=cpu_kernel.packed_weight_dtype(target_params),
        max_near_tie_gap=max((r["top2_logit_gap"] for r in near_ties), default=None),
    )
    metrics.update(provenance.record(command or " ".join(sys.argv)))
    metrics["hardware"] = provenance.hardware_description(metrics["hardware"])  # one line
    if jax.process_index() == 0:
        tables.write_eval_outputs(
            out_dir, metrics, runs, gammas, gamma, examples, vocabulary, eos_id
        )
    return metrics
