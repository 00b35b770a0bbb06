"""Trains a model with `specdec_t5x.train.train`, configured by gin.

    python scripts/train.py --gin_file=gin/models/embedded_ende_target.gin \
        --gin_file=gin/runs/train.gin --gin.RUN_DIR="'train_runs/target'" --gin.NUM_STEPS=1000

Writes into RUN_DIR, besides what `train` writes: `command.txt`, `config.gin` (as parsed),
`operative_config.gin` (values actually used), `environment.json` (commit, hardware, versions).
Runs unchanged on CPU and GPU (JAX picks the backend).
"""

import argparse
import json
import logging
import os
import pathlib
import platform
import shlex
import subprocess
import sys

import gin
import jax

from specdec_t5x import gin_utils, train

REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO).stdout.strip()
    except OSError:
        return ""


def environment() -> dict:
    """Commit, hardware and library versions, for the run folder."""
    cpu = [ln for ln in _run("lscpu").splitlines() if ln.startswith("Model name")]
    return {
        "commit": _run("git", "rev-parse", "HEAD"),
        "dirty_files": _run("git", "status", "--porcelain").splitlines(),
        "platform": platform.platform(),
        "cpu": cpu[0].split(":", 1)[1].strip() if cpu else platform.processor(),
        "nproc": os.cpu_count(),
        "jax_devices": [str(d) for d in jax.devices()],
        "versions": {"python": platform.python_version(), "jax": jax.__version__},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", default=[], help="repeatable")
    args, rest = parser.parse_known_args()
    bad = [a for a in rest if not a.startswith("--gin.")]
    if bad:
        parser.error(f"unrecognised arguments {bad} (bindings are --gin.KEY=VALUE)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    gin_utils.parse(args.gin_file, [a[len("--gin.") :] for a in rest])
    run_dir = pathlib.Path(gin.query_parameter("%RUN_DIR"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text(shlex.join([sys.executable, *sys.argv]) + "\n")
    (run_dir / "config.gin").write_text(gin.config_str())
    (run_dir / "environment.json").write_text(json.dumps(environment(), indent=2) + "\n")
    final = gin.get_configurable(train.train)()
    (run_dir / "operative_config.gin").write_text(gin_utils.operative_config())
    print(json.dumps(final, indent=2))


if __name__ == "__main__":
    main()
