"""A JSON cache of auto γ's cost curves across runs (`AutoGammaDecoder`'s `cost_cache`).

A measured and calibrated curve takes minutes and depends only on what `curve_key` names: the
model pair, shapes, settings, machine and the timed code; any change gives another key, so a
stale curve is never read back. One JSON file per key under ~/.cache/specdec_t5x/cost_curves/
(`SPECDEC_COST_CURVE_CACHE=DIR` moves it, `=0` turns it off). The machine's load at run time is
the gate's to judge (`speculation_gate`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from specdec_t5x.timing import cost_curve

logger = logging.getLogger(__name__)

ENV = "SPECDEC_COST_CURVE_CACHE"
DEFAULT_DIR = pathlib.Path.home() / ".cache" / "specdec_t5x" / "cost_curves"
OFF = ("", "0", "off", "false")  # settings that turn the cache off
FORMAT = 1  # the cache file's layout; bump to drop every older entry

# Modules whose code decides what a cost curve measures (any edit invalidates the cache).
_CODE = """timing/cost_curve.py timing/step_timer.py timing/loops.py timing/overheads.py
timing/clock.py speculative.py decoding.py models.py network.py steps.py sampling.py
verification.py cpu_kernel/ops.py cpu_kernel/params.py cpu_kernel/extension.py
cpu_kernel/matmul.cc cpu_kernel/attention.cc cpu_kernel/attention_simd.h network_layers.py
network_attention.py loop.py speculative_model.py speculation.py drafts.py draft_base.py""".split()


def code_hash() -> str:
    """sha256 over the package version and the timed modules' sources (missing files named)."""
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        from importlib import metadata

        digest.update(metadata.version("specdec_t5x").encode())
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        digest.update(b"unversioned")
    for name in _CODE:
        path = root / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    return digest.hexdigest()


def params_fingerprint(params, checksum_leaves: int = 4) -> dict[str, Any]:
    """{'structure': sha256 of every leaf's path, shape and dtype, 'checksum': Σ of up to 4096
    values of `checksum_leaves` leaves spread over the tree}: cheap, no full pass."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    digest = hashlib.sha256()
    arrays = []
    for path, leaf in leaves:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        digest.update(f"{jax.tree_util.keystr(path)}:{shape}:{dtype};".encode())
        if shape is not None and dtype is not None:
            arrays.append(leaf)
    checksum = []
    if arrays:
        picks = np.unique(np.linspace(0, len(arrays) - 1, min(checksum_leaves, len(arrays))))
        for i in picks.astype(int):
            flat = np.asarray(arrays[i]).reshape(-1)[:4096]
            checksum.append(float(np.sum(flat.astype(np.float64))))
    return {"structure": digest.hexdigest(), "checksum": checksum}


def machine() -> dict[str, Any]:
    """The CPU and kernel path, usable cores, ISA override, XLA flags, JAX version and backend."""
    from specdec_t5x import cpu_kernel, provenance

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": provenance.cpu_identity(),
        "kernel_path": cpu_kernel.kernel_path(),
        "cores": cores,
        "isa_override": os.environ.get("SPECDEC_CPU_ISA"),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }


def curve_key(
    spec_model,
    target_params,
    draft_params,
    encoder_shape,
    max_decode_len: int,
    measurement: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything a measured (and calibrated) curve depends on, as JSON-able values: the pair
    (its (packed) parameters' fingerprints and configs), `encoder_shape` [batch, input length],
    `max_decode_len`, `measurement` (γmax, settings, repeats, rounds, ...), machine and code."""
    module_config = getattr(getattr(spec_model, "module", None), "config", None)
    draft = getattr(spec_model, "draft", None)
    return {
        "format": FORMAT,
        "pair": {
            "target": params_fingerprint(target_params),
            "draft": params_fingerprint(draft_params),
            "target_config": repr(module_config),
            "draft_type": type(draft).__name__,
            "draft_config": repr(getattr(getattr(draft, "module", None), "config", None)),
            "cpu_weight_dtype": str(getattr(spec_model, "cpu_weight_dtype", None)),
        },
        "encoder_shape": [int(n) for n in encoder_shape],
        "max_decode_len": int(max_decode_len),
        "measurement": json.loads(json.dumps(dict(sorted(measurement.items())), default=str)),
        "machine": machine(),
        "code": code_hash(),
    }


def key_digest(key: Mapping[str, Any]) -> str:
    """sha256 of the key's canonical JSON: the cache file's name."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def curve_from_dict(d: Mapping[str, Any]) -> cost_curve.CostCurve:
    """Inverse of `CostCurve.to_dict` ('c' and 'source' dropped; a missing optional field takes
    its default). Raises KeyError when a required field is missing (not a curve)."""
    fields = dataclasses.fields(cost_curve.CostCurve)
    names = [f.name for f in fields if f.name != "source" and f.name in d]
    names += [f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING]
    return cost_curve.CostCurve(**{
        k: {int(g): float(x) for g, x in d[k].items()} if isinstance(d[k], Mapping)
        else float(d[k]) for k in names
    })  # fmt: skip


class CostCurveCache:
    """One JSON file per key: {'key', 'curve' (`CostCurve.to_dict`), 'seconds', 'created' (UTC)}
    in `directory`."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)

    def path(self, key: Mapping[str, Any]) -> pathlib.Path:
        return self.directory / f"{key_digest(key)}.json"

    def load(self, key: Mapping[str, Any]) -> cost_curve.CostCurve | None:
        """The cached curve of `key`, or None (missing, unreadable or another key's)."""
        path = self.path(key)
        try:
            entry = json.loads(path.read_text())
            if entry.get("key") != json.loads(json.dumps(key, sort_keys=True)):
                return None  # a digest collision or a hand-edited file
            return curve_from_dict(entry["curve"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: Mapping[str, Any], curve: cost_curve.CostCurve, seconds: float) -> None:
        """Writes `key`'s entry atomically (a failure to write is logged, never raised)."""
        entry = {
            "key": key,
            "curve": curve.to_dict(),
            "seconds": float(seconds),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, sort_keys=True, indent=1)
            os.replace(tmp, self.path(key))
        except OSError as err:
            logger.warning(
                "auto γ: could not write the cost-curve cache %s: %s", self.directory, err
            )


def open_cache(setting: Any = None) -> CostCurveCache | None:
    """The cache of `AutoGammaDecoder(cost_cache=setting)`: None → $SPECDEC_COST_CURVE_CACHE (or
    the default directory), False or '', '0', 'off', 'false' → none, a path → that directory, a
    `CostCurveCache` as is."""
    if isinstance(setting, CostCurveCache):
        return setting
    if setting is None:
        setting = os.environ.get(ENV, DEFAULT_DIR)
    if setting is False or (isinstance(setting, str) and setting.strip() in OFF):
        return None
    return CostCurveCache(setting)


class Heartbeat:
    """Context manager logging `what`, its current `stage` and the seconds so far every `every`
    seconds from a daemon thread, so a long measurement is never silent."""

    def __init__(self, what: str, every: float = 30.0, log=None):
        self.what, self.every = what, every
        self.stage = "starting"
        self.log = log or logger.info
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> Heartbeat:
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.beats += 1
            elapsed = time.perf_counter() - self._start
            self.log("%s: %s (%.0f s so far)", self.what, self.stage, elapsed)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
