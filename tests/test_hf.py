"""Hugging Face T5 files: mapping, bit-exact round trips, the 5.x config trap, HF parity."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, tiny_config
from safetensors import numpy as safetensors_numpy

from specdec_t5x import hf, network

DEC = jnp.asarray([[0, 5, 9, 3, 7], [0, 4, 4, 8, 2]], jnp.int32)


@pytest.fixture(scope="module", params=[False, True], ids=["v1_1", "tied_v1_0"])
def model(request):
    config = tiny_config(logits_via_embedding=request.param)
    module = network.Transformer(config)
    return config, module, init_params(module, 1)


def logits(module, params):
    enc = encoder_inputs(2, 7, [7, 4])
    return module.apply({"params": params}, enc, DEC, jnp.ones_like(DEC), enable_dropout=False)


def test_export_import_round_trip_is_bit_exact(model, tmp_path):
    config, module, params = model
    hf.export_hf(params, config, tmp_path)
    imported, imported_config = hf.import_hf(tmp_path)
    assert imported_config == config
    assert jax.tree_util.tree_structure(imported) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, imported, params)
    np.testing.assert_array_equal(logits(module, imported), logits(module, params))


def test_exported_names_transposes_and_config(model, tmp_path):
    config, _, params = model
    hf.export_hf(params, config, tmp_path)
    tensors = safetensors_numpy.load_file(str(tmp_path / hf.SAFETENSORS_FILE))
    query = params["encoder"]["layers_1"]["attention"]["query"]["kernel"]  # [emb, heads * d]
    np.testing.assert_array_equal(
        tensors["encoder.block.1.layer.0.SelfAttention.q.weight"], query.T
    )
    wo = params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]
    np.testing.assert_array_equal(tensors["decoder.block.0.layer.2.DenseReluDense.wo.weight"], wo.T)
    bias = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    assert tensors[bias].shape == (32, 4)  # [buckets, heads], block 0 only
    assert not any("block.1" in k and "relative_attention_bias" in k for k in tensors)
    assert ("lm_head.weight" in tensors) == (not config.logits_via_embedding)
    cfg = json.loads((tmp_path / hf.CONFIG_FILE).read_text())
    assert cfg["feed_forward_proj"] == "gated-gelu" and cfg["d_kv"] == 3 and cfg["d_ff"] == 16
    # 4.x reads tie_word_embeddings, 5.x scale_decoder_outputs: both must say the same thing.
    assert cfg["tie_word_embeddings"] == cfg["scale_decoder_outputs"] == config.logits_via_embedding


def rewrite(tmp_path, config_updates, drop=()):
    cfg = json.loads((tmp_path / hf.CONFIG_FILE).read_text())
    cfg.update(config_updates)
    for key in [k for k in cfg if k in drop]:
        del cfg[key]
    (tmp_path / hf.CONFIG_FILE).write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "updates, drop",
    [
        ({"tie_word_embeddings": True, "scale_decoder_outputs": False}, ()),  # saved by 5.x
        ({"tie_word_embeddings": False}, ("scale_decoder_outputs",)),  # classic v1.1 config
    ],
    ids=["transformers_5", "transformers_4"],
)
def test_reading_rule_v1_1_configs(tmp_path, updates, drop):
    config = tiny_config()
    module = network.Transformer(config)
    params = init_params(module, 2)
    hf.export_hf(params, config, tmp_path)
    rewrite(tmp_path, updates, drop)
    imported, imported_config = hf.import_hf(tmp_path)
    assert not imported_config.logits_via_embedding  # lm_head.weight present, no scaling
    np.testing.assert_array_equal(logits(module, imported), logits(module, params))


def test_reading_rule_without_lm_head(tmp_path):
    config = tiny_config()
    params = init_params(network.Transformer(config), 3)
    hf.export_hf(params, config, tmp_path)
    tensors = safetensors_numpy.load_file(str(tmp_path / hf.SAFETENSORS_FILE))
    del tensors["lm_head.weight"]
    safetensors_numpy.save_file(tensors, str(tmp_path / hf.SAFETENSORS_FILE))
    # Unscaled output through the shared table: a v1.1-shaped head copied from the embedding.
    imported, imported_config = hf.import_hf(tmp_path)
    assert not imported_config.logits_via_embedding
    embedding = params["token_embedder"]["embedding"]
    np.testing.assert_array_equal(imported["decoder"]["logits_dense"]["kernel"], embedding.T)
    # No scale key and HF's default tie_word_embeddings=True: T5 1.0's scaled, tied logits.
    rewrite(tmp_path, {}, drop=("scale_decoder_outputs", "tie_word_embeddings"))
    _, imported_config = hf.import_hf(tmp_path)
    assert imported_config.logits_via_embedding


def test_sharded_safetensors_and_redundant_keys(tmp_path):
    config = tiny_config()
    params = init_params(network.Transformer(config), 4)
    hf.export_hf(params, config, tmp_path)
    tensors = safetensors_numpy.load_file(str(tmp_path / hf.SAFETENSORS_FILE))
    (tmp_path / hf.SAFETENSORS_FILE).unlink()
    tensors["encoder.embed_tokens.weight"] = tensors["shared.weight"]  # tied copy, ignored
    keys = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        safetensors_numpy.save_file({k: tensors[k] for k in part}, str(tmp_path / name))
        weight_map.update(dict.fromkeys(part, name))
    (tmp_path / hf.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    imported, _ = hf.import_hf(tmp_path)
    jax.tree_util.tree_map(np.testing.assert_array_equal, imported, params)


def test_import_errors(tmp_path):
    config = tiny_config()
    params = init_params(network.Transformer(config), 5)
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.import_hf(tmp_path)
    hf.export_hf(params, config, tmp_path)
    tensors = safetensors_numpy.load_file(str(tmp_path / hf.SAFETENSORS_FILE))
    del tensors["decoder.block.1.layer.1.EncDecAttention.k.weight"]
    safetensors_numpy.save_file(tensors, str(tmp_path / hf.SAFETENSORS_FILE))
    with pytest.raises(ValueError, match=r"missing \['decoder.block.1.layer.1.EncDecAttention.k"):
        hf.import_hf(tmp_path)
    rewrite(tmp_path, {"relative_attention_num_buckets": 64})
    with pytest.raises(ValueError, match="relative_attention_num_buckets=64"):
        hf.import_hf(tmp_path)
    with pytest.raises(ValueError, match="no HF feed_forward_proj"):
        hf.hf_config(tiny_config(mlp_activations=("linear", "gelu")))


def test_pytorch_bin_round_trip(tmp_path):
    pytest.importorskip("torch", reason="pytorch_model.bin needs torch (the [hf] extra)")
    config = tiny_config()
    params = init_params(network.Transformer(config), 6)
    hf.export_hf(params, config, tmp_path, file_format="pytorch")
    assert (tmp_path / hf.PYTORCH_FILE).is_file()
    imported, _ = hf.import_hf(tmp_path)
    jax.tree_util.tree_map(np.testing.assert_array_equal, imported, params)


def test_logits_match_transformers_t5(model, tmp_path):
    torch = pytest.importorskip("torch", reason="HF parity needs torch (the [hf] extra)")
    pytest.importorskip("transformers", reason="HF parity needs transformers (the [hf] extra)")
    config, module, params = model
    hf.export_hf(params, config, tmp_path)
    torch_model = hf.load_torch_model(tmp_path)
    enc = np.asarray(encoder_inputs(2, 7, [7, 4]))
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(enc),
            attention_mask=torch.tensor(enc > 0),
            decoder_input_ids=torch.tensor(np.asarray(DEC)),
        ).logits.numpy()
    np.testing.assert_allclose(logits(module, params), theirs, atol=1e-4, rtol=0)
