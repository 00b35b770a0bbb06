"""Trains a model with `specdec_t5x.training.train.train`, configured by gin.

    python scripts/train.py --gin_file=gin/models/embedded_ende_target.gin \
        --gin_file=gin/runs/train.gin --gin.RUN_DIR="'train_runs/target'" --gin.NUM_STEPS=1000

Writes into RUN_DIR, besides what `train` writes: `command.txt`, `config.gin` (as parsed),
`operative_config.gin` (values actually used), `environment.json` (`provenance.record`: command,
commit, hardware, date; plus the dirty files).
Runs unchanged on CPU and GPU (JAX picks the backend).
"""

import argparse
import json
import logging
import pathlib
import shlex
import sys

import gin

from specdec_t5x import gin_utils, provenance
from specdec_t5x.training import train


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
    command = shlex.join([sys.executable, *sys.argv])
    (run_dir / "command.txt").write_text(command + "\n")
    (run_dir / "config.gin").write_text(gin.config_str())
    env = {**provenance.record(command), "dirty_files": provenance.dirty_files()}
    (run_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    final = gin.get_configurable(train.train)()
    provenance.write_operative_config(run_dir, gin_utils.operative_config())
    print(json.dumps(final, indent=2))


if __name__ == "__main__":
    main()
