"""TARGET_SHAPE: the shipped target widened at load to a T5 1.1 shape computes the same function."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import embedded, gin_utils, models, network, widen

TARGET_GIN = "gin/models/embedded_ende_target.gin"
EVAL_FILES = ["gin/runs/eval.gin", "gin/experiments/embedded_ende_model_t0.gin"]
# Two short DDTP-like sources (token ids of the project vocabulary), zero-padded.
ENC = jnp.array(
    [[331, 18, 9, 2051, 77, 5, 1, 0], [64, 1203, 8, 412, 6, 87, 29, 1]], jnp.int32
)  # fmt: skip


def build(files, bindings, what):
    gin_utils.parse(files, [*bindings, f"gin_utils.build.obj = {what}"], finalize=False)
    return gin_utils.build()


def target(shape):
    """(module, params) of the En→De target as gin loads it with TARGET_SHAPE = shape."""
    gin.clear_config(clear_constants=True)
    return build([TARGET_GIN], [f"TARGET_SHAPE = {shape!r}"], "(%TARGET_MODULE, %TARGET_PARAMS)")


def teacher_forced_logits(module, params, dec):
    return module.apply({"params": params}, ENC, dec, dec, enable_dropout=False)  # [b, L, V]


def greedy(module, params, length=8):
    model = models.EncoderDecoderModel(module)
    batch = {"encoder_input_tokens": ENC, "decoder_input_tokens": jnp.zeros((2, length), jnp.int32)}
    return np.asarray(
        model.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})[0]
    )


def test_shapes_are_t5x_t5_1_1_shapes(clean_gin):
    for name, shape in widen.T5_1_1_SHAPES.items():
        gin.clear_config(clear_constants=True)
        model = build([f"gin/models/t5_1_1_{name}.gin"], ["DROPOUT_RATE = 0.0"], "%MODEL")
        cfg = model.module.config
        assert {k: getattr(cfg, k) for k in shape} == shape, name


def test_bad_shape_name_lists_the_valid_ones(clean_gin):
    config = network.T5Config(vocab_size=32)
    with pytest.raises(ValueError, match=r"\['base', 'large', 'small'\].*got 'huge'"):
        widen.shape_config(config, "huge")
    with pytest.raises(ValueError, match=r"\['base', 'large', 'small'\].*got 'xxl'"):
        target("xxl")
    assert widen.shape_config(config, None) is config
    params = {"a": np.zeros(2)}
    assert widen.widen_to_shape(params, config, None) is params


def test_widened_target_has_the_shipped_logits_and_greedy_decodes(clean_gin):
    module, params = target(None)
    shipped = embedded.load_params("embedded_ende_target")
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), params, shipped)
    )  # TARGET_SHAPE = None: exactly the shipped tree
    wide_module, wide_params = target("small")
    cfg = wide_module.config
    assert (cfg.emb_dim, cfg.num_heads, cfg.mlp_dim) == (512, 6, 1024)
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (8, 8)
    assert wide_params["decoder"]["layers_7"]["mlp"]["wi_0"]["kernel"].shape == (512, 1024)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(wide_params))
    dec = jnp.array([[0, 12, 85, 901, 4, 33], [0, 7, 7, 250, 19, 3]], jnp.int32)
    want = teacher_forced_logits(module, params, dec)
    got = teacher_forced_logits(wide_module, wide_params, dec)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    tokens = greedy(module, params)
    assert np.count_nonzero(tokens) >= 8  # a real decode, not all EOS / padding
    np.testing.assert_array_equal(greedy(wide_module, wide_params), tokens)


def test_eval_config_builds_the_widened_pair(clean_gin):
    spec_model, target_params = build(
        EVAL_FILES, ["TARGET_SHAPE = 'small'"], "(%SPEC_MODEL, %TARGET_PARAMS)"
    )
    assert spec_model.module.config.emb_dim == 512
    assert spec_model.draft.module.config.emb_dim == 128  # the shipped draft, unchanged
    assert target_params["encoder"]["layers_7"]["mlp"]["wo"]["kernel"].shape == (1024, 512)
    assert gin.query_parameter("%TARGET_SHAPE") == "small"


def test_target_encoder_draft_cannot_follow_a_widened_target(clean_gin):
    files = ["gin/runs/eval.gin", "gin/experiments/embedded_sum_model_t0.gin"]
    with pytest.raises(ValueError, match=r"TARGET_SHAPE='base'.*embedded_sum_draft\.gin"):
        build(files, ["TARGET_SHAPE = 'base'"], "%SPEC_MODEL")
    gin.clear_config(clear_constants=True)
    spec_model = build(files, ["TARGET_SHAPE = None"], "%SPEC_MODEL")  # as shipped: fine
    assert spec_model.draft.shares_target_encoder
