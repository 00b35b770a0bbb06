"""Partitioning: T5X logical axis rules, the XXL run file, and sharded == single-device decoding."""

import json
import os
import pathlib
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest
from conftest import init_params, tiny_config
from jax.sharding import AbstractMesh, PartitionSpec

from specdec_t5x import checkpoints, gin_utils, network, partitioning

P = PartitionSpec
TESTS = pathlib.Path(__file__).resolve().parent


def test_param_specs_follow_t5x_rules():
    module = network.Transformer(tiny_config())
    params = init_params(module, 0)
    mesh = AbstractMesh((1, 4), partitioning.MESH_AXES)
    shardings = partitioning.param_shardings(params, mesh, module)
    specs = jax.tree_util.tree_map(lambda s: s.spec, shardings)
    layer = specs["decoder"]["layers_1"]
    for name in ("query", "key", "value"):
        assert layer["self_attention"][name]["kernel"] == P(None, "model")  # [embed, joined_kv]
        assert layer["encoder_decoder_attention"][name]["kernel"] == P(None, "model")
    assert layer["self_attention"]["out"]["kernel"] == P("model", None)  # [joined_kv, embed]
    assert layer["mlp"]["wi_0"]["kernel"] == P(None, "model")  # [embed, mlp]
    assert layer["mlp"]["wo"]["kernel"] == P("model", None)  # [mlp, embed]
    assert layer["pre_mlp_layer_norm"]["scale"] == P(None)  # replicated
    assert specs["token_embedder"]["embedding"] == P("model", None)  # [vocab, embed]
    assert specs["decoder"]["logits_dense"]["kernel"] == P(None, "model")  # [embed, vocab]
    assert specs["encoder"]["relpos_bias"]["rel_embedding"] == P("model", None)  # [heads, buckets]


def test_undivisible_axes_stay_replicated_and_unknown_names_fail():
    mesh = AbstractMesh((2, 8), partitioning.MESH_AXES)
    assert partitioning.logical_to_spec(("embed", "joined_kv"), (8, 12), mesh) == P(None, None)
    assert partitioning.logical_to_spec(("embed", "joined_kv"), (8, 16), mesh) == P(None, "model")
    assert partitioning.logical_to_spec(("batch", "length"), (3, 5), mesh) == P(None, None)
    module = network.Transformer(tiny_config())
    params = {"encoder": {"mystery": {"kernel": jax.ShapeDtypeStruct((8, 16), np.float32)}}}
    with pytest.raises(ValueError, match="encoder/mystery/kernel"):
        partitioning.param_shardings(params, mesh, module)


def test_cache_specs_batch_on_data_heads_on_model():
    cache = {
        "layers_0": {
            "self_attention": {"cached_key": jax.ShapeDtypeStruct((4, 8, 10, 64), np.float32)},
            "encoder_decoder_attention": {
                "cached_value": jax.ShapeDtypeStruct((4, 8, 7, 64), np.float32)
            },
        },
        "unused": jax.ShapeDtypeStruct((4,), np.int32),  # n-gram drafts' placeholder cache
    }
    specs = partitioning.cache_shardings(cache, AbstractMesh((2, 4), partitioning.MESH_AXES))
    assert specs["layers_0"]["self_attention"]["cached_key"].spec == P("data", "model", None, None)
    assert specs["layers_0"]["encoder_decoder_attention"]["cached_value"].spec == P(
        "data", "model", None, None
    )
    assert specs["unused"].spec == P("data")


def test_make_mesh_checks_device_count():
    mesh = partitioning.make_mesh((1, -1))
    assert mesh.axis_names == ("data", "model") and mesh.devices.size == len(jax.devices())
    with pytest.raises(ValueError, match="needs 8 devices"):
        partitioning.make_mesh((2, 4), devices=jax.devices()[:1])


def test_xxl_run_file_shards_every_kernel_over_8_devices():
    gin.clear_config(clear_constants=True)
    try:
        gin_utils.parse(
            ["gin/runs/xxl_8_devices.gin"],
            ["TARGET_CHECKPOINT = '/nonexistent'", "gin_utils.build.obj = %TARGET_MODULE"],
            finalize=False,
        )
        assert tuple(gin.query_parameter("MESH_SHAPE/macro.value")) == (1, 8)
        module = gin_utils.build()
    finally:
        gin.clear_config(clear_constants=True)
    shapes = checkpoints.param_shapes(module)
    mesh = AbstractMesh((1, 8), partitioning.MESH_AXES)
    shardings = partitioning.param_shardings(shapes, mesh, module)
    per_device = 0
    for (path, shape), sharding in zip(
        jax.tree_util.tree_flatten_with_path(shapes)[0],
        jax.tree_util.tree_leaves(shardings),
        strict=True,
    ):
        if path[-1].key in ("kernel", "embedding", "rel_embedding"):
            assert "model" in sharding.spec, path  # every dimension divides by 8 at XXL
        per_device += np.prod(sharding.shard_shape(shape.shape)) * 2  # bfloat16 bytes
    assert 2.7e9 < per_device < 2.9e9  # 11.1B params / 8 devices in bfloat16


# The body runs in a fresh interpreter: XLA_FLAGS must be set before jax is imported.
SHARDED_BODY = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
from conftest import encoder_inputs, init_params, tiny_config
from specdec_t5x import checkpoints, drafts, models, network, partitioning

out = {"num_devices": len(jax.devices())}
module = network.Transformer(tiny_config())
params = init_params(module, 1)
draft_module = network.Transformer(tiny_config(num_encoder_layers=1, num_decoder_layers=1))
draft_params = init_params(draft_module, 2)
baseline = models.EncoderDecoderModel(module)
spec_model = models.SpeculativeEncoderDecoderModel(module, drafts.T5Draft(draft_module, draft_params))
batch = {
    "encoder_input_tokens": encoder_inputs(2, 7, [7, 4]),
    "decoder_input_tokens": jnp.zeros((2, 8), jnp.int32),
}
rng = jax.random.PRNGKey(3)
mesh = partitioning.make_mesh((2, 4))

sharded = partitioning.shard_params(params, mesh, module)
kernel = sharded["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]  # [8, 12]
wo = sharded["encoder"]["layers_1"]["mlp"]["wo"]["kernel"]  # [16, 8]
out["query_spec"] = str(kernel.sharding.spec)
out["query_shards"] = sorted({tuple(s.data.shape) for s in kernel.addressable_shards})
out["wo_shards"] = sorted({tuple(s.data.shape) for s in wo.addressable_shards})

# Greedy: speculative decoding's tokens are exactly the target's greedy tokens, so one
# single-device reference checks both sharded decoders (and saves a compile).
settings = {"temperature": 0.0, "topk": 0}
single = jax.jit(lambda p, b, r: baseline.predict_batch_with_aux(p, b, r, decoder_params=settings))
want = single(params, batch, rng)[0]
got = partitioning.predict_fn(baseline, mesh, settings)(sharded, batch, rng)[0]
out["baseline_equal"] = bool(np.array_equal(want, got))
out["tokens"] = np.asarray(got).tolist()
out["decodes_spec"] = str(got.sharding.spec)
settings = {"temperature": 0.0, "gamma": 3}
got = partitioning.predict_fn(spec_model, mesh, settings)(
    sharded, batch, rng, partitioning.shard_params(draft_params, mesh, draft_module)
)[0]
out["speculative_equal"] = bool(np.array_equal(want, got))

# Checkpoints: written shard by shard from the sharded params, read slice by slice into the mesh.
path = checkpoints.save_t5x_checkpoint(sharded, tempfile.mkdtemp(), 7)
loaded = checkpoints.load_params_for_model(path, module, dtype=None, mesh=mesh)
lk = loaded["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
out["loaded_spec"] = str(lk.sharding.spec)
out["loaded_equal"] = all(
    np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(loaded))
)
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_sharded_decoding_equals_single_device_on_8_cpu_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED_BODY, str(TESTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT") :])
    assert out["num_devices"] == 8
    assert out["query_spec"] == str(P(None, "model"))
    assert out["query_shards"] == [[8, 3]]  # joined_kv 12 split over model=4
    assert out["wo_shards"] == [[4, 8]]  # mlp 16 split over model=4
    assert out["baseline_equal"] and out["speculative_equal"]
    assert len({t for row in out["tokens"] for t in row}) > 3  # a real decode, not all padding
    assert out["decodes_spec"] == str(P("data"))
    assert out["loaded_spec"] == str(P(None, "model")) and out["loaded_equal"]
