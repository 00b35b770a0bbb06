"""Flags of the main job: `python -m specdec_t5x.eval --gin_file=... [--gin.KEY=VALUE ...]`.

T5X-style flags: `--gin_file` (repeatable; paths or names relative to the repository, e.g.
`gin/experiments/embedded_ende_model_t0.gin`) and `--gin.KEY=VALUE` bindings (e.g.
`--gin.NUM_EXAMPLES=20`, `--gin.EVAL_OUTPUT_DIR="'/tmp/out'"`), plus `--quick`, `--overwrite`,
`--resume`, `--verbose`, the compilation cache's flags and `--help` (`USAGE`). Runs
`job.evaluate` as bound by `gin/runs/eval.gin`, saves the operative config with the results and
prints the table row. Several processes (`multihost`): add T5X's
`--coordinator_address=HOST:PORT --process_count=N --process_index=I` (or `--multiprocess` where
`jax.distributed` detects them). Ctrl-C stops after the call in progress with exit status 130,
the finished examples on disk (`--resume` continues them). An error prints one line,
`error: ...` (exit status 1; `--verbose` adds the traceback).

JAX's persistent compilation cache is on for the command-line tools (this job and
`specdec_t5x.decode`; library code never sets it): compiled programs are kept in
`~/.cache/specdec_t5x/jax_cache` (beside the corpus, `~/.cache/specdec_t5x/data`) and a second
run of the same shapes loads them instead of compiling (`use_compilation_cache`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

import gin
import jax

from specdec_t5x import gin_utils, multihost, provenance
from specdec_t5x.eval import job, outputs, summary, tables
from specdec_t5x.eval.pairs import PER_CALL_PARAMETERS, PER_CALL_ROUTE, parse_config  # noqa: F401

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (imported by seqio) is chatty

USAGE = """usage: python -m specdec_t5x.eval --gin_file=FILE [--gin_file=...] [--gin.KEY=VALUE ...]
                                  [--quick] [--overwrite] [--resume] [--verbose]
                                  [--compilation_cache_dir=DIR | --no_compilation_cache]

The main job: baseline vs speculative decoding of a seqio task split, timed side by side.

flags:
  --gin_file=FILE     a gin file (repeatable), e.g. gin/experiments/embedded_ende_model_t0.gin
  --gin.KEY=VALUE     a gin binding, e.g. --gin.NUM_EXAMPLES=20 --gin.EVAL_OUTPUT_DIR="'/tmp/out'"
  --quick             a smoke run: gin/runs/quick.gin (10 examples, step-timer costs, 10 repeats,
                      no auto-γ row), written to EVAL_OUTPUT_DIR + '_quick' (the next --quick
                      replaces it)
  --overwrite         replace another run's outputs in EVAL_OUTPUT_DIR
  --resume            continue an interrupted run in EVAL_OUTPUT_DIR (same settings; not auto γ)
  --verbose           on an error, the traceback beside the one-line message
  --compilation_cache_dir=DIR   JAX's persistent compilation cache (default
                      $SPECDEC_COMPILATION_CACHE or ~/.cache/specdec_t5x/jax_cache): a second run
                      of the same shapes loads its compiled programs instead of compiling them
  --no_compilation_cache        compile everything afresh (or SPECDEC_COMPILATION_CACHE=0)
  --help              this text

commonly overridden macros (gin/runs/eval.gin):
  EVAL_OUTPUT_DIR  results folder (required)       NUM_EXAMPLES  examples decoded (100)
  GAMMA            γ: int >= 1 or 'auto'           GAMMAS        extra sweep rows ([...] or None)
  TEMPERATURE      0 = argmax; TOPK / TOPP filters BATCH_SIZE    examples per call (1)
  INPUT_LEN        encoder length (64)             TARGET_LEN    max decode length (64)
  SPLIT            task split ('test')             SEED          sampling seed (0)
  DIAGNOSTICS      where the time goes, and (LOOP_COSTS, True) c from the run's own calls (False)
  TREES            token-tree rows, e.g. "[(2, 2), ((0,), (1,), (0, 0))]"   TREE_RULE  at T > 0
"""

QUICK_GIN = "gin/runs/quick.gin"

# JAX's persistent compilation cache, set by the command-line tools only (`use_compilation_cache`).
CACHE_ENV_VAR = "SPECDEC_COMPILATION_CACHE"  # a folder, or "0": off
# Beside the corpus (`data.corpora.default_data_dir`: ~/.cache/specdec_t5x/data).
DEFAULT_CACHE_DIR = "~/.cache/specdec_t5x/jax_cache"
# Every program is kept: on the CPU most of the job's programs compile in well under JAX's
# default threshold of 1 s, yet together they are most of the compile phase.
CACHE_MIN_COMPILE_TIME_S = 0.0
CACHE_MIN_ENTRY_SIZE_BYTES = 0  # JAX's default: no size floor


def parse_flags(argv: Sequence[str]) -> tuple[list[str], list[str], dict]:
    """Splits argv into gin files, bindings and switches ({'overwrite', 'resume', 'help',
    'quick', 'verbose', 'no_compilation_cache': bool, 'compilation_cache_dir': str or None}).

    `--quick` appends `QUICK_GIN` after the given gin files (and `main` writes its outputs to
    their own folder: `quick_output_dir`).

    Raises:
      ValueError: an unknown argument, or no --gin_file (without --help).
    """
    files, bindings = [], []
    switches = {"overwrite": False, "resume": False, "help": False, "quick": False}
    switches.update(verbose=False, no_compilation_cache=False, compilation_cache_dir=None)
    for arg in argv:
        if arg.startswith("--gin_file="):
            files.append(arg.split("=", 1)[1])
        elif arg.startswith("--gin."):
            bindings.append(arg[len("--gin.") :])
        elif arg.startswith("--compilation_cache_dir="):
            switches["compilation_cache_dir"] = arg.split("=", 1)[1]
        elif arg in ("--help", "-h"):
            switches["help"] = True
        elif arg.startswith("--") and switches.get(arg[2:]) is False:
            switches[arg[2:]] = True
        else:
            raise ValueError(
                f"unknown argument {arg!r}; expected --gin_file=FILE, --gin.KEY=VALUE, --quick, "
                "--overwrite, --resume, --verbose, --compilation_cache_dir=DIR, "
                "--no_compilation_cache or --help."
            )
    if not files and not switches["help"]:
        raise ValueError("at least one --gin_file is required (see gin/experiments/; --help).")
    if switches["quick"]:
        files.append(QUICK_GIN)
    return files, bindings, switches


QUICK_SUFFIX = "_quick"


def quick_output_dir(output_dir: str) -> str:
    """Where a `--quick` run writes: `EVAL_OUTPUT_DIR` + '_quick' (runs/x -> runs/x_quick), so a
    smoke run never takes the folder of the full run, and the next smoke run replaces it."""
    output_dir = str(output_dir).rstrip("/")
    return output_dir if output_dir.endswith(QUICK_SUFFIX) else output_dir + QUICK_SUFFIX


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Runs the job; returns its metrics (None for --help). Exit status 130 on Ctrl-C."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, distributed = multihost.split_flags(argv)  # T5X's --coordinator_address etc.
    files, bindings, switches = parse_flags(rest)
    if switches["help"]:
        print(USAGE)
        return None
    if not logging.getLogger().handlers:  # one line per phase, with its time
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
        )
    use_compilation_cache(
        compilation_cache_dir(switches["compilation_cache_dir"], switches["no_compilation_cache"])
    )
    if distributed is not None:
        multihost.initialize(**distributed)  # before any JAX work (gin may load parameters)
    parse_config(files, bindings, finalize=False)
    overwrite = switches["overwrite"]
    if switches["quick"]:  # a smoke run: its own folder, replaced by the next smoke run
        quick_dir = quick_output_dir(gin.query_parameter("%EVAL_OUTPUT_DIR"))
        gin.parse_config([f"EVAL_OUTPUT_DIR = {quick_dir!r}"])
        overwrite = overwrite or not switches["resume"]
    gin.finalize()
    evaluate = gin.get_configurable(job.evaluate)
    metrics = evaluate(
        command="python -m specdec_t5x.eval " + " ".join(argv),
        overwrite=overwrite,
        resume=switches["resume"],
    )
    # Written once, after the call: only then does the operative config hold every value used.
    out_dir = gin.query_parameter("%EVAL_OUTPUT_DIR")
    outputs.write_atomic(
        os.path.join(out_dir, provenance.OPERATIVE_CONFIG), gin_utils.operative_config()
    )
    print_results(metrics, out_dir)
    return metrics


def print_results(metrics: dict, out_dir: str) -> None:
    """The console's summary of a run: its table rows (`tables.rows`), speed-up, where it went."""
    flat = summary.flat(metrics)
    print(tables.TABLE_HEADER)
    print("\n".join(tables.rows(metrics)))
    print(tables.THM38_LEGEND)
    print(json.dumps({k: flat[k] for k in ("identical_fraction", "speedup")}))
    if "weight_flips" in flat:  # CPU_WEIGHT_DTYPE='bfloat16': what the rounding changed
        flips = flat["weight_flips"]
        print(
            f"bfloat16 CPU weights: {flips['num_flipped']} of {flat['num_examples']} greedy "
            f"baselines differ from float32 weights (max float32 logit gap at the flip: "
            f"{flips['max_float32_logit_gap']}); details: metrics.json 'exactness'"
        )
    print(f"results: {out_dir}")


def add_cache_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the command-line tools' shared flags: --compilation_cache_dir=DIR,
    --no_compilation_cache and --verbose (`use_cache_flags` applies the first two)."""
    parser.add_argument("--compilation_cache_dir", metavar="DIR")
    parser.add_argument("--no_compilation_cache", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    return parser


def use_cache_flags(args: argparse.Namespace) -> None:
    """`use_compilation_cache` as `add_cache_flags`' flags ask."""
    use_compilation_cache(
        compilation_cache_dir(args.compilation_cache_dir, args.no_compilation_cache)
    )


def compilation_cache_dir(flag_dir: str | None = None, off: bool = False) -> str | None:
    """The folder of JAX's persistent compilation cache for a command-line run, or None (off).

    In order: `--no_compilation_cache` (`off`) or `SPECDEC_COMPILATION_CACHE=0`: None;
    `--compilation_cache_dir=DIR` (`flag_dir`); `$SPECDEC_COMPILATION_CACHE`; JAX's own
    `JAX_COMPILATION_CACHE_DIR` where set; `DEFAULT_CACHE_DIR`. `~` is expanded.
    """
    env = os.environ.get(CACHE_ENV_VAR, "").strip()
    if off or (env == "0" and not flag_dir):
        return None
    chosen = flag_dir or env or jax.config.jax_compilation_cache_dir or DEFAULT_CACHE_DIR
    return os.path.expanduser(chosen)


def use_compilation_cache(directory: str | None) -> None:
    """Turns JAX's persistent compilation cache on at `directory` (None: off), for every program.

    Called by the command-line tools before any JAX work; library code never calls it. The
    cache keys on the program, its shapes, the JAX and XLA versions, flags and devices, so a
    stale entry is never used; a second run of the same job loads its programs from disk
    instead of compiling them (the job's 'compile and warm up' phase). The folder grows by the
    programs of each new configuration (no size cap: JAX's needs the `filelock` package); delete
    it to start afresh.
    """
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", directory)
    jax_logger = logging.getLogger("jax._src.compilation_cache")
    level = jax_logger.level
    jax_logger.setLevel(logging.WARNING)  # not its "Resetting cache" line
    try:
        compilation_cache.reset_cache()  # the next compile opens `directory` (JAX opens it once)
    finally:
        jax_logger.setLevel(level)
    if directory is None:
        return
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_TIME_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", CACHE_MIN_ENTRY_SIZE_BYTES)
    logging.getLogger(__name__).info(
        "JAX compilation cache: %s (--no_compilation_cache or %s=0: off)", directory, CACHE_ENV_VAR
    )


def error_line(err: BaseException) -> str:
    """`error: <message>`: the first line of the error's message (gin's "In call to
    configurable ..." context and any usage text after it dropped). The project's own errors
    (ValueError, OSError) name the bad value and what was expected; any other error is a bug
    or a surprise, so its type and a pointer to `--verbose` come with it."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if isinstance(err, ValueError | OSError) and lines:
        return f"error: {lines[0]}"
    message = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return f"error: {message} (--verbose prints the traceback)"


def run_command(main_fn: Callable[[list[str]], object], argv: Sequence[str]) -> None:
    """Runs a command-line `main_fn(argv)`; an error exits with status 1 after one line on
    stderr (`error_line`; with `--verbose` in argv, the traceback before it)."""
    try:
        main_fn(list(argv))
    except Exception as err:  # noqa: BLE001 - every error reaches the user as one line
        if "--verbose" in argv:
            traceback.print_exc()
        sys.stdout.flush()
        print(error_line(err), file=sys.stderr, flush=True)
        sys.exit(1)


def run(argv: Sequence[str] | None = None) -> None:
    """`main` for the command line: errors as one line (`run_command`), Ctrl-C as exit status
    130."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        run_command(main, argv)
    except KeyboardInterrupt:
        logging.getLogger(__name__).warning(
            "interrupted: the finished examples are on disk; --resume continues the run."
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # no interpreter teardown under a running XLA runtime
