"""Hugging Face T5 files (mapping, bit-exact round trips, the 5.x config trap, HF parity) and the
side by side with HF generate (`benchmarks.vs_hf`: counting and tables; the run itself needs torch)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, tiny_config
from safetensors import numpy as safetensors_numpy

from benchmarks import vs_hf
from specdec_t5x import copy_drafts, drafts, gin_utils, hf, models, network
from specdec_t5x.eval import tables

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


# ----------------------------------------------------------------------------------------------
# The side by side with HF generate (benchmarks.vs_hf): counting and tables without torch, the run
# itself with it.

METHODS = [
    vs_hf.Method("hf_baseline", "hf", "greedy"),
    vs_hf.Method("hf_prompt_lookup", "hf", "prompt lookup, γ = 4, n-gram ≤ 3", "hf_baseline"),
    vs_hf.Method("ours_baseline", "ours", "greedy"),
    vs_hf.Method("ours_speculative", "ours", "speculative, aligned-copy, γ = 4", "ours_baseline"),
]


def hand_made_summary():
    """Two examples: HF's lookup proposes little, ours copies; HF's lookup differs on example 1."""
    out = [[5, 6, 7, 1], [8, 9, 1]]
    return vs_hf.summarize(
        METHODS,
        seconds={
            "hf_baseline": [0.4, 0.2],
            "hf_prompt_lookup": [0.5, 0.25],
            "ours_baseline": [0.1, 0.1],
            "ours_speculative": [0.02, 0.03],
        },
        outputs={
            "hf_baseline": out,
            "hf_prompt_lookup": [out[0], [8, 8, 1]],
            "ours_baseline": out,
            "ours_speculative": out,
        },
        target_calls={
            "hf_baseline": [4, 3],
            "hf_prompt_lookup": [4, 2],
            "ours_baseline": [4, 3],
            "ours_speculative": [1, 2],
        },
        proposed={
            "hf_baseline": [0, 0],
            "hf_prompt_lookup": [0, 2],
            "ours_baseline": [0, 0],
            "ours_speculative": [4, 8],
        },
        accepted={
            "hf_baseline": [0, 0],
            "hf_prompt_lookup": [0, 1],
            "ours_baseline": [0, 0],
            "ours_speculative": [3, 1],
        },
    )


def test_summarize_speedups_tokens_per_call_and_equality():
    result = hand_made_summary()
    rows = {row["name"]: row for row in result["methods"]}
    assert result["num_examples"] == 2
    lookup, spec = rows["hf_prompt_lookup"], rows["ours_speculative"]
    assert lookup["speedup"] == pytest.approx(0.6 / 0.75)  # against HF's own greedy
    assert spec["speedup"] == pytest.approx(0.2 / 0.05)  # against our own greedy
    assert rows["hf_baseline"]["speedup"] == 1.0
    assert spec["target_calls"] == 3 and spec["generated_tokens"] == 7
    assert spec["tokens_per_target_call"] == pytest.approx(7 / 3)
    assert spec["proposed_per_call"] == pytest.approx(12 / 3)
    assert spec["acceptance"] == pytest.approx(4 / 12)
    assert lookup["tokens_per_target_call"] == pytest.approx(7 / 6)
    assert lookup["acceptance"] == pytest.approx(1 / 2)
    assert rows["hf_baseline"]["acceptance"] is None  # nothing proposed
    assert rows["hf_baseline"]["s_per_example"] == pytest.approx(0.3)
    assert lookup["equals_baseline"] == 1 and spec["equals_baseline"] == 2
    assert result["equal"]["hf_prompt_lookup"]["ours_baseline"] == 1
    assert result["equal"]["ours_speculative"]["hf_baseline"] == 2


def test_summarize_rejects_bad_input():
    good = dict.fromkeys(m.name for m in METHODS)
    ones = {name: [1] for name in good}
    outs = {name: [[1]] for name in good}
    with pytest.raises(ValueError, match="baseline 'nope'"):
        vs_hf.summarize([vs_hf.Method("a", "hf", "x", "nope")], {}, {}, {}, {}, {})
    with pytest.raises(ValueError, match="seconds has no entry for method 'ours_speculative'"):
        seconds = {k: v for k, v in ones.items() if k != "ours_speculative"}
        vs_hf.summarize(METHODS, seconds, outs, ones, ones, ones)
    with pytest.raises(ValueError, match="one value per example"):
        vs_hf.summarize(METHODS, {**ones, "hf_baseline": [1, 2]}, outs, ones, ones, ones)


def comparison_result(searched):
    return {
        **hand_made_summary(),
        "gamma": 4,
        "max_decode_len": 8,
        "num_generated_tokens": 7,
        "num_without_eos": 0,
        "encoder_len_mean": 9.5,
        "hf_lookup_first_searched_len": searched,
        "prompt_lookup_source": vs_hf.PROMPT_LOOKUP_SOURCE,
        "transformers_version": "9.9",
        "torch_version": "9.9+cpu",
    }


def test_hf_comparison_table_rows_and_prompt_lookup_note():
    table = tables.hf_comparison_table(comparison_result([1]))
    lines = table.splitlines()
    lookup = next(line for line in lines if "prompt lookup, γ = 4" in line)
    cells = [c.strip() for c in lookup.strip("|").split("|")]
    # s / example, speed-up, calls / example, tokens per call, proposed per call, acceptance,
    # == own greedy, == HF greedy, == ours greedy
    assert cells[2:] == ["0.3750", "0.80x", "3.0", "1.17", "0.33", "0.50", "1/2", "1/2", "1/2"]
    greedy = next(line for line in lines if line.startswith("| ours") and "| greedy |" in line)
    assert [c.strip() for c in greedy.strip("|").split("|")][-3:] == ["–", "2/2", "–"]
    assert "held 1 token (the decoder start token)" in table
    assert "0/2 greedy outputs reached the length limit without EOS" in table
    assert "PromptLookupCandidateGenerator.get_candidates" in table
    # A transformers whose lookup saw more than the start token is reported, not hidden.
    assert "held [1, 5] token(s)" in tables.hf_comparison_table(comparison_result([1, 5]))


def test_query_macro_reads_the_experiment_lengths(clean_gin):
    gin_utils.parse(["gin/experiments/embedded_correct_aligned_copy_t0.gin"], finalize=False)
    assert gin_utils.query_macro("INPUT_LEN", 64) == 128
    assert gin_utils.query_macro("DRAFT_NAME") == "aligned-copy"
    assert gin_utils.query_macro("DRAFT_SHORTLIST", "absent") == "absent"


def require_hf():
    pytest.importorskip("torch", reason="the HF comparison needs torch (the optional [hf] extra)")
    pytest.importorskip("transformers", reason="the HF comparison needs transformers ([hf] extra)")


def tiny_inputs():
    rng = np.random.RandomState(0)
    return [np.append(rng.randint(3, 32, n), 1).astype(np.int32) for n in (5, 3, 6, 7)]


def test_compare_with_hf_t5_draft_on_tiny_models(tmp_path):
    require_hf()
    target = network.Transformer(tiny_config())
    draft_module = network.Transformer(tiny_config(num_encoder_layers=1, num_decoder_layers=1))
    spec_model = models.SpeculativeEncoderDecoderModel(
        target, drafts.T5Draft(draft_module, init_params(draft_module, 2))
    )
    inputs = tiny_inputs()
    result = vs_hf.compare_with_hf(
        spec_model, init_params(target, 1), inputs, max_decode_len=8, gamma=3, work_dir=tmp_path
    )
    rows = {row["name"]: row for row in result["methods"]}
    assert set(rows) == {
        "hf_baseline",
        "hf_prompt_lookup",
        "hf_assisted",
        "ours_baseline",
        "ours_speculative",
    }
    # Greedy speculative decoding is exact in both implementations, and they agree.
    assert all(count == len(inputs) for r in result["equal"].values() for count in r.values())
    # The forward hook counts decoder calls only: HF's greedy makes one per generated token.
    assert rows["hf_baseline"]["target_calls"] == rows["hf_baseline"]["generated_tokens"]
    assert rows["hf_assisted"]["proposed_per_call"] > 0
    assert result["hf_lookup_first_searched_len"] == [1]  # the decoder start token only
    assert "| HF transformers" in tables.hf_comparison_table(result)


@pytest.mark.parametrize("draft_kind", ["source_copy", "aligned_copy"])
def test_hf_prompt_lookup_and_copy_drafts_equal_greedy_on_tiny_models(tmp_path, draft_kind):
    require_hf()
    target = network.Transformer(tiny_config())
    draft = (
        drafts.SourceCopyDraft(32, max_ngram=2)
        if draft_kind == "source_copy"
        else copy_drafts.AlignedCopyDraft(32, max_ngram=2, window=4)
    )
    spec_model = models.SpeculativeEncoderDecoderModel(target, draft)
    inputs = tiny_inputs()
    result = vs_hf.compare_with_hf(
        spec_model, init_params(target, 7), inputs, max_decode_len=12, gamma=4, work_dir=tmp_path
    )
    rows = {row["name"]: row for row in result["methods"]}
    assert "hf_assisted" not in rows  # no T5 draft: no assistant_model row
    assert result["prompt_lookup_max_ngram"] == 2  # the draft's max_ngram
    n = len(inputs)
    assert result["equal"]["hf_prompt_lookup"]["hf_baseline"] == n
    assert result["equal"]["hf_prompt_lookup"]["ours_baseline"] == n
    assert result["equal"]["ours_speculative"]["ours_baseline"] == n
    assert result["equal"]["hf_baseline"]["ours_baseline"] == n
    assert result["hf_lookup_first_searched_len"] == [1]
    # This random target never writes EOS: every output runs to the 12-token limit.
    assert rows["ours_baseline"]["generated_tokens"] == 12 * n and result["num_without_eos"] == n
    for name in ("hf_prompt_lookup", "ours_speculative"):
        assert rows[name]["target_calls"] <= rows[name]["generated_tokens"]
    # The tiny target repeats itself, so HF's lookup in its own prefix proposes and gets drafts
    # accepted: the equality above covers accepted candidates, not only the fallback.
    assert rows["hf_prompt_lookup"]["acceptance"] > 0
    if draft_kind == "source_copy":
        assert rows["ours_speculative"]["acceptance"] > 0
