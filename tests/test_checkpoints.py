"""T5X checkpoints: msgpack + zarr (also under state/), T5X's Orbax layout, exact reload, errors."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, recipe_params, tiny_config
from flax import serialization

from specdec_t5x import checkpoint_leaves, checkpoints, network

QUERY = ("decoder", "layers_0", "self_attention", "query", "kernel")


@pytest.fixture(scope="module")
def tiny(tiny_target):
    return tiny_target  # conftest's session-wide tiny T5 (module, params)


def logits(module, params):
    enc = encoder_inputs(2, 7, [7, 4])
    dec = jnp.asarray([[0, 5, 9, 3, 7], [0, 4, 4, 8, 0]], jnp.int32)
    return module.apply({"params": params}, enc, dec, jnp.ones_like(dec), enable_dropout=False)


def get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def norms_inline(name: str) -> bool:
    return "norm" in name  # norms inline in the msgpack, everything else in zarr


def test_written_layout_is_t5x(tiny, tmp_path):
    _, params = tiny
    step_dir = checkpoints.save_t5x_checkpoint(params, tmp_path, 10, write_inline=norms_inline)
    assert step_dir == tmp_path / "checkpoint_10"
    data_dir = step_dir
    contents = serialization.msgpack_restore((data_dir / "checkpoint").read_bytes())
    assert contents["version"] == 3 and set(contents["optimizer"]) == {"target", "state"}
    target = contents["optimizer"]["target"]
    spec = get(target, QUERY)
    assert spec["driver"] == "zarr" and spec["kvstore"] == {
        "driver": "file",
        "path": "target.decoder.layers_0.self_attention.query.kernel/",  # relative: relocatable
    }
    assert spec["metadata"]["shape"] == [8, 12] and spec["metadata"]["compressor"]["id"] == "gzip"
    zarray = json.loads((data_dir / spec["kvstore"]["path"] / ".zarray").read_text())
    assert zarray["zarr_format"] == 2 and zarray["shape"] == [8, 12]
    assert zarray["dtype"] == "<f4" and zarray["compressor"]["id"] == "gzip"
    assert isinstance(target["encoder"]["encoder_norm"]["scale"], np.ndarray)  # inline
    assert int(contents["optimizer"]["state"]["step"]) == 10


@pytest.mark.parametrize("layout", ["legacy", "state_msgpack"])
def test_reload_gives_identical_logits(tiny, tmp_path, layout):
    module, params = tiny
    step_dir = checkpoints.save_t5x_checkpoint(params, tmp_path, 3, write_inline=norms_inline)
    if (
        layout == "state_msgpack"
    ):  # the same files in checkpoint_3/state/ (T5X's Checkpointer reads it)
        moved = shutil.move(step_dir, tmp_path / "state")
        step_dir.mkdir()
        shutil.move(moved, step_dir / "state")
    whole = checkpoints.load_t5x_checkpoint(tmp_path / "checkpoint_3")
    assert int(whole["state"]["step"]) == 3
    jax.tree_util.tree_map(np.testing.assert_array_equal, whole["target"], params)
    loaded = checkpoints.load_params_for_model(tmp_path, module, dtype=None)
    np.testing.assert_array_equal(logits(module, loaded), logits(module, params))
    bf16 = checkpoints.load_params_for_model(tmp_path, module)  # inference default
    assert get(bf16, QUERY).dtype == jnp.bfloat16
    np.testing.assert_array_equal(get(bf16, QUERY), get(params, QUERY).astype(jnp.bfloat16))


def test_relocated_and_gcs_written_checkpoints_load(tiny, tmp_path):
    module, params = tiny
    checkpoints.save_t5x_checkpoint(params, tmp_path / "a", 1)
    moved = shutil.move(tmp_path / "a" / "checkpoint_1", tmp_path / "b")
    msgpack_file = moved / "checkpoint"
    contents = serialization.msgpack_restore(msgpack_file.read_bytes())
    spec = get(contents["optimizer"]["target"], QUERY)  # as T5X writes on GCS: dummy bucket
    spec["kvstore"] = {"driver": "gcs", "bucket": "t5x-dummy-bucket"}
    spec["path"] = "target.decoder.layers_0.self_attention.query.kernel"
    spec["metadata"]["chunks"] = np.asarray(spec["metadata"]["chunks"])  # as older T5X wrote it
    msgpack_file.write_bytes(serialization.msgpack_serialize(contents))
    loaded = checkpoints.load_params_for_model(moved, module, dtype=None)
    np.testing.assert_array_equal(get(loaded, QUERY), get(params, QUERY))


def test_model_dir_picks_latest_or_given_step(tiny, tmp_path):
    module, params = tiny
    other = jax.tree_util.tree_map(lambda x: x + 1.0, params)
    checkpoints.save_t5x_checkpoint(params, tmp_path, 5)
    checkpoints.save_t5x_checkpoint(other, tmp_path, 12)
    (tmp_path / "checkpoint_20.tmp-123").mkdir()  # an unfinished save is ignored
    assert checkpoints.all_steps(tmp_path) == [5, 12]
    latest = checkpoints.load_params_for_model(tmp_path, module, dtype=None)
    np.testing.assert_array_equal(get(latest, QUERY), get(other, QUERY))
    first = checkpoints.load_t5x_checkpoint(tmp_path, step=5)
    np.testing.assert_array_equal(get(first["target"], QUERY), get(params, QUERY))
    with pytest.raises(FileNotFoundError, match=r"checkpoint_7.*\[5, 12\]"):
        checkpoints.load_t5x_checkpoint(tmp_path, step=7)
    with pytest.raises(FileExistsError):
        checkpoints.save_t5x_checkpoint(params, tmp_path, 5)


def test_lazy_parameters_and_restore_dtype(tiny, tmp_path):
    _, params = tiny
    checkpoints.save_t5x_checkpoint(params, tmp_path, 2, write_inline=norms_inline)
    lazy = checkpoints.load_t5x_checkpoint(
        tmp_path, restore_dtype=jnp.bfloat16, lazy_parameters=True
    )
    leaf = get(lazy["target"], QUERY)
    assert isinstance(leaf, checkpoints.LazyArray)
    assert leaf.shape == (8, 12) and leaf.dtype == jnp.bfloat16
    np.testing.assert_array_equal(leaf.get(), get(params, QUERY).astype(jnp.bfloat16))
    norm = lazy["target"]["decoder"]["decoder_norm"]["scale"]  # inline leaves are lazy too
    assert norm.get().dtype == jnp.bfloat16
    assert lazy["state"]["step"].get().dtype == np.int32  # only the target is cast


def test_shape_mismatch_names_parameter_and_shapes(tmp_path):
    wider = network.Transformer(tiny_config(mlp_dim=32))
    checkpoints.save_t5x_checkpoint(init_params(wider, 0), tmp_path, 1)
    model = network.Transformer(tiny_config())
    with pytest.raises(
        ValueError, match=r"'decoder/layers_0/mlp/wi_0/kernel'.*\(8, 32\).*\(8, 16\)"
    ):
        checkpoints.load_params_for_model(tmp_path, model)


def test_name_mismatch_lists_missing_and_unexpected(tmp_path):
    deeper = network.Transformer(tiny_config(num_decoder_layers=3))
    checkpoints.save_t5x_checkpoint(init_params(deeper, 0), tmp_path, 1)
    with pytest.raises(ValueError, match=r"not in the model: \[decoder/layers_2/"):
        checkpoints.load_params_for_model(tmp_path, tiny_config())
    with pytest.raises(ValueError, match=r"missing from the checkpoint: \[decoder/layers_3/"):
        checkpoints.load_params_for_model(tmp_path, tiny_config(num_decoder_layers=4))


def test_missing_directory_and_missing_array_errors(tiny, tmp_path):
    module, params = tiny
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoints.load_params_for_model(tmp_path / "nope", module)
    with pytest.raises(FileNotFoundError, match="no T5X checkpoint"):
        checkpoints.load_t5x_checkpoint(tmp_path)
    step_dir = checkpoints.save_t5x_checkpoint(params, tmp_path, 4)
    shutil.rmtree(step_dir / "target.decoder.layers_0.self_attention.query.kernel")
    with pytest.raises(FileNotFoundError, match="decoder/layers_0/self_attention/query/kernel"):
        checkpoints.load_params_for_model(tmp_path, module)


def test_chunk_shape_matches_t5x():
    assert checkpoint_leaves.choose_chunk_shape((8, 12), 1000) == [8, 12]
    assert checkpoint_leaves.choose_chunk_shape((4096, 10240), 16 * 2**20) == [4096, 2560]
    chunks = checkpoint_leaves.choose_chunk_shape((32128, 4096), 2**20)
    assert np.prod(chunks) <= 2**20 and 32128 % chunks[0] == 0 and 4096 % chunks[1] == 0


def test_only_layouts_t5x_reads_are_written(tiny, tmp_path):
    with pytest.raises(ValueError, match="'legacy'"):
        checkpoints.save_t5x_checkpoint(tiny[1], tmp_path, 1, layout="state")


def test_truncated_msgpack_names_the_file(tiny, tmp_path):
    step_dir = checkpoints.save_t5x_checkpoint(tiny[1], tmp_path, 2, write_inline=norms_inline)
    msgpack_file = step_dir / "checkpoint"
    msgpack_file.write_bytes(msgpack_file.read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"checkpoint_2/checkpoint is truncated or corrupt"):
        checkpoints.load_t5x_checkpoint(step_dir)


T5X_ORBAX = pathlib.Path(__file__).parent / "golden" / "t5x_orbax"  # written by T5X (golden README)


def orbax_expected_params():
    module = network.Transformer(tiny_config(vocab_size=32))
    return module, recipe_params(module, 4, 4)


def test_reads_checkpoint_written_by_t5x_orbax_manager():
    module, want = orbax_expected_params()
    whole = checkpoints.load_t5x_checkpoint(T5X_ORBAX)  # model folder: picks checkpoint_7
    assert int(whole["state"]["step"]) == 7
    assert whole["state"]["param_states"]  # Adam moments, read too
    jax.tree_util.tree_map(np.testing.assert_array_equal, whole["target"], want)
    lazy = checkpoints.load_t5x_checkpoint(T5X_ORBAX / "checkpoint_7", lazy_parameters=True)
    query = get(lazy["target"], QUERY)
    assert isinstance(query, checkpoints.LazyArray) and query.shape == (8, 12)
    np.testing.assert_array_equal(query.get(), get(want, QUERY))
    loaded = checkpoints.load_params_for_model(T5X_ORBAX, module)  # bf16, default device
    assert get(loaded, QUERY).dtype == jnp.bfloat16
    np.testing.assert_array_equal(get(loaded, QUERY), get(want, QUERY).astype(jnp.bfloat16))
    np.testing.assert_array_equal(
        logits(module, loaded),
        logits(module, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), want)),
    )
