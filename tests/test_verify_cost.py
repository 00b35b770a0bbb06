"""verify_cost / xla_profile (scripts/profile_verify.py): a tiny run end to end, the HLO op
categories of the per-op breakdown, and the commands results/verify_cost/README.md names."""

import json
import pathlib
import re
import shlex

import jax
import jax.numpy as jnp
import pytest

from benchmarks import verify_cost, xla_profile
from specdec_t5x import cpu_kernel, models

README = pathlib.Path(__file__).resolve().parents[1] / "results/verify_cost/README.md"


def test_tiny_run_writes_tables_with_provenance(tmp_path):
    argv = ["--models", "tiny", "--ks", "1,2", "--variants", "xla", "--modes", "loop,single"]
    argv += ["--rounds", "2", "--loop_steps", "2", "--roofline", "--tag", "smoke"]
    path = verify_cost.main([*argv, "--out", str(tmp_path)])
    assert path == tmp_path / "verify_cost_smoke.json"
    result = json.loads(path.read_text())
    for mode in ("loop", "single"):
        rows = result["results"]["tiny"]["xla"][mode]
        assert set(rows) == {"1", "2"} and rows["1"]["ratio"] == pytest.approx(1.0)
        assert all(r["ms"] > 0 and r["ratio_q25"] <= r["ratio_q75"] for r in rows.values())
    roof = result["roofline"]["models"]["tiny"]
    assert result["roofline"]["gemv_stream_gbs_64mib"] > 0 and roof["roofline_ratio"]["1"] == 1.0
    assert result["command"].startswith("python scripts/profile_verify.py --models tiny")
    assert result["commit"] and result["date"] and "affinity" in result["hardware"]
    table = path.with_suffix(".md").read_text()
    assert "## tiny" in table and "| 2 | " in table and "- commit: `" in table


def test_bad_names_are_errors_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"unknown variant\(s\) \['xl'\]"):
        verify_cost.main(["--models", "tiny", "--variants", "xl", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="position"):  # k = 40 does not fit at position 32
        verify_cost.main(["--models", "tiny", "--ks", "1,40", "--out", str(tmp_path)])


def test_breakdown_categories_cover_the_decoder_step():
    """Every weight dot, the logits dot and the attention dots of the compiled step get their
    category from the HLO (the per-thunk times are then summed by these labels)."""
    s = verify_cost.Settings(rounds=1, loop_steps=2)
    module, params, enc, cache = verify_cost.build("tiny", s)
    fn = verify_cost.make_fn(module, "loop", s.loop_steps)
    args = (params, enc, cache, jnp.full((1, 2), 3, jnp.int32), jnp.full((1,), 32, jnp.int32))
    with cpu_kernel.env_setting(False):
        labels = xla_profile._instruction_labels(fn.lower(*args).compile().as_text())
    m = verify_cost.MODELS["tiny"]
    dims = {"vocab": m["vocab_size"], "heads": m["num_heads"], "head_dim": m["head_dim"]}
    cats = {xla_profile._category(*label, dims) for label in labels.values()}
    assert {"logits matmul", "layer weight matmuls", "attention dots"} <= cats
    assert {"RMSNorm", "softmax + mask"} <= cats
    if cpu_kernel.available():  # the kernel path: the projections are its custom calls
        packed = verify_cost.models.pack_params(module, params, "float32")
        with cpu_kernel.env_setting(True):
            labels = xla_profile._instruction_labels(
                fn.lower(packed, *args[1:]).compile().as_text()
            )
        cats = {xla_profile._category(*label, dims) for label in labels.values()}
        assert {"CPU kernel matmuls", "CPU kernel attention"} <= cats
        assert not cats & {"layer weight matmuls", "logits matmul", "attention dots"}
        jax.clear_caches()  # the setting is read when tracing
        with cpu_kernel.env_setting(True), cpu_kernel.env_var(cpu_kernel.ATTENTION_ENV_VAR, "0"):
            labels = xla_profile._instruction_labels(
                fn.lower(packed, *args[1:]).compile().as_text()
            )
        cats = {xla_profile._category(*label, dims) for label in labels.values()}
        assert "CPU kernel matmuls" in cats and "attention dots" in cats
        assert "CPU kernel attention" not in cats


def test_readme_commands_parse_with_known_names():
    commands = re.findall(r"python (scripts/profile_verify\.py[^\n`]*)", README.read_text())
    assert len(commands) >= 3
    for command in commands:
        argv = [a for a in shlex.split(command.replace("\\", ""))[1:] if not a.startswith("[")]
        argv = argv[: argv.index("#")] if "#" in argv else argv
        args = verify_cost.parse_args([a for a in argv if not a.endswith("]")])
        assert set(args.models) <= set(verify_cost.MODELS), command
        assert set(args.variants) <= set(verify_cost.VARIANTS), command
        assert set(args.modes) <= {"loop", "single", "single_cache"}, command


@pytest.mark.skipif(not cpu_kernel.available(), reason="CPU kernel extension not built")
def test_no_matmul_variant_stubs_every_projection_and_restores_dense():
    """`kernel_no_matmul` traces the packed step with no projection custom call left (only the
    attention kernel), and `cpu_kernel.dense` is the real one again afterwards."""
    s = verify_cost.Settings(position=2, enc_len=8, max_len=8, loop_steps=2)
    module, params, enc, cache = verify_cost.build("tiny", s)
    params = models.pack_params(module, params, "float32")
    fn = verify_cost.make_fn(module, "loop", s.loop_steps)
    args = (params, enc, cache, jnp.full((1, 2), 3, jnp.int32), jnp.full((1,), 2, jnp.int32))
    real = cpu_kernel.dense
    with cpu_kernel.env_setting(True):
        full = fn.lower(*args).as_text()
        with verify_cost._projections_stubbed():
            stubbed = verify_cost.make_fn(module, "loop", s.loop_steps).lower(*args).as_text()
    assert cpu_kernel.dense is real
    assert full.count(cpu_kernel.MATMUL_TARGET) > 0
    assert stubbed.count(cpu_kernel.MATMUL_TARGET) == 0
    assert stubbed.count(cpu_kernel.ATTENTION_TARGET) == full.count(cpu_kernel.ATTENTION_TARGET)
