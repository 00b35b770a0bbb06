"""The eval job's outputs can be trusted: guarded folders, atomic files, resume, Ctrl-C, --help,
and degenerate cost measurements flagged instead of printed as numbers."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from conftest import tiny_spec_pair
from test_eval import _evaluate_tiny

from specdec_t5x import provenance
from specdec_t5x.eval import cli, costs, job, outputs, summary, tables

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_spec_pair()


# ---------------------------------------------------------------------------------------------
# Degenerate cost measurements.


def _record(**costs_overrides):
    step_costs = {
        "target_step_ms": 1.0,
        "iteration_ms": 1.6,
        "verify_only_ms": 1.2,
        "verify_capped": False,
        "c": 0.2,
        "verify_cost_ratio": 1.2,
        **costs_overrides,
    }
    return {
        "task": "ddtp_ende",
        "draft": "d",
        "temperature": 0.0,
        "gamma": 2,
        "alpha_beta": 0.5,
        "c_measured": step_costs["c"],
        "c_alone": None,
        "verify_cost_ratio": step_costs["verify_cost_ratio"],
        "tokens_per_iteration": 1.7,
        "speedup": 1.1,
        "predicted_speedup_measured_verify": 1.09375,  # Thm 3.8: 1.75 / (2 * 0.2 + 1.2)
        "identical_fraction": 1.0,
        "step_costs": step_costs,
        "gamma_sweep": {"2": {}},
    }


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"c": 123029.53}, "c = 1.23e+05 outside [0, 1)"),
        ({"c": 1.0}, "c = 1 outside [0, 1)"),
        ({"verify_cost_ratio": 539579.83}, "verify/step = 5.396e+05 outside [0.5, 4]"),
        ({"target_step_ms": 1e-6}, "non-positive slope"),
        ({"verify_capped": True, "verify_only_ms": 2.0}, "verify call dearer than its iteration"),
        ({"interference_ms": -0.2}, "interference -0.2 ms < 0 (beyond noise"),
        ({"c": float("nan")}, "c = nan outside [0, 1)"),
    ],
)
def test_a_degenerate_cost_measurement_is_flagged_not_printed(overrides, reason):
    record = _record(**overrides)
    assert any(reason in r for r in costs.degenerate(record["step_costs"], 2))
    row = tables.table_row(summary.group(record))
    assert "n/a (degenerate: " in row and reason in row
    assert "1.09X" not in row  # the prediction built on it is not printed as a number
    assert "| 1.10X |" in row  # the measured speed still is


def test_a_sound_cost_measurement_prints_its_numbers():
    record = _record()
    assert costs.degenerate(record["step_costs"], 2) == []
    # A cap within timing noise (a nearly free draft) is not degenerate.
    assert (
        costs.degenerate({**record["step_costs"], "verify_capped": True, "verify_only_ms": 1.61}, 2)
        == []
    )
    row = tables.table_row(summary.group(record))
    assert "n/a" not in row and "| 0.200 | 1.20 | 1.70 | 1.10X | 1.09X | 1.00 |" in row


# The step timer's costs (`--quick`, LOOP_COSTS=False) of a run at load 5-15 that printed
# c = 0.000: the draft step at the timer's floor, the verify call dearer than its whole iteration
# (T(1) and verify/step as such a run reads them; the rest as recorded).
QUICK_AT_LOAD = {
    "target_step_ms": 6.9,
    "draft_step_ms": 1e-06,
    "verify_step_ms": 8.33,
    "iteration_ms": 5.90,
    "interference_ms": -2e-06,
    "c": 0.0,
    "c_alone": 1e-06 / 6.9,
    "verify_cost_ratio": 1.21,
}


def test_the_step_timer_path_flags_the_recorded_degenerate_case(capsys):
    record = {**_record(), "step_costs": QUICK_AT_LOAD, "c_alone": QUICK_AT_LOAD["c_alone"]}
    record.update(c_measured=0.0, verify_cost_ratio=1.21)
    reasons = costs.degenerate(QUICK_AT_LOAD, 2)
    assert any("draft step not resolved (1e-06 ms alone" in r for r in reasons), reasons
    assert "verify call dearer than its iteration (8.33 > 5.9 ms)" in reasons
    assert not any("interference" in r for r in reasons)  # -2e-06 ms is within noise
    cli.print_results(summary.group(record), "/tmp/out")
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ddtp_ende")]
    cells = line.strip("| ").split(" | ")
    assert cells[5].startswith("n/a (degenerate: draft step not resolved")
    assert "0.000" not in line and cells[6] == "n/a" and cells[9] == "n/a"
    # The same timings with the verify call inside its iteration and a resolved draft: sound.
    sound = {**QUICK_AT_LOAD, "draft_step_ms": 0.03, "verify_step_ms": 5.7, "c": 0.014}
    assert costs.degenerate(sound, 2) == []


def test_t1_speedups_name_their_baseline():
    record = {**_record(), "temperature": 1.0}
    record["step_costs"].pop("verify_capped")
    grouped = summary.group(record)
    assert tables.T5X_SAMPLER_MARK in tables.table_row(grouped)  # measured against T5X's sampler
    fair = summary.group({**record, "speedup_vs_t5x_sampler": 1.4})
    assert "1.10X (vs T5X sampler 1.40X)" in tables.table_row(fair)
    assert summary.flat(grouped)["speedup"] == 1.1 and len(grouped) <= 25


# ---------------------------------------------------------------------------------------------
# A busy machine.


def test_a_run_timed_on_a_busy_machine_says_so_on_the_console_and_in_its_row(
    tiny_pair, data_dir, tmp_path, monkeypatch, caplog, capsys
):
    cores = os.cpu_count()
    load = 2.5 * cores + 0.2
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 1.0, 1.0))
    out = tmp_path / "out"
    kwargs = dict(gamma=2, temperature=0.0, num_examples=2, cost_repeats=2, loop_costs=False)
    with caplog.at_level("WARNING", logger="specdec_t5x.eval.job"):
        metrics = _evaluate_tiny(tiny_pair, out, **kwargs)
    note = f"⚠ busy (load {load:.1f} on {cores} cores)"
    warnings = [r.getMessage() for r in caplog.records if "busy machine" in r.getMessage()]
    assert warnings == [
        f"busy machine: load average {load:.1f} on {cores} cores while timing: other work "
        "shared the CPU, so the speed-up and c may not hold on a quiet machine."
    ]
    written = json.loads((out / "metrics.json").read_text())["speed"]["busy_machine"]
    assert written == {"busy": True, "load": load, "cores": cores, "load_samples": [load, load]}
    assert note in (out / "table_row.md").read_text()
    cli.print_results(summary.group(metrics), str(out))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ddtp_ende")]
    assert note in line
    # Repeated runs count the busy ones; a quiet machine prints no note.
    quiet = {**metrics, "busy_machine": provenance.busy_machine([0.5 * cores], cores)}
    assert "⚠ busy (1 of 2 runs)" in tables.median_row(
        [summary.group(metrics), summary.group(quiet)]
    )
    assert (
        "busy" not in tables.table_row(summary.group(quiet)) and not quiet["busy_machine"]["busy"]
    )


# ---------------------------------------------------------------------------------------------
# The output folder.


def test_a_used_folder_is_refused_unless_overwrite_which_removes_stale_outputs(tmp_path):
    (tmp_path / "speedup.png").write_bytes(b"stale")
    with pytest.raises(ValueError, match=r"not empty \(speedup.png\): pass --overwrite"):
        outputs.OutputDir(tmp_path).open({"a": 1}, overwrite=False, resume=False)
    out = outputs.OutputDir(tmp_path).open({"a": 1}, overwrite=True, resume=False)
    assert not (tmp_path / "speedup.png").exists() and (tmp_path / outputs.LOCK).exists()
    out.close()
    assert not (tmp_path / outputs.LOCK).exists()
    with pytest.raises(ValueError, match=r"differs in: a"):
        outputs.OutputDir(tmp_path).open({"a": 2}, overwrite=False, resume=True)


def test_a_folder_another_live_job_writes_is_refused(tmp_path):
    (tmp_path / outputs.LOCK).write_text(str(os.getppid()))  # a live process that is not us
    with pytest.raises(ValueError, match=rf"another job \(pid {os.getppid()}\) is writing"):
        outputs.OutputDir(tmp_path).open({}, overwrite=True, resume=False)
    (tmp_path / outputs.LOCK).write_text("999999999")  # a dead job's lock is taken over
    outputs.OutputDir(tmp_path).open({}, overwrite=True, resume=False).close()


def test_atomic_writes_leave_the_old_file_or_the_new_one(tmp_path):
    path = tmp_path / "metrics.json"
    outputs.write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        outputs.write_json(path, {"v": object()})  # fails while serialising
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


# ---------------------------------------------------------------------------------------------
# Resume.


def test_resume_after_an_interrupt_gives_the_uninterrupted_predictions(
    tiny_pair, data_dir, tmp_path, monkeypatch
):
    kwargs = dict(gamma=2, temperature=1.0, num_examples=3, cost_repeats=2)
    whole = _evaluate_tiny(tiny_pair, tmp_path / "whole", loop_costs=False, **kwargs)
    decode_one, calls = job._decode_one, []

    def interrupted(fns, key, batch, *args):
        calls.append(key)
        if len(calls) == 7:  # baseline, T5X's sampler and γ = 2 per batch: batch 3's first call
            raise KeyboardInterrupt
        return decode_one(fns, key, batch, *args)

    monkeypatch.setattr(job, "_decode_one", interrupted)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        _evaluate_tiny(tiny_pair, out, loop_costs=False, **kwargs)
    assert not (out / "metrics.json").exists() and not (out / outputs.LOCK).exists()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2  # as examples finished
    with pytest.raises(ValueError, match="not empty"):
        _evaluate_tiny(tiny_pair, out, loop_costs=False, **kwargs)
    with pytest.raises(ValueError, match="another configuration"):
        _evaluate_tiny(tiny_pair, out, loop_costs=False, resume=True, **{**kwargs, "gamma": 3})
    monkeypatch.setattr(job, "_decode_one", decode_one)
    resumed = _evaluate_tiny(tiny_pair, out, loop_costs=False, resume=True, **kwargs)
    assert resumed["resumed"] == {"batches_restored": 2, "batches": 3}
    texts = lambda d: [  # noqa: E731
        (r["baseline"], r["speculative"])
        for r in map(json.loads, (d / "predictions.jsonl").read_text().splitlines())
    ]
    assert texts(out) == texts(tmp_path / "whole")
    assert resumed["tokens_per_iteration"] == whole["tokens_per_iteration"]
    with pytest.raises(ValueError, match="is finished"):
        _evaluate_tiny(tiny_pair, out, loop_costs=False, resume=True, **kwargs)
    with pytest.raises(ValueError, match="cannot restore auto"):
        _evaluate_tiny(tiny_pair, out, resume=True, **{**kwargs, "gamma": "auto"})


# ---------------------------------------------------------------------------------------------
# The command line.


def test_help_lists_the_flags_and_macros(capsys):
    assert cli.main(["--help"]) is None
    text = capsys.readouterr().out
    for word in ("--gin_file", "--quick", "--overwrite", "--resume", "NUM_EXAMPLES", "GAMMA"):
        assert word in text
    with pytest.raises(ValueError, match="unknown argument '--fast'"):
        cli.parse_flags(["--gin_file=x.gin", "--fast"])
    assert cli.parse_flags(["--gin_file=x.gin", "--quick"])[0] == ["x.gin", cli.QUICK_GIN]


def test_an_error_is_one_line_naming_the_bad_value_and_verbose_adds_the_traceback(
    capsys, clean_gin
):
    import gin

    argv = ["--gin_file=gin/experiments/embedded_ende_model_t0.gin", "--gin.NUM_EXAMPLES=0"]
    with pytest.raises(SystemExit) as exit_:
        cli.run([*argv, "--gin.EVAL_OUTPUT_DIR='/nonexistent/out'"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last == "error: num_examples (gin: NUM_EXAMPLES) must be an int >= 1; got 0."
    assert "Traceback" not in err and "In call to configurable" not in err
    gin.clear_config(clear_constants=True)  # a process runs the job once; this test, twice
    with pytest.raises(SystemExit):
        cli.run([*argv, "--gin.EVAL_OUTPUT_DIR='/nonexistent/out'", "--verbose"])
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1] == last
    with pytest.raises(SystemExit):
        cli.run(["--gin_file=gin/experiments/no_such.gin"])
    assert capsys.readouterr().err.startswith("error: gin file 'gin/experiments/no_such.gin'")
    # A surprise (not the project's own ValueError / OSError) names its type and --verbose.
    assert cli.error_line(KeyError("gamma")) == (
        "error: KeyError: 'gamma' (--verbose prints the traceback)"
    )


@pytest.fixture
def compilation_cache_config():
    """JAX's persistent-cache settings, restored (and the cache reset) after the test."""
    import jax

    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    saved = {name: getattr(jax.config, name) for name in names}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    cli.use_compilation_cache(saved["jax_compilation_cache_dir"])


def test_the_command_line_caches_compiled_programs_by_default_and_the_library_never_does(
    tmp_path, monkeypatch, compilation_cache_config
):
    import jax

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(cli.CACHE_ENV_VAR, raising=False)
    jax.config.update("jax_compilation_cache_dir", None)  # no JAX_COMPILATION_CACHE_DIR
    default = str(tmp_path / ".cache" / "specdec_t5x" / "jax_cache")
    assert cli.compilation_cache_dir() == default  # beside the corpus's ~/.cache/specdec_t5x/data
    assert cli.compilation_cache_dir("/elsewhere") == "/elsewhere"
    assert cli.compilation_cache_dir("/elsewhere", off=True) is None
    monkeypatch.setenv(cli.CACHE_ENV_VAR, "~/moved")
    assert cli.compilation_cache_dir() == str(tmp_path / "moved")
    monkeypatch.setenv(cli.CACHE_ENV_VAR, "0")
    assert cli.compilation_cache_dir() is None and cli.compilation_cache_dir("/d") == "/d"
    # The job sets it before any JAX work; every program is kept, however fast it compiled.
    with pytest.raises(FileNotFoundError):
        cli.main(["--gin_file=no_such.gin", f"--compilation_cache_dir={tmp_path / 'c'}"])
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    with pytest.raises(ValueError, match="unknown argument '--compilation_cache'"):
        cli.parse_flags(["--gin_file=x.gin", "--compilation_cache"])
    # Library code never sets it: only the command-line module names JAX's setting.
    setters = sorted(
        str(f.relative_to(ROOT))
        for f in (ROOT / "specdec_t5x").rglob("*.py")
        if "jax_compilation_cache_dir" in f.read_text()
    )
    assert setters == ["specdec_t5x/eval/cli.py"]


def test_a_second_process_loads_even_a_fast_compiling_program_from_the_cache(tmp_path):
    program = (
        "import sys, jax; from specdec_t5x.eval import cli; "
        "cli.use_compilation_cache(sys.argv[1]); hits = []; "
        "jax.monitoring.register_event_listener(lambda e, **k: hits.append(e)); "
        "jax.jit(lambda x: x * 3 + 1)(2.0).block_until_ready(); "
        "print('hits', hits.count('/jax/compilation_cache/cache_hits'))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", program, str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for _ in range(2)
    ]
    assert [r.stdout.split()[-2:] for r in runs] == [["hits", "0"], ["hits", "1"]], runs
    assert any(tmp_path.iterdir())  # a program that compiled in well under JAX's 1 s default


def _argv(out: pathlib.Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "specdec_t5x.eval",
        "--gin_file=gin/experiments/embedded_ende_source_copy_t0.gin",
        "--gin.NUM_EXAMPLES=4",
        "--gin.INPUT_LEN=32",
        "--gin.TARGET_LEN=8",
        "--gin.GAMMAS=None",
        "--gin.LOOP_COSTS=False",
        "--gin.COST_REPEATS=2",
        f"--gin.EVAL_OUTPUT_DIR='{out}'",
        *flags,
    ]


def _job(out: pathlib.Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        _argv(out, *flags), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _interrupt_on(proc: subprocess.Popen, text: str) -> tuple[int, str]:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=600)
    return proc.returncode, "".join(seen) + rest


@pytest.mark.slow
def test_sigint_in_compilation_and_at_a_quarter_of_decoding_exits_130_and_resumes(
    data_dir, tmp_path
):
    """Ctrl-C on the job's own phase lines: during compilation, then at 25 % of the decode loop;
    exit status 130, no corrupt file, and --resume finishes the run."""
    ddtp = data_dir / "ddtp_ende" / "test.jsonl"  # a fourth sentence: 25 % is one batch
    first = json.loads(ddtp.read_text().splitlines()[0])
    with open(ddtp, "a") as f:
        f.write(json.dumps({**first, "en": first["en"] + " Again."}, ensure_ascii=False) + "\n")
    out = tmp_path / "out"
    code, log = _interrupt_on(_job(out), "compile and warm up")
    assert code == 130, log[-3000:]
    assert "Segmentation fault" not in log and not (out / "metrics.json").exists()
    json.loads((out / outputs.RUN_FILE).read_text())  # whole
    code, log = _interrupt_on(_job(out, "--overwrite"), "decoded 1/4 batches (25%)")
    assert code == 130, log[-3000:]
    records = (out / outputs.RECORDS).read_text().splitlines()
    assert 1 <= len(records) <= 4 and all(json.loads(r)["runs"] for r in records)
    assert not (out / "metrics.json").exists() and not (out / outputs.LOCK).exists()
    done = subprocess.run(
        _argv(out, "--resume"), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = summary.flat(json.loads((out / "metrics.json").read_text()))
    assert metrics["resumed"]["batches_restored"] == len(records)
    assert metrics["identical_fraction"] == 1.0
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 4


def test_statistics_round_trip_through_the_records_file():
    import numpy as np

    from specdec_t5x import speculative

    stats = speculative.SpeculativeStats(
        *(np.arange(2, dtype=np.int32) + i for i in range(3)),
        np.ones((2, 4), np.int32),
        np.array([0.5, 0.25], np.float32),
        *(np.arange(2, dtype=np.int32) for _ in range(3)),
        np.array([-1.5, 0.0], np.float32),
    )
    back = outputs.decode_stats(json.loads(json.dumps(outputs.encode_stats(stats))))
    assert type(back) is speculative.SpeculativeStats
    for name in ("num_iterations", "accept_histogram", "beta_sum"):
        a, b = getattr(stats, name), getattr(back, name)
        assert a.dtype == b.dtype and (a == b).all()
    assert outputs.decode_stats(outputs.encode_stats(None)) is None
