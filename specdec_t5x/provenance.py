"""Where a result came from: commit, hardware, date and command, written beside every result.

One module, one rule, used by the eval job (`eval.job`), the benchmarks (`scripts/measure_c.py`,
`scripts/bench_vs_hf.py`, `verify_cost`), the train script and the corpus builder.

The "dirty" rule: a commit is reported as `<sha>-dirty` when *tracked* files outside the run-output
folders `results/` and `runs/` differ from HEAD. Untracked files and regenerated results do not
make a tree dirty; edited code or gin files do.

The operative gin config is not made here (library code never imports gin): scripts pass
`gin_utils.operative_config()` text to `write_operative_config` once, after the run.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
RUN_OUTPUT_DIRS = ("results", "runs")  # Changes here do not make a tree dirty.
OPERATIVE_CONFIG = "operative_config.gin"


def _git(repo: str | os.PathLike, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def dirty_files(repo: str | os.PathLike = REPO) -> list[str]:
    """Tracked files outside `results/` and `runs/` that differ from HEAD (`git status` lines).

    Raises:
      OSError, subprocess.CalledProcessError: git missing or `repo` not a git work tree.
    """
    excludes = [f":(exclude){d}" for d in RUN_OUTPUT_DIRS]
    status = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes)
    return status.splitlines()


def git_commit(repo: str | os.PathLike = REPO) -> str:
    """HEAD commit, suffixed '-dirty' by the rule above; 'unknown' outside git."""
    try:
        return _git(repo, "rev-parse", "HEAD").strip() + ("-dirty" if dirty_files(repo) else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hardware_info() -> dict[str, Any]:
    """CPU model (lscpu), core count, SIMD flags exposed and the CPU kernel's path
    (`cpu_identity`), JAX devices and version, platform, load average now."""
    import jax  # here, so the corpus builder can record provenance without importing JAX eagerly

    cpu = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    identity = cpu_identity()
    return {
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "simd": identity["simd"],
        "kernel_path": identity["kernel_path"],
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),  # other work on the machine skews timings
    }


def busy_machine(load_samples: Sequence[float], cores: int | None = None) -> dict[str, Any]:
    """Whether other work shared the machine while a run was timed.

    A timing job keeps about its cores busy itself; a 1-minute load average above the core
    count means other runnable work competed for them (what that did to the demo's speed and c:
    CHANGELOG.md, the busy-machine warning).

    Args:
      load_samples: 1-minute load averages (`os.getloadavg()[0]`) sampled during the timing,
        e.g. as it starts and as it ends.
      cores: the machine's cores (default `os.cpu_count()`).

    Returns:
      {'busy': the highest sample exceeds `cores`, 'load': that sample, 'cores',
      'load_samples'}.
    """
    cores = cores or os.cpu_count() or 1
    load = max(load_samples)
    return {
        "busy": bool(load > cores),
        "load": round(float(load), 2),
        "cores": int(cores),
        "load_samples": [round(float(x), 2) for x in load_samples],
    }


def busy_note(busy: dict[str, Any] | None) -> str:
    """'⚠ busy (load 5.2 on 2 cores)' for a `busy_machine` record that is busy, else ''."""
    if not busy or not busy.get("busy"):
        return ""
    return f"⚠ busy (load {busy['load']:.1f} on {busy['cores']} cores)"


SIMD_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")


def cpu_identity() -> dict[str, Any]:
    """Which CPU and which kernel path a result ran on (/proc/cpuinfo; `cpu_kernel.kernel_path`).

    Returns:
      {'vendor', 'model_name', 'family', 'model', 'stepping' (the CPU's numbers, e.g. family 25
      model 17 for AMD Zen 4), 'simd': the SIMD flags the machine exposes (of `SIMD_FLAGS`; a
      hypervisor may mask AVX-512 on a CPU that has it), 'kernel_path': the CPU kernel's code path
      ('avx512f', 'avx2+fma', 'portable', or 'off (why)')}. Fields /proc/cpuinfo lacks are None.
    """
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    try:
        from specdec_t5x import cpu_kernel

        path = cpu_kernel.kernel_path()
    except Exception as err:  # noqa: BLE001 - provenance never fails a run
        path = f"unknown ({type(err).__name__})"
    number = lambda key: int(fields[key]) if fields.get(key, "").isdigit() else None  # noqa: E731
    return {
        "vendor": fields.get("vendor_id"),
        "model_name": fields.get("model name") or platform.processor() or None,
        "family": number("cpu family"),
        "model": number("model"),
        "stepping": number("stepping"),
        "simd": " ".join(f for f in SIMD_FLAGS if f in flags),
        "kernel_path": path,
    }


def cpu_details() -> dict[str, Any]:
    """What matters for CPU kernels, beside `hardware_info()`: threads per core, cache sizes, SIMD
    flags (lscpu), this process's CPU affinity and `XLA_FLAGS`."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    keep = ("Thread(s) per core", "L1d cache", "L2 cache", "L3 cache")
    details: dict[str, Any] = {k: fields[k].strip() for k in keep if k in fields}
    flags = fields.get("Flags", "").split()
    details["simd"] = " ".join(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16"))
    details["affinity"] = sorted(os.sched_getaffinity(0))
    details["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return details


def hardware_description(hw: dict[str, Any] | None = None) -> str:
    """One line: CPU model, cores, kernel path, JAX version and devices, load average (of
    `hardware_info()`; the kernel path and SIMD flags when the record has them)."""
    hw = hardware_info() if hw is None else hw
    load = ", ".join(f"{x:.1f}" for x in hw.get("load_average", []))
    path = f"; kernel path {hw['kernel_path']} (simd: {hw['simd']})" if "kernel_path" in hw else ""
    return (
        f"{hw['cpu_model']} ({hw['nproc']} cores){path}; jax {hw['jax_version']} "
        f"{', '.join(hw['jax_devices'])}; load average {load}"
    )


def utc_date() -> str:
    """Now, ISO 8601 in UTC to the second (e.g. '2026-11-30T14:03:41+00:00')."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def record(command: str, repo: str | os.PathLike = REPO) -> dict[str, Any]:
    """{'command', 'commit', 'hardware' (a `hardware_info()` dict), 'cpu' (`cpu_identity()`),
    'date', 'switches'} for a result file."""
    return {
        "command": command,
        "commit": git_commit(repo),
        "hardware": hardware_info(),
        "cpu": cpu_identity(),
        "date": utc_date(),
        "switches": switches(),
    }


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """Provenance bullet texts (command, commit, date, hardware) of a result carrying `record`."""
    notes = [f"{key}: `{result[key]}`" for key in ("command", "commit", "date") if key in result]
    hw = result.get("hardware")
    if isinstance(hw, dict):
        notes.append(f"hardware: {hardware_description(hw)}")
    elif hw:
        notes.append(f"hardware: {hw}")
    return notes


def write_results(
    result: dict[str, Any],
    out_dir: str | os.PathLike,
    name: str,
    command: str,
    table: Callable[[dict[str, Any]], str],
) -> pathlib.Path:
    """Writes `<name>.json` (result + `record(command)`) and `<name>.md` (`table(...)` of it).

    Returns:
      The JSON path.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {**result, **record(command)}
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(table(result))
    return path


def write_operative_config(out_dir: str | os.PathLike, config: str) -> pathlib.Path:
    """Writes the operative gin config text (from `gin_utils.operative_config()`) once."""
    path = pathlib.Path(out_dir) / OPERATIVE_CONFIG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config)
    return path


# The A/B switches read from the environment at trace or pack time ("0" turns one off; unset is
# on). Every run records which were in force (`switches`).
SWITCHES = {
    "SPECDEC_CPU_KERNEL": "CPU matmul kernel for the decoder projections",
    "SPECDEC_CPU_ATTENTION": "fused CPU attention kernel (with the matmul kernel)",
    "SPECDEC_CPU_KERNEL_SETUP": "CPU kernel for the set-up projections (encoder, cross K/V)",
    "SPECDEC_ENCODER_BUCKETS": "encoder run at 32-token length buckets",
    "SPECDEC_CPU_ISA": "CPU kernel code path forced (unset: the detected one)",
}


def switches() -> dict[str, str]:
    """{switch: 'on' | 'off' | the raw value} for every A/B switch in `SWITCHES`."""
    out = {}
    for name in SWITCHES:
        value = os.environ.get(name)
        if name == "SPECDEC_CPU_ISA":
            out[name] = value or "detected"
            continue
        out[name] = "on" if value in (None, "", "1") else ("off" if value == "0" else value)
    return out


def tree_shapes(tree: Any) -> str:
    """A short hash of a parameter tree's paths, shapes and dtypes (same model, same hash)."""
    import hashlib

    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    text = ";".join(
        f"{jax.tree_util.keystr(path)}:{getattr(v, 'shape', ())}:{getattr(v, 'dtype', type(v))}"
        for path, v in leaves
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]
