"""The eval job's output folder: guarded, written atomically, resumable, interruptible.

* `OutputDir.open` refuses a folder that holds another run's files (unless `overwrite`, which
  removes this job's known outputs first, stale plot included) or that another live job is
  writing (a lock file holding its pid).
* Every file is written whole or not at all (`write_atomic`: a temporary file, then
  `os.replace`), so an interrupt never leaves a half-written `metrics.json`.
* `records.jsonl` grows by one line per finished decode batch (every row's tokens, seconds and
  statistics, and the cost calls' timings) and `predictions.jsonl` by one line per finished
  example; `resume` restores the finished batches from `records.jsonl` and decodes the rest.
* `Interrupts` turns the first SIGINT into a flag the job checks between calls (a second one
  interrupts at once), so Ctrl-C stops after the call in progress (or the compilation in
  progress: XLA cannot be interrupted) with what was finished on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import signal
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"  # the run's fingerprint and configuration, written first
RECORDS = "records.jsonl"  # one line per finished batch: what `resume` restores
PREDICTIONS = "predictions.jsonl"
LOCK = ".lock"
# Everything a run of the job writes (the entry point adds the operative gin config).
KNOWN_OUTPUTS = (
    RUN_FILE,
    RECORDS,
    PREDICTIONS,
    "metrics.json",
    "table_row.md",
    "speedup.png",
    "operative_config.gin",
)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` whole or not at all (temporary file in the same folder + rename)."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str | os.PathLike, value: Any) -> None:
    """`write_atomic` of `value` as indented JSON (NumPy scalars as floats)."""
    write_atomic(path, json.dumps(value, indent=2, default=float) + "\n")


def fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of a JSON-ready run configuration (equal configs, equal fingerprints)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputDir:
    """One run's output folder; use `open`, then `append_batch` per batch, `close` at the end.

    Attributes:
      path: the folder.
      restored: the `records.jsonl` lines of a resumed run (batch index -> record), else {}.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.restored: dict[int, dict[str, Any]] = {}
        self._locked = False

    def open(self, config: Mapping[str, Any], *, overwrite: bool, resume: bool) -> OutputDir:
        """Claims the folder for a run of `config` (JSON-ready).

        Args:
          config: what the run depends on (settings, task, model shapes); its `fingerprint`
            must match for `resume`.
          overwrite: remove this job's known outputs from a used folder and start afresh.
          resume: continue the run recorded in the folder (same fingerprint).

        Raises:
          ValueError: both flags; a folder with files from another run (without `overwrite` or
            `resume`); `resume` of a folder with no run, another configuration or a finished run;
            a folder another live job is writing.
        """
        if overwrite and resume:
            raise ValueError("pass --overwrite or --resume, not both.")
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        present = sorted(p.name for p in self.path.iterdir() if p.name != LOCK)
        run_file = self.path / RUN_FILE
        expected = fingerprint(config)
        if resume:
            if not run_file.exists():
                self._refuse(f"--resume: {self.path} holds no run to resume ({RUN_FILE} missing).")
            recorded = json.loads(run_file.read_text())
            if recorded.get("fingerprint") != expected:
                changed = sorted(
                    k
                    for k in {*config, *recorded.get("config", {})}
                    if config.get(k) != recorded.get("config", {}).get(k)
                )
                self._refuse(
                    f"--resume: {self.path} holds a run of another configuration (differs in: "
                    f"{', '.join(changed) or 'the model'}); resume with the same settings, or "
                    "pass --overwrite."
                )
            if (self.path / "metrics.json").exists():
                self._refuse(f"--resume: the run in {self.path} is finished (metrics.json).")
            self.restored = self._read_records()
            self._keep_recorded_predictions()
            logger.info("resuming: %d finished batches restored", len(self.restored))
            return self
        if present and not overwrite:
            self._refuse(
                f"output folder {self.path} is not empty ({', '.join(present[:5])}"
                f"{', ...' if len(present) > 5 else ''}): pass --overwrite to replace this job's "
                "outputs there, --resume to continue an interrupted run of the same "
                "configuration, or choose another EVAL_OUTPUT_DIR."
            )
        for name in KNOWN_OUTPUTS:
            (self.path / name).unlink(missing_ok=True)
        write_json(run_file, {"fingerprint": expected, "config": dict(config)})
        return self

    def _refuse(self, message: str) -> None:
        self.close()
        raise ValueError(message)

    def _lock(self) -> None:
        lock = self.path / LOCK
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(lock.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _alive(pid):
                    raise ValueError(
                        f"another job (pid {pid}) is writing to {self.path}; wait for it or "
                        "choose another EVAL_OUTPUT_DIR."
                    ) from None
                lock.unlink(missing_ok=True)  # left by a job that died
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self._locked = True
            return

    def _read_records(self) -> dict[int, dict[str, Any]]:
        records = {}
        path = self.path / RECORDS
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the interrupt: decoded again
                    break
                records[int(record["batch"])] = record
        return records

    def append_batch(self, record: Mapping[str, Any], predictions: list[Mapping]) -> None:
        """Appends one finished batch's prediction lines, then its record (`resume` keeps the
        prediction lines of the recorded batches only: `_keep_recorded_predictions`)."""
        self.append_predictions(predictions)
        with open(self.path / RECORDS, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")

    def append_predictions(self, predictions: list[Mapping]) -> None:
        """Appends `predictions.jsonl` lines (the file's one writer)."""
        with open(self.path / PREDICTIONS, "a") as f:
            for row in predictions:
                f.write(json.dumps(row, ensure_ascii=False, default=float) + "\n")

    def _keep_recorded_predictions(self) -> None:
        """Cuts `predictions.jsonl` to the restored batches' examples (an interrupt may have left
        a batch's lines without its record, or a cut line)."""
        path = self.path / PREDICTIONS
        keep = sum(len(r["runs"]["baseline"]["tokens"]) for r in self.restored.values())
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        lines = [line for line in lines[:keep] if line.endswith("\n")]
        if len(lines) != keep:
            self._refuse(
                f"--resume: {path} holds {len(lines)} complete lines for the {keep} examples "
                "of the recorded batches; run again with --overwrite."
            )
        write_atomic(path, "".join(lines))

    def close(self) -> None:
        """Releases the folder's lock."""
        if self._locked:
            (self.path / LOCK).unlink(missing_ok=True)
            self._locked = False


class Interrupts:
    """SIGINT as a flag: `check()` raises `KeyboardInterrupt` at the job's safe points.

    Inside `watch()`, the first SIGINT only sets the flag (logged); a second one raises at once.
    Outside the main thread signals cannot be caught: `watch` is then a no-op.
    """

    def __init__(self):
        self.requested = False

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        logger.warning("interrupt: stopping after the call in progress (Ctrl-C again: now).")

    @contextlib.contextmanager
    def watch(self) -> Iterator[Interrupts]:
        try:
            previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def check(self) -> None:
        """Raises `KeyboardInterrupt` if an interrupt was requested."""
        if self.requested:
            raise KeyboardInterrupt


def encode_stats(stats) -> dict[str, Any] | None:
    """A call's statistics dataclass (`SpeculativeStats` or a tree's; NumPy, [batch, ...] per
    field) as JSON: {'__class__': 'module:name', field: [dtype, list], ...}."""
    if stats is None:
        return None
    out = {"__class__": f"{type(stats).__module__}:{type(stats).__qualname__}"}
    for f in dataclasses.fields(stats):
        value = np.asarray(getattr(stats, f.name))
        out[f.name] = [str(value.dtype), value.tolist()]
    return out


def decode_stats(record: Mapping[str, Any] | None):
    """Inverse of `encode_stats`: the statistics dataclass of NumPy arrays, or None."""
    if record is None:
        return None
    from specdec_t5x import speculative, tree  # local: the network, for restored runs only

    classes = {
        f"{c.__module__}:{c.__qualname__}": c
        for c in (speculative.SpeculativeStats, tree.TreeStats)
    }
    cls = classes[record["__class__"]]
    fields = {k: np.asarray(v[1], v[0]) for k, v in record.items() if k != "__class__"}
    return cls(**fields)
