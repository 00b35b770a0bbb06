"""Provenance: one dirty rule (tracked files outside results/ and runs/), one record format."""

import json
import subprocess

from specdec_t5x import provenance


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_dirty_rule_ignores_run_outputs_and_untracked_files(tmp_path):
    for name in ("code.py", "results/table.md", "runs/log.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / "results/table.md").write_text("v2\n")
    (tmp_path / "runs/log.txt").write_text("v2\n")
    (tmp_path / "new_untracked.py").write_text("x\n")
    assert provenance.git_commit(tmp_path) == head
    assert provenance.dirty_files(tmp_path) == []
    (tmp_path / "code.py").write_text("v2\n")
    assert provenance.git_commit(tmp_path) == head + "-dirty"
    assert provenance.dirty_files(tmp_path) == [" M code.py"]


def test_git_commit_outside_git_is_unknown(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"


def test_write_results_records_command_commit_hardware_date(tmp_path):
    path = provenance.write_results(
        {"x": 1}, tmp_path, "r", "python run.py --a", lambda r: f"x={r['x']}\n"
    )
    result = json.loads(path.read_text())
    assert result["x"] == 1 and result["command"] == "python run.py --a"
    assert result["commit"] and result["date"].endswith("+00:00")
    assert result["hardware"]["nproc"] >= 1 and result["hardware"]["jax_devices"]
    assert (tmp_path / "r.md").read_text() == "x=1\n"
    line = provenance.hardware_description(result["hardware"])
    assert f"({result['hardware']['nproc']} cores)" in line


def test_cpu_identity_names_the_kernel_path_and_the_exposed_simd_flags(monkeypatch):
    from specdec_t5x import cpu_kernel

    identity = provenance.cpu_identity()
    assert identity["kernel_path"] == cpu_kernel.kernel_path()
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    assert ("avx2" in identity["simd"].split()) == ("avx2" in flags)
    assert ("avx512f" in identity["simd"].split()) == ("avx512f" in flags)
    assert isinstance(identity["family"], int) and isinstance(identity["model"], int)
    monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    assert provenance.cpu_identity()["kernel_path"] == f"off ({cpu_kernel.ENV_VAR}=0)"
    record = provenance.record("python x.py")
    assert record["cpu"]["kernel_path"].startswith("off") and "kernel path" in (
        provenance.hardware_description(record["hardware"])
    )


def test_medians_never_merge_kernel_paths():
    import pytest

    from specdec_t5x.eval import summary, tables

    base = {"task": "t", "draft": "d", "temperature": 0.0, "gamma": 2, "speedup": 1.0}
    runs = [summary.group({**base, "cpu": {"kernel_path": p}}) for p in ("avx512f", "avx2+fma")]
    with pytest.raises(ValueError, match="kernel paths"):
        tables.median_row(runs)
