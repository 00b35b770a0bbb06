"""isa_paths (scripts/profile_isa.py): variants parse, a tiny run end to end with an earlier
build's targets, and the commands results/verify_cost/avx2/README.md names."""

import json
import pathlib
import re
import shlex

import jax.numpy as jnp
import pytest

from benchmarks import isa_paths, verify_cost
from specdec_t5x import cpu_kernel, models

README = pathlib.Path(__file__).resolve().parents[1] / "results/verify_cost/avx2/README.md"
needs_kernel = pytest.mark.skipif(not cpu_kernel.available(), reason="CPU kernel not built")


def test_variants_parse_and_bad_names_are_refused():
    v = isa_paths.Variant.parse("kernel_bf16_before@avx2+fma")
    assert (v.kernel, v.weight_dtype, v.before, v.isa) == (True, "bfloat16", True, "avx2+fma")
    assert not isa_paths.Variant.parse("xla").kernel
    for bad in ("kernel", "kernel@avx3", "xla@avx2+fma", "dot@avx512f"):
        with pytest.raises(ValueError, match="expected 'xla' or kernel"):
            isa_paths.Variant.parse(bad)


@needs_kernel
def test_tiny_run_with_an_earlier_build(tmp_path):
    """The running build stands in for an earlier one: its targets registered again under other
    names, which the `_before` variant's traced step calls (matmul and attention both)."""
    lib = cpu_kernel.extension.library()
    isa = cpu_kernel.isa()
    argv = ["--before", lib._name, "--models", "tiny", "--dot_models", "tiny", "--ks", "1,2"]
    argv += ["--variants", f"xla,kernel@{isa},kernel_before@{isa}", "--rounds", "2"]
    argv += ["--dot_rounds", "2", "--dot_ms", "1,3", "--stream_mib", "0.02", "--loop_steps", "2"]
    path = isa_paths.main([*argv, "--tag", "smoke", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    steps = result["steps"]["tiny"]
    assert set(steps) == {"xla", f"kernel@{isa}", f"kernel_before@{isa}"}
    assert all(r["ms"] > 0 for per_k in steps.values() for r in per_k.values())
    assert steps["xla"]["1"]["ratio"] == pytest.approx(1.0)
    assert set(result["dots"]["32x64"][f"kernel@{isa}"]) == {"1", "3"}
    assert result["isa_detected"] == isa and "simd" in result["hardware"]
    table = path.with_suffix(".md").read_text()
    assert "## tiny" in table and "- load average before / after" in table

    s = verify_cost.Settings(loop_steps=2)
    module, params, enc, cache = verify_cost.build("tiny", s)
    packed = models.pack_params(module, params, "float32")
    fn = verify_cost.make_fn(module, "loop", s.loop_steps)
    args = (packed, enc, cache, jnp.full((1, 2), 3, jnp.int32), jnp.full((1,), 32, jnp.int32))
    with isa_paths._traced_as(isa_paths.Variant.parse(f"kernel_before@{isa}")):
        hlo = fn.lower(*args).as_text()
    assert set(re.findall(r"specdec_[a-z_]+", hlo)) == {
        "specdec_matmul_before",
        "specdec_attention_before",
    }
    assert cpu_kernel.isa() == isa  # the forced path is undone


def test_readme_commands_parse():
    commands = re.findall(r"python (scripts/profile_isa\.py[^\n`]*)", README.read_text())
    assert commands
    for command in commands:
        args = isa_paths.parse_args(shlex.split(command.replace("\\", " "))[1:])
        for name in args.variants:
            isa_paths.Variant.parse(name)
        assert set(args.models) <= set(verify_cost.MODELS)
