"""The main job end to end on the tiny random pair, and the gin experiment files."""

import inspect
import json
import pathlib
import re

import gin
import jax
import jax.numpy as jnp
import pytest
from conftest import init_params, perturbed, tiny_config, tiny_spec_pair

from specdec_t5x import cpu_kernel, gin_utils, models, network, sampling, speculative, vocab
from specdec_t5x import inputs as inputs_lib
from specdec_t5x import metrics as metrics_lib
from specdec_t5x.eval import checks, config, job, summary, tables
from specdec_t5x.timing import step_timer

REQUIRED_KEYS = (
    "task split num_examples gamma temperature topk topp draft speedup alpha_counted alpha_beta "
    "c_measured verify_cost_ratio tokens_per_iteration predicted_speedup_thm38 identical_fraction "
    "baseline_tokens_per_s speculative_tokens_per_s quality hardware commit command "
    "predicted_speedup_measured_verify predicted_speedup_output_lengths "
    "inputs switches"
).split()


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_spec_pair()


def _cells(line):
    """The cells of one markdown table line."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def configs(
    *,
    gamma,
    gammas=None,
    task="ddtp_ende",
    num_examples=100,
    batch_size=1,
    input_len=32,
    target_len=12,
    temperature=1.0,
    topk=0,
    topp=0.0,
    seed=0,
    cost_repeats=60,
    loop_costs=True,
    diagnostics=False,
    auto_gamma_max=6,
    draft_name="draft",
    trees=None,
    tree_rule="without_replacement",
):
    """`job.evaluate`'s config objects from one flat set of keywords (the tests' shorthand)."""
    return {
        "data": config.DataConfig(task, "test", num_examples, batch_size, input_len, target_len),
        "speculation": config.SpeculationConfig(
            gamma, gammas, auto_gamma_max, draft_name, trees, tree_rule
        ),
        "sampling_settings": sampling.SamplingSettings(temperature, topk, topp),
        "measure": config.MeasureConfig(seed, cost_repeats, loop_costs, diagnostics),
    }


def _evaluate_tiny(tiny_pair, out, *, overwrite=False, resume=False, **kwargs):
    """`job.evaluate` of the tiny pair on DDTP En-De, inputs 32 and outputs 12 tokens long; the
    flat view of its metrics (`summary.flat`)."""
    spec_model, params = tiny_pair
    metrics = job.evaluate(
        spec_model, params, str(out), overwrite=overwrite, resume=resume, **configs(**kwargs)
    )
    return summary.flat(metrics)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eval_end_to_end_writes_complete_results(tiny_pair, data_dir, tmp_path, temperature):
    out = tmp_path / "out"
    metrics = _evaluate_tiny(
        tiny_pair,
        out,
        gamma=3,
        gammas=[1],
        temperature=temperature,
        num_examples=3,
        cost_repeats=3,
        draft_name="perturbed-tiny",
        diagnostics=True,
    )
    grouped = json.loads((out / "metrics.json").read_text())
    assert len(grouped) <= 25 and {"speed", "acceptance", "costs", "provenance"} <= set(grouped)
    written = summary.flat(grouped)
    for key in REQUIRED_KEYS:
        assert key in written, key
    assert written["num_examples"] == 3
    # Which CPU and kernel path produced the timings (never merged across paths).
    assert {"family", "model", "simd", "kernel_path"} <= set(grouped["provenance"]["cpu"])
    assert grouped["provenance"]["cpu"]["kernel_path"] == cpu_kernel.kernel_path()
    assert "kernel path" in written["hardware"]
    assert set(written["quality"]) == {"baseline", "speculative"}
    assert "bleu" in written["quality"]["baseline"]
    assert written["compilations_during_timing"] == 0  # timing excludes compilation
    assert set(written["gamma_sweep"]) == {"1", "3"}
    assert written["tokens_per_iteration"] > 1.0  # fewer target calls than tokens
    if temperature == 0.0:
        assert metrics["identical_fraction"] == 1.0 or all(
            r["top2_logit_gap"] < 1e-3 for r in metrics["near_ties"]
        )
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and {"input", "baseline", "speculative", "stats"} <= set(rows[0])
    assert (out / "speedup.png").stat().st_size > 0
    assert "| ddtp_ende | perturbed-tiny |" in (out / "table_row.md").read_text()
    # c and verify/step from the real decode loops (the batches' caches), the step timer's beside.
    costs = written["step_costs"]
    assert costs["sources"] == 3 and len(costs["slopes_ms"]) == 3
    assert costs["verify_step_ms"] <= costs["iteration_ms"]
    assert costs["c"] == written["c_measured"] and "c_alone" in costs and "step_timer" in costs
    table = (out / "table_row.md").read_text()
    header, _, row = table.strip().splitlines()[:3]
    cells = dict(zip(_cells(header), _cells(row), strict=True))
    if costs["degenerate"]:  # tiny models on a busy CPU: timings are noise, flagged as such
        # The c cell says why (naming the bad value); no value is reported as a result.
        assert cells["c"].startswith("n/a (degenerate: ")
        assert cells["verify/step"] == "n/a" and cells["Predicted (Thm 3.8)"] == "n/a"
    else:
        assert f"({costs['c_alone']:.3f} alone)" in table
    lengths = [r["stats"]["num_generated"] for r in rows]
    if temperature == 0.0 and written["identical_fraction"] == 1.0:
        assert written["predicted_speedup_output_lengths"] == pytest.approx(
            summary.predicted_at_output_lengths(
                lengths,
                lengths,
                [1] * 3,
                written["alpha_beta"],
                3,
                written["c_measured"],
                written["verify_cost_ratio"],
            )
        )
    table = (out / "table_row.md").read_text()
    assert f"| {written['speedup']:.2f}X" in table


def test_eval_auto_gamma_row_beside_the_fixed_row(tiny_pair, data_dir, tmp_path):
    out = tmp_path / "out"
    metrics = _evaluate_tiny(
        tiny_pair,
        out,
        gamma=1,
        gammas=["auto"],
        temperature=0.0,
        num_examples=2,
        cost_repeats=2,
        auto_gamma_max=2,
        loop_costs=False,
    )
    assert "time_budget" not in metrics and "predicted_speedup_measured_costs" not in metrics
    assert "step_timer" not in metrics["step_costs"]  # measure_loop_costs=False: the timer's
    auto = metrics["auto"]
    # Two calls: a short run stays on the baseline (`speculation_gate`: the first call times it,
    # the second is not an exploration), with the controller's wish recorded.
    assert auto["gamma_chosen"] == {"0": 2} and auto["alpha_display"] == "off"
    assert auto["best_fixed_gamma"] == 1 and auto["speedup"] > 0
    # One record per call, in order (batch 1: one call per example).
    calls = auto["calls"]
    assert [c["reason"] for c in calls] == ["gate_baseline", "gate_off"]
    assert calls[0]["wanted"] == "1"  # the controller's probe, held back
    assert auto["cost_curve"]["source"] == "measured"  # the cost-curve cache is off in tests
    assert all(c["ms"] > 0 and c["longest_tokens"] >= 1 for c in calls)
    low, high = auto["speedup_interval"]
    assert low <= auto["speedup"] <= high and len(auto["auto_over_best_fixed_interval"]) == 2
    assert metrics["compilations_during_timing"] == 0  # each γ compiled before its timed call
    rows = (out / "table_row.md").read_text().split("\n\n")[0].splitlines()  # legend after
    assert len(rows) == 4 and "| auto (" in rows[3] and f"X ({low:.2f}–{high:.2f}) |" in rows[3]
    # An auto headline that never ran speculatively says "off" instead of an α.
    assert "| auto (off×1, baseline timing×1) | off |" in rows[3]  # this run's
    off_auto = {**auto, "gamma_chosen": {"0": 2}, "baseline_timing_examples": 0}
    off = {**metrics, **off_auto, "gamma": "auto", "alpha_display": "off", "auto": off_auto}
    assert "| auto (off×2) | off |" in tables.table_row(summary.group(off))
    with pytest.raises(ValueError, match="'auto'"):
        configs(gamma="5", temperature=0.0)


def test_eval_auto_as_the_headline_gamma_end_to_end(tiny_pair, data_dir, tmp_path):
    """GAMMA='auto' (the README's option): the headline row is auto's, the sweep 1..max beside it,
    and every output is written."""
    out = tmp_path / "out"
    metrics = _evaluate_tiny(
        tiny_pair,
        out,
        gamma="auto",
        temperature=0.0,
        num_examples=2,
        cost_repeats=2,
        auto_gamma_max=2,
        loop_costs=False,
    )
    assert metrics["gamma"] == "auto" and set(metrics["gamma_sweep"]) == {"1", "2"}
    assert set(metrics["quality"]) == {"baseline", "speculative"}
    assert metrics["speedup"] == metrics["auto"]["speedup"]
    written = json.loads((out / "metrics.json").read_text())
    assert written["decoding"]["gamma"] == "auto" and len(written) <= 25
    assert "| auto (" in (out / "table_row.md").read_text()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2


def test_eval_auto_alone_beside_the_baseline_end_to_end(tiny_pair, data_dir, tmp_path):
    """GAMMA='auto' with GAMMAS=[]: no fixed-γ row runs, auto's row is the headline, c and
    verify/step are priced at AUTO_GAMMA_MAX, and every output is written."""
    out = tmp_path / "out"
    metrics = _evaluate_tiny(
        tiny_pair,
        out,
        gamma="auto",
        gammas=[],
        temperature=0.0,
        num_examples=2,
        cost_repeats=2,
        auto_gamma_max=2,
        loop_costs=False,
    )
    assert metrics["gamma"] == "auto" and not metrics.get("gamma_sweep")
    assert metrics["speedup"] == metrics["auto"]["speedup"] and metrics["identical_fraction"] == 1
    assert "best_fixed_gamma" not in metrics["auto"] and metrics["step_costs"]["gamma"] == 2
    assert metrics["quality"]["speculative"] is not None
    assert "| auto (" in (out / "table_row.md").read_text() and (out / "speedup.png").exists()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2


def test_auto_in_the_sweep_with_a_fixed_headline_and_a_sweep_of_fixed_gammas(
    tiny_pair, data_dir, tmp_path
):
    """The other documented ways of setting γ: a fixed γ with a fixed sweep (GAMMAS)."""
    metrics = _evaluate_tiny(
        tiny_pair,
        tmp_path / "out",
        gamma=2,
        gammas=[1, 3],
        temperature=0.0,
        num_examples=1,
        cost_repeats=2,
        loop_costs=False,
    )
    assert metrics["gamma"] == 2 and set(metrics["gamma_sweep"]) == {"1", "2", "3"}
    assert "auto" not in metrics


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": 0}, r"GAMMA, GAMMAS\) take ints >= 1 or 'auto'; got \[0\]"),
        ({"gamma": 2, "gammas": [-1]}, r"got \[-1\]"),
        (
            {"gamma": 1, "num_examples": 0},
            r"num_examples \(gin: NUM_EXAMPLES\) must be an int >= 1; got 0",
        ),
        (
            {"gamma": 1, "batch_size": 0},
            r"batch_size \(gin: BATCH_SIZE\) must be an int >= 1; got 0",
        ),
    ],
)
def test_bad_gamma_and_counts_are_refused_before_any_work(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        configs(**kwargs)  # the settings check themselves before any model or folder exists


def test_unknown_task_leaves_no_output_folder(tiny_pair, tmp_path):
    with pytest.raises(ValueError, match=r"'ddtp_endee' \(gin: TASK\); did you mean ddtp_ende"):
        _evaluate_tiny(tiny_pair, tmp_path / "out", gamma=1, task="ddtp_endee")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["False", 0, None])
@pytest.mark.parametrize("flag", ["diagnostics", "loop_costs"])
def test_measurement_flags_take_a_bool_only(flag, value):
    with pytest.raises(ValueError, match=f"{flag} \\(gin: {flag.upper()}\\) takes True or False"):
        configs(gamma=1, **{flag: value})


def test_a_string_temperature_names_the_setting():
    with pytest.raises(
        ValueError, match=r"temperature \(gin: TEMPERATURE\) must be a number; got 'hot'"
    ):
        configs(gamma=1, temperature="hot")


def test_near_tie_report_names_position_and_gap(tiny_pair):
    spec_model, params = tiny_pair
    enc = jnp.asarray([5, 6, 7, 1] + [0] * 4, jnp.int32)
    base = jnp.asarray([9, 9, 9, 1, 0, 0], jnp.int32)
    other = base.at[2].set(10)
    report = checks.near_tie_report(spec_model.module, params, enc, base, other)
    assert report["position"] == 2 and report["speculative_token"] == 10
    assert report["baseline_token"] == 9
    # Independently: the teacher-forced logits at position 2 (decoder input [0, 9, 9, ...]).
    logits = spec_model.module.apply(
        {"params": params},
        enc[None],
        jnp.asarray([[0, 9, 9, 9, 1, 0]]),
        jnp.ones((1, 6), jnp.int32),
        enable_dropout=False,
    )[0, 2]
    top2_values, top2_ids = jax.lax.top_k(logits, 2)
    assert report["top2_logit_gap"] == pytest.approx(float(top2_values[0] - top2_values[1]))
    assert report["top2_logit_gap"] > 0.0  # random weights: no exact tie
    assert report["speculative_is_runner_up"] == (int(top2_ids[1]) == 10)


EXPERIMENTS = sorted(
    str(p.relative_to(gin_utils.GIN_DIR.parent))
    for p in (gin_utils.GIN_DIR / "experiments").glob("*.gin")
)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_gin_parses_or_names_the_missing_macro(name):
    gin.clear_config(clear_constants=True)
    text = pathlib.Path(gin_utils.GIN_DIR.parent / name).read_text()
    try:
        if "%gin.REQUIRED" in text or "paper_" in name:
            with pytest.raises(ValueError, match="CHECKPOINT"):
                gin_utils.parse(["gin/runs/eval.gin", name], [], finalize=False)
        else:
            gin_utils.parse(["gin/runs/eval.gin", name], [], finalize=False)
            for macro in ("TASK", "GAMMA", "TEMPERATURE", "EVAL_OUTPUT_DIR", "DRAFT_NAME"):
                gin.query_parameter(f"%{macro}")
    finally:
        gin.clear_config(clear_constants=True)


def test_experiment_files_exist():
    assert len(EXPERIMENTS) >= 8


def test_paper_row_end_to_end_on_synthetic_checkpoints_and_mock_tfds(tmp_path, monkeypatch):
    """The paper path: XXL-row gin file (shrunk to tiny sizes), T5X checkpoints on disk, WMT via TFDS
    mock data, the T5 vocabulary path bound in gin."""
    import seqio
    import tensorflow_datasets as tfds

    from specdec_t5x import checkpoints
    from specdec_t5x.eval import cli as eval_main

    cfg = tiny_config(vocab_size=32128, dtype="bfloat16")
    module = network.Transformer(cfg)
    target, draft = init_params(module, 11), perturbed(init_params(module, 11), 0.02, 1)
    checkpoints.save_t5x_checkpoint(target, tmp_path / "target", 1000)
    checkpoints.save_t5x_checkpoint(draft, tmp_path / "draft", 1000)
    monkeypatch.setattr(seqio.TfdsDataSource, "num_input_examples", lambda self, split: None)
    # The mock data stands in for prepared data (`inputs.check_tfds_prepared` checks it is there).
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    out = tmp_path / "out"
    bindings = [  # the tiny shapes, lengths and counts: gin/runs/paper_smoke.gin
        f"TARGET_CHECKPOINT = '{tmp_path / 'target'}'",
        f"DRAFT_CHECKPOINT = '{tmp_path / 'draft'}'",
        f"VOCAB_PATH = '{vocab.DEFAULT_VOCAB_PATH}'",
        f"EVAL_OUTPUT_DIR = '{out}'",
    ]
    gin.clear_config(clear_constants=True)
    try:
        with tfds.testing.mock_data(num_examples=2):
            metrics = eval_main.main(
                ["--gin_file=gin/experiments/paper_ende_small_t0.gin"]
                + ["--gin_file=gin/runs/paper_smoke.gin"]
                + [f"--gin.{b.replace(' = ', '=')}" for b in bindings]
            )
    finally:
        gin.clear_config(clear_constants=True)
    metrics = summary.flat(metrics)
    assert metrics["task"] == "wmt_t2t_ende_v003" and metrics["draft"] == "T5-small"
    assert metrics["num_examples"] == 2 and metrics["gamma"] == 7
    assert metrics["identical_fraction"] == 1.0 or all(
        r["top2_logit_gap"] < 1e-3 for r in metrics["near_ties"]
    )
    assert (out / "operative_config.gin").read_text().count("TARGET_CHECKPOINT") >= 1
    assert "time_budget" not in metrics  # diagnostics are opt-in


@pytest.mark.parametrize(
    "selector",
    [
        f"speculative.speculative_sample.{p}"
        for p in inspect.signature(speculative.speculative_sample).parameters
    ]
    + [
        f"models.{m}.default_decoder_params"
        for m in ("EncoderDecoderModel", "SpeculativeEncoderDecoderModel")
    ],
)
def test_binding_any_sampler_argument_is_an_error_naming_the_route(selector):
    """The job sets every sampler argument itself (macros, per-call keywords, or the same default
    for every row), so a binding of one would be overridden or apply to some rows only."""
    from specdec_t5x.eval import cli as eval_main

    gin.clear_config(clear_constants=True)
    try:
        with pytest.raises(ValueError, match=rf"{re.escape(selector)} = 1.*would be ignored: set"):
            eval_main.parse_config(
                ["gin/experiments/embedded_ende_source_copy_t0.gin"], [f"{selector} = 1"], False
            )
    finally:
        gin.clear_config(clear_constants=True)


def _run_eval_job(tmp_path, name, bindings):
    from specdec_t5x.eval import cli as eval_main

    out = tmp_path / name
    argv = ["--gin_file=gin/experiments/embedded_ende_source_copy_t0.gin"]
    small = ["NUM_EXAMPLES=2", "INPUT_LEN=32", "TARGET_LEN=8", "GAMMAS=None"]  # no auto-γ row
    small.append("LOOP_COSTS=False")  # timing is not what these jobs are about
    argv += [f"--gin.{b}" for b in [*small, *bindings]]
    argv.append(f"--gin.EVAL_OUTPUT_DIR='{out}'")
    gin.clear_config(clear_constants=True)
    try:
        metrics = eval_main.main(argv)
    finally:
        gin.clear_config(clear_constants=True)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return summary.flat(metrics), [(r["baseline"], r["speculative"]) for r in rows]


def test_every_gin_decoding_setting_reaches_the_decoders_or_errors(data_dir, tmp_path, monkeypatch):
    """GAMMA, GAMMAS, TEMPERATURE, TOPK, TOPP and SEED each change the decoded tokens or statistics
    of the eval job; bindings the job would override (the samplers' own parameters) and typos are
    errors (`test_gin` checks every sampler parameter is rejected)."""
    fixed = {"c": 0.1, "verify_cost_ratio": 1.0}  # timing is not what this test is about
    monkeypatch.setattr(step_timer, "step_costs", lambda *args, **kwargs: dict(fixed))
    greedy, greedy_tokens = _run_eval_job(tmp_path, "greedy", [])
    assert greedy["gamma"] == 1 and len(greedy["accept_histogram"]) == 2  # the experiment's γ
    assert all(b == s for b, s in greedy_tokens)  # argmax mode: speculative == baseline
    assert set(greedy["gamma_sweep"]) == {"1"}

    gamma2, gamma2_tokens = _run_eval_job(tmp_path, "gamma2", ["GAMMA=2", "GAMMAS=[3]"])
    assert gamma2["gamma"] == 2 and len(gamma2["accept_histogram"]) == 3  # statistics change
    assert set(gamma2["gamma_sweep"]) == {"2", "3"}  # GAMMAS adds a timed row
    assert gamma2_tokens == greedy_tokens

    sampled, sampled_tokens = _run_eval_job(tmp_path, "t1", ["TEMPERATURE=1.0"])
    assert sampled["temperature"] == 1.0 and sampled_tokens != greedy_tokens
    _, seed1_tokens = _run_eval_job(tmp_path, "t1_seed1", ["TEMPERATURE=1.0", "SEED=1"])
    assert seed1_tokens != sampled_tokens
    # At T = 1, top-1 and a tiny nucleus keep only the argmax: the greedy tokens come back.
    for name, binding in (("topk1", "TOPK=1"), ("topp", "TOPP=0.001")):
        metrics, tokens = _run_eval_job(tmp_path, name, ["TEMPERATURE=1.0", binding])
        assert tokens == greedy_tokens, name
        assert metrics["sampling"]["topk"] == (1 if name == "topk1" else 0)

    for binding, match in (
        ("speculative.speculative_sample.gamma=3", "would be ignored: set the GAMMA"),
        ("speculative.speculative_sample.temperature=1.0", "would be ignored"),
        ("speculative.speculative_sample.verification='block'", "would be ignored"),
        ("GAMA=3", r"GAMA \(did you mean GAMMA"),
        ("TOPK=-1", "topk must be a non-negative int"),
    ):
        with pytest.raises(ValueError, match=match):
            _run_eval_job(tmp_path, "bad", [binding])


def _tree_bytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


def test_eval_job_holds_one_copy_of_each_decoder_projection(data_dir, tmp_path, monkeypatch):
    """`python -m specdec_t5x.eval` on the shipped pair (CPU kernel on): while it runs, the bytes of
    all live arrays it added are the packed target and draft trees (one copy of each decoder
    projection), not raw + packed; greedy tokens equal the raw-parameter jnp.dot decode."""
    import gc

    from specdec_t5x import cpu_kernel, embedded
    from specdec_t5x.eval import cli as eval_main

    if cpu_kernel.disabled_reason() is not None:
        pytest.skip(f"CPU kernel off here: {cpu_kernel.disabled_reason()}")

    def live_bytes() -> int:
        gc.collect()
        return sum(x.nbytes for x in jax.live_arrays())

    seen = {}
    measure = step_timer.step_costs

    def spy(spec_model, target_params, draft_params, encoder_input_tokens, *args, **kwargs):
        # Called after every timed decode, while the job holds everything it keeps for the run.
        seen.update(
            live=live_bytes(),
            target=target_params,
            draft=draft_params,
            model=spec_model,
            enc=encoder_input_tokens,
        )
        return measure(
            spec_model, target_params, draft_params, encoder_input_tokens, *args, **kwargs
        )

    monkeypatch.setattr(step_timer, "step_costs", spy)
    out = tmp_path / "job"
    argv = ["--gin_file=gin/experiments/embedded_ende_model_t0.gin"]
    for b in [
        "NUM_EXAMPLES=1",
        "INPUT_LEN=32",
        "TARGET_LEN=8",
        "GAMMAS=None",
        f"EVAL_OUTPUT_DIR='{out}'",
    ]:
        argv.append(f"--gin.{b}")
    gin.clear_config(clear_constants=True)
    before = live_bytes()
    try:
        metrics = summary.flat(eval_main.main(argv))
    finally:
        gin.clear_config(clear_constants=True)
    target, draft = seen.pop("target"), seen.pop("draft")
    assert cpu_kernel.is_packed(target) and cpu_kernel.is_packed(draft)
    held = seen["live"] - before
    one_copy = _tree_bytes(target) + _tree_bytes(draft)
    projections = sum(x.nbytes for x in cpu_kernel.packed_arrays(target))
    projections += sum(x.nbytes for x in cpu_kernel.packed_arrays(draft))
    # Raw + packed would add every projection again (27 MiB here: 92.4 MB instead of 65.2 MB);
    # the job's own small arrays (batches, keys) are a few hundred bytes.
    assert projections > 0.4 * one_copy
    assert one_copy - 2**20 < held < one_copy + 2**20, (held, one_copy, projections)

    # Decoding unchanged: the job's tokens equal the raw float32 tree on jnp.dot.
    model = seen["model"]
    raw = embedded.load_params("embedded_ende_target")
    batch = {
        "encoder_input_tokens": seen["enc"],
        "decoder_input_tokens": jnp.zeros((1, 8), jnp.int32),
    }
    with cpu_kernel.env_setting(False):
        base = models.EncoderDecoderModel(model.module)
        want = base.predict_batch(raw, batch, decoder_params={"temperature": 0.0})[0]
    row = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
    text = metrics_lib.decode_text(model.output_vocabulary, jax.device_get(want), model.eos_id)
    assert row["baseline"] == row["speculative"] == text
    assert metrics["identical_fraction"] == 1.0 and metrics["cpu_weight_dtype"] == "float32"


def test_bfloat16_cpu_weights_report_what_flipped(tiny_pair, data_dir, tmp_path):
    """CPU_WEIGHT_DTYPE='bfloat16': the job lists every greedy baseline the rounding changed
    (against float32 weights) with the position, both tokens and both logit gaps, matching
    independent decodes with each weight dtype."""
    from specdec_t5x import cpu_kernel

    if cpu_kernel.disabled_reason() is not None:
        pytest.skip(f"CPU kernel off here: {cpu_kernel.disabled_reason()}")
    spec_model, params = tiny_pair
    # Output columns that differ by ~1e-4 (well below bfloat16's rounding of ~1 / 512): every logit
    # is a near-tie, so rounding the weights decides the argmax and flips are certain.
    w = params["decoder"]["logits_dense"]["kernel"]  # [emb, vocab]
    k0, k1 = jax.random.split(jax.random.PRNGKey(0))
    tied = jax.random.normal(k0, (w.shape[0], 1)) + 1e-4 * jax.random.normal(k1, w.shape)
    params = {**params, "decoder": {**params["decoder"], "logits_dense": {"kernel": tied}}}
    vocabulary = spec_model.output_vocabulary
    bf16_model = models.SpeculativeEncoderDecoderModel(
        spec_model.module, spec_model.draft, vocabulary, vocabulary, cpu_weight_dtype="bfloat16"
    )
    n, input_len, target_len = 3, 32, 32  # the fixture corpus has 3 sentences
    metrics = _evaluate_tiny(
        (bf16_model, params),
        tmp_path / "out",
        gamma=3,
        temperature=0.0,
        num_examples=n,
        input_len=input_len,
        target_len=target_len,
        cost_repeats=2,
        loop_costs=False,  # not what this test is about
    )
    assert metrics["cpu_weight_dtype"] == "bfloat16"
    report = metrics["weight_flips"]
    examples, _, _ = inputs_lib.load_examples(
        "ddtp_ende", "test", n, input_len, target_len, vocabulary
    )
    enc = jnp.asarray([jnp.pad(e["inputs"], (0, input_len - len(e["inputs"]))) for e in examples])
    batch = {"encoder_input_tokens": enc, "decoder_input_tokens": jnp.zeros((n, target_len), int)}
    greedy = {"temperature": 0.0}
    decodes = {  # one example per call, as the job decodes them (batch_size 1)
        d: [
            models.EncoderDecoderModel(spec_model.module, cpu_weight_dtype=d).predict_batch(
                params, {k: v[i : i + 1] for k, v in batch.items()}, decoder_params=greedy
            )[0]
            for i in range(n)
        ]
        for d in ("float32", "bfloat16")
    }
    flipped = [
        i for i in range(n) if not jnp.array_equal(decodes["float32"][i], decodes["bfloat16"][i])
    ]
    assert flipped
    assert [f["example"] for f in report["flips"]] == flipped
    assert report["num_flipped"] == len(flipped)
    assert report["identical_fraction_vs_float32"] == 1.0 - len(flipped) / n
    for f in report["flips"]:
        a, b = decodes["float32"][f["example"]], decodes["bfloat16"][f["example"]]
        t = int(jnp.nonzero(a != b)[0][0])
        assert (f["position"], f["float32_token"], f["bfloat16_token"]) == (t, int(a[t]), int(b[t]))
        assert f["float32_logit_gap"] >= 0.0 and f["bfloat16_logit_gap"] >= 0.0
    assert report["max_float32_logit_gap"] == max(f["float32_logit_gap"] for f in report["flips"])


def test_provenance_footer_names_each_commits_rows(tmp_path):
    def run(name, commit, date):
        d = tmp_path / name
        d.mkdir()
        m = {"hardware": f"cpu of {name}", "commit": commit, "date": date}
        (d / "metrics.json").write_text(json.dumps(m))
        return d / "metrics.json"

    a, b = run("ende_t0", "aaa", "2026-01-01"), run("sum_t0", "bbb", "2026-01-02")
    c = run("sum_t1", "bbb", "2026-01-03")
    assert tables.provenance_footer([a]) == "Hardware: cpu of ende_t0; commit `aaa`; 2026-01-01."
    footer = tables.provenance_footer([a, b, c])
    assert footer.startswith("Rows from more than one run:")
    assert "- ende_t0: commit `aaa`, 2026-01-01 to 2026-01-01; cpu of ende_t0." in footer
    assert "- sum_t0, sum_t1: commit `bbb`, 2026-01-02 to 2026-01-03; cpu of sum_t0." in footer
    with pytest.raises(ValueError, match="at least one"):
        tables.provenance_footer([])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_rows_beside_the_chain(tiny_pair, data_dir, tmp_path, temperature):
    """TREES adds token-tree rows, timed interleaved with the chain: greedy's tokens at T = 0,
    their acceptance per depth and rank, and a table row each."""
    out = tmp_path / "out"
    metrics = _evaluate_tiny(
        tiny_pair, out, gamma=2, trees=[(2, 2)], temperature=temperature, num_examples=2,
        cost_repeats=2, loop_costs=False,
    )  # fmt: skip
    row = metrics["tree_sweep"]["tree(2,2)"]
    assert row["tokens_per_iteration"] >= 1.0 and len(row["depth_acceptance"]) == 2
    nodes = row["node_accepted"]  # root, then per child-rank path; a parent passes its children's
    assert list(nodes)[:3] == ["root", "0", "1"] and nodes["root"] == row["target_calls"]
    assert nodes["0"] >= nodes["0.0"] + nodes["0.1"] and nodes["1"] >= nodes["1.0"] + nodes["1.1"]
    assert sum(nodes.values()) - nodes["root"] == sum(
        d * n for d, n in enumerate(row["accept_histogram"])
    )
    assert set(row["subtrees"]) == {2, 3, 4, 5, 6} and row["subtrees"][6].startswith("tree[0,")
    assert len(row["rank_acceptance"]) == 2 and len(row["accept_histogram"]) == 3
    if temperature == 0.0:
        assert row["identical_fraction"] == 1.0  # greedy's tokens
    else:
        assert row["speedup_vs_t5x_sampler"] > 0
    table = (out / "table_row.md").read_text()
    assert "| tree(2,2) |" in table
    with pytest.raises(ValueError, match="TREES: bad tree"):
        configs(gamma=1, trees=[(0, 2)])
    with pytest.raises(ValueError, match="TREE_RULE"):
        configs(gamma=1, trees=[(2,)], tree_rule="best")


def test_tree_rows_are_named_by_their_shape():
    assert config.SpeculationConfig("auto", trees=[(3, 2, 1)]).tree_rows == {
        "tree(3,2,1)": (3, 2, 1)
    }


def test_an_auto_headline_sweeps_fixed_gammas_unless_gammas_is_empty():
    assert config.SpeculationConfig("auto", auto_gamma_max=3).fixed_gammas == [1, 2, 3]
    alone = config.SpeculationConfig("auto", gammas=[], auto_gamma_max=3)
    assert alone.fixed_gammas == [] and alone.auto
    assert config.SpeculationConfig("auto", gammas=[2]).fixed_gammas == [2]
