"""The README's commands, run as written.

Every shell command the README shows (its fenced ```bash blocks, and the inline `python …`,
`bash …` and `pip …` commands a user is told to run) is extracted and either run here, with only
its size knobs overridden (NUM_EXAMPLES, INPUT_LEN, TARGET_LEN, BATCH_SIZE, COST_REPEATS, output
folders under a temporary folder; SPECDEC_DATA_DIR at the tests' tiny corpus; one compilation
cache shared by every command, so later commands load the programs earlier ones compiled), or
run to its first missing resource (checkpoints, the Debian mirror), where it must stop with its
documented one-line `error: …` message and no traceback. The accelerator benchmark's `--smoke`
run is `tests/test_accelerator.py`'s (checked to be the README's command, not run twice).
`EXCLUDED` names the commands not run, each with its reason. A command the README gains and this file does not cover fails
`test_every_readme_command_is_covered`.
"""

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

EVAL_T0 = "python -m specdec_t5x.eval --gin_file=gin/experiments/embedded_ende_model_t0.gin"
EVAL_README = EVAL_T0 + " --gin.NUM_EXAMPLES=100 --gin.EVAL_OUTPUT_DIR=\"'runs/ende_t0'\""
QUICK = f"{EVAL_T0} --quick"
FULL = f"{EVAL_T0} --gin.GAMMAS=None"
RESUME = f"{FULL} --resume"
DECODE = (
    "python -m specdec_t5x.decode --gin_file=gin/experiments/embedded_ende_model_t0.gin "
    "'translate English to German: a small image viewer'"
)
DEMO = "bash scripts/demo.sh"
REPEAT = "python scripts/repeat_rows.py demo --out runs/demo_repeated"
ACCELERATOR = "python -m benchmarks.accelerator --out_dir results/accelerator"

# Not run by the test suite, and why.
EXCLUDED = {
    "bash scripts/test.sh": "the test suite itself (it runs this file)",
    "pip install -e .": "installs into the environment from the package index (test.sh does)",
    'pip install -e ".[hf]"': "installs into the environment from the package index",
    "pip install": "the install step named in prose (builds the CPU kernels): as above",
}

# Small sizes: every eval command runs these shapes, so the compilation cache is shared.
SIZES = [
    "--gin.NUM_EXAMPLES=3",
    "--gin.INPUT_LEN=32",
    "--gin.TARGET_LEN=8",
    "--gin.BATCH_SIZE=1",
    "--gin.COST_REPEATS=2",
]


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands(text: str) -> list[str]:
    """Every shell command of the README, normalized (`shlex`: comments and continuations gone,
    quoting as `shlex.join` writes it), in the README's order."""
    commands = []
    for block in _fenced(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                commands.append(shlex.join(tokens))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # inline code outside blocks
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if re.match(r"(python|bash|pip) ", span):
            commands.append(span if span.startswith("pip ") else shlex.join(shlex.split(span)))
    return list(dict.fromkeys(commands))


def _norm(command: str) -> str:
    return shlex.join(shlex.split(command))


COVERED = {  # run by the tests below (README order)
    _norm(DEMO): "test_demo_stops_at_the_first_missing_resource_in_one_line",
    _norm(REPEAT): "test_repeat_rows_as_written",
    _norm(EVAL_README): "test_eval_quick_resume_and_decode_as_the_readme_shows",
    _norm(QUICK): "test_eval_quick_resume_and_decode_as_the_readme_shows",
    _norm(FULL): "test_eval_quick_resume_and_decode_as_the_readme_shows",
    _norm(RESUME): "test_eval_quick_resume_and_decode_as_the_readme_shows",
    _norm(DECODE): "test_eval_quick_resume_and_decode_as_the_readme_shows",
    "PAPER": "test_paper_row_stops_at_the_missing_checkpoint_in_one_line",
    _norm(ACCELERATOR): "test_accelerator_benchmark_as_written_runs_in_its_own_test",
}


def _paper_command(commands: list[str]) -> str:
    (paper,) = [c for c in commands if "paper_ende_small_t0.gin" in c]
    return paper


def test_every_readme_command_is_covered():
    commands = readme_commands(README.read_text())
    assert len(commands) >= 10
    paper = _paper_command(commands)
    covered = {k for k in COVERED if k != "PAPER"} | {paper} | set(EXCLUDED)
    new = [c for c in commands if c not in covered]
    assert not new, f"README commands no test runs (add them to {__name__}): {new}"
    gone = sorted(covered - set(commands))
    assert not gone, f"covered commands the README no longer shows: {gone}"


# ---------------------------------------------------------------------------------------------
# Running them.


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(a folder that stands for the repository's runs/, one compilation cache for every
    command)."""
    root = tmp_path_factory.mktemp("readme")
    (root / "cache").mkdir()
    return root


def _env(shared, data_dir, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        SPECDEC_DATA_DIR=str(data_dir),
        SPECDEC_COMPILATION_CACHE=str(shared / "cache"),
        SPECDEC_COST_CURVE_CACHE="0",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        **extra,
    )
    return env


def _argv(command: str, shared: pathlib.Path, sizes=SIZES) -> list[str]:
    """The README's command with the interpreter running the tests, its output folder under
    `shared` and the size macros small."""
    argv = shlex.split(command)
    assert argv[0] == "python"
    argv[0] = sys.executable
    out = None
    for i, arg in enumerate(argv):
        if arg.startswith("--gin.EVAL_OUTPUT_DIR="):
            folder = arg.split("=", 1)[1].strip("'\"")
            out = shared / folder.lstrip("/")
            argv[i] = f"--gin.EVAL_OUTPUT_DIR='{out}'"
    if out is None and "specdec_t5x.eval" in argv:  # the experiment file's runs/<row>
        out = shared / "runs" / "embedded_ende_model_t0"
        argv.append(f"--gin.EVAL_OUTPUT_DIR='{out}'")
    texts = [a for a in argv[3:] if not a.startswith("-")]
    flags = [a for a in argv[3:] if a.startswith("-")]
    return [*argv[:3], *flags, *sizes, *texts]


def _run(argv, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _one_error_line(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit status 1 and stderr ending in exactly one `error: …` line containing `expected`."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last, result.stderr[-3000:]
    assert sum(line.startswith("error: ") for line in result.stderr.splitlines()) == 1


def _metrics(folder: pathlib.Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


@pytest.mark.slow
def test_eval_quick_resume_and_decode_as_the_readme_shows(shared, data_dir):
    """The eval job's section, then the quick-mode section, in the README's order: a run, two
    smoke runs (the second replaces the first's folder), a run Ctrl-C'd in its decode loop and
    resumed, and the decode CLI."""
    env = _env(shared, data_dir)
    ran = _run(_argv(EVAL_README, shared), env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = _metrics(shared / "runs" / "ende_t0")
    assert metrics["task"]["num_examples"] == 3 and "auto" in metrics
    assert {"compile", "decode"} <= set(metrics["provenance"]["phases_s"])

    quick_dir = shared / "runs" / "embedded_ende_model_t0_quick"
    for _ in range(2):  # the README's smoke run, twice: its own folder, replaced each time
        ran = _run(_argv(QUICK, shared), env)
        assert ran.returncode == 0, ran.stderr[-3000:]
        quick = _metrics(quick_dir)
        assert quick["task"]["num_examples"] == 3
        assert "auto" not in quick  # no auto-γ row unless asked
    assert not (shared / "runs" / "embedded_ende_model_t0").exists()  # the full run's folder

    ddtp = data_dir / "ddtp_ende" / "test.jsonl"  # four sentences: Ctrl-C after the first
    first = json.loads(ddtp.read_text().splitlines()[0])
    with open(ddtp, "a") as f:
        f.write(json.dumps({**first, "en": first["en"] + " Again."}, ensure_ascii=False) + "\n")
    sizes = [s for s in SIZES if "NUM_EXAMPLES" not in s] + ["--gin.NUM_EXAMPLES=4"]
    proc = subprocess.Popen(
        _argv(FULL, shared, sizes),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in proc.stdout:  # "Ctrl-C it": at the first decoded batch
        seen.append(line)
        if "decoded 1/4 batches" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, ("".join(seen) + rest)[-3000:]
    full_dir = shared / "runs" / "embedded_ende_model_t0"
    assert not (full_dir / "metrics.json").exists()
    ran = _run(_argv(RESUME, shared, sizes), env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = _metrics(full_dir)
    assert metrics["provenance"]["resumed"]["batches_restored"] >= 1
    assert metrics["task"]["num_examples"] == 4

    sizes = ["--gin.INPUT_LEN=32", "--gin.TARGET_LEN=8"]  # decode takes no examples or folder
    ran = _run(_argv(DECODE, shared, sizes), env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "speculative (γ = 2, T = 0)" in ran.stdout and "identical: True" in ran.stdout


def test_paper_row_stops_at_the_missing_checkpoint_in_one_line(shared, data_dir):
    """The paper's row needs T5X checkpoints (and TFDS): it stops at the first one, in one line."""
    paper = _paper_command(readme_commands(README.read_text()))
    ran = _run(_argv(paper, shared), _env(shared, data_dir))
    _one_error_line(ran, "T5X checkpoint path '/ckpt/")
    assert "does not exist" in ran.stderr


def test_demo_stops_at_the_first_missing_resource_in_one_line(shared, tmp_path):
    """demo.sh as written, its size knobs small, the test's interpreter (`PYTHON`) and an empty
    data folder: its first missing resource here is the Debian mirror of the corpus build
    (SPECDEC_DEBIAN_MIRROR at a folder with no archive; without apt-get, apt-get is), where it
    stops with one line before any eval run. (The whole demo costs minutes of compiling; the
    eval commands it runs are the ones the eval test runs.)"""
    argv = shlex.split(DEMO)
    env = _env(
        shared,
        tmp_path / "no_corpus",
        PYTHON=sys.executable,
        NUM_EXAMPLES="2",
        BASE_EXAMPLES="1",
        OUT=str(tmp_path / "demo"),
        SPECDEC_DEBIAN_MIRROR=(tmp_path / "no_mirror").as_uri(),
    )
    ran = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    expected = "did not deliver Packages" if os.path.exists("/usr/bin/apt-get") else "apt-get"
    _one_error_line(ran, expected)
    assert not (tmp_path / "demo").exists()  # stopped before the first eval run


@pytest.mark.slow
def test_repeat_rows_as_written(shared, data_dir):
    """`repeat_rows.py demo --out …`: its size knobs (one row, one repeat) and the eval sizes."""
    argv = _argv(REPEAT, shared, [])
    out = shared / "demo_repeated"
    argv[argv.index("--out") + 1] = str(out)
    argv += ["--rows", "embedded_t0", "--repeats", "1", *SIZES]
    ran = _run(argv, _env(shared, data_dir))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (out / "embedded_t0" / "run0" / "metrics.json").exists()
    assert "| ddtp_ende |" in (out / "table.md").read_text()


def test_accelerator_benchmark_as_written_runs_in_its_own_test():
    """The accelerator benchmark's size knob is `--smoke` (tiny shapes on the CPU; the full run
    needs an accelerator). `tests/test_accelerator.py` runs exactly that (`benchmarks.accelerator`'s
    `main` with `--out_dir` under its tmp folder and `--smoke`, in a subprocess, ~3 min at load 9):
    not run twice, checked to be the README's command."""
    argv = shlex.split(ACCELERATOR)
    assert argv[:3] == ["python", "-m", "benchmarks.accelerator"] and argv[3] == "--out_dir"
    other = (ROOT / "tests" / "test_accelerator.py").read_text()
    assert "def test_smoke_runs_without_gin_seqio_tf_and_writes_results(" in other
    assert "accelerator.main(['--out_dir', {str(tmp_path)!r}, '--smoke'])" in other


def test_accelerator_benchmark_as_written_stops_in_one_line_without_an_accelerator(tmp_path):
    """As the README shows it (no `--smoke`), on a machine whose JAX sees only the CPU, the
    benchmark stops at once with one `error:` line instead of building a 10.7B model."""
    argv = shlex.split(ACCELERATOR)
    argv[argv.index("--out_dir") + 1] = str(tmp_path / "accelerator")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    ran = subprocess.run(
        [sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 2, ran.stderr[-2000:]
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: the full benchmark") and "--smoke" in lines[-1]
    assert "Traceback" not in ran.stderr and not (tmp_path / "accelerator").exists()
