"""widen: a widened T5 computes the original's logits (full forward and cached decoding)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from specdec_t5x import models, network, widen

VOCAB = 32


def _config(d, h, k, m, enc, dec, **kwargs):
    sizes = dict(emb_dim=d, num_heads=h, head_dim=k, mlp_dim=m)
    return tiny_config(VOCAB, **sizes, num_encoder_layers=enc, num_decoder_layers=dec, **kwargs)


def _params(config, seed=0):
    """Random parameters (NumPy draws, no init compile) with non-trivial norm scales and
    relative-position biases."""
    module = network.Transformer(config)
    ones = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    init = lambda e, d: module.init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False)
    shapes = jax.eval_shape(init, ones, ones)["params"]
    rng = np.random.default_rng(seed)

    def draw(path, x):
        if path[-1].key == "scale":
            return jnp.asarray(rng.uniform(0.5, 1.5, x.shape).astype(np.float32))
        fan_in = x.shape[-2] if path[-1].key == "kernel" else 1
        return jnp.asarray(rng.standard_normal(x.shape).astype(np.float32) / np.sqrt(fan_in))

    return jax.tree_util.tree_map_with_path(draw, shapes)


ENC = jnp.array([[5, 6, 7, 8, 9, 1], [3, 4, 1, 0, 0, 0]], jnp.int32)
DEC_IN = jnp.array([[0, 11, 12, 13, 14], [0, 21, 22, 0, 0]], jnp.int32)
DEC_TARGET = jnp.array([[11, 12, 13, 14, 1], [21, 22, 1, 0, 0]], jnp.int32)


def _full_logits(config, params):
    module = network.Transformer(config)
    return module.apply({"params": params}, ENC, DEC_IN, DEC_TARGET, enable_dropout=False)


def _cached_logits(config, params):
    """Logits of a 1-token block, then a 3-token block, then a rollback 1-token block."""
    module = network.Transformer(config)
    encoded = models.encode(module, params, ENC)
    cache = models.init_cache(module, params, encoded, ENC, 8)
    step = models.make_block_step(module, params, ENC)
    a, cache = step(DEC_IN[:, :1], jnp.zeros((2,), jnp.int32), cache)
    b, cache = step(DEC_IN[:, 1:4], jnp.ones((2,), jnp.int32), cache)
    c, _ = step(DEC_IN[:, 2:3], jnp.full((2,), 2, jnp.int32), cache)
    return jnp.concatenate([a, b, c], axis=1)


@functools.partial(jax.jit, static_argnums=0)
def _logits(config, params):
    """(teacher-forced logits, cached-decoding logits), one compile per config."""
    return _full_logits(config, params), _cached_logits(config, params)


PAIRS = {
    "wider_deeper": (_config(16, 2, 8, 32, 2, 1), _config(24, 3, 12, 48, 3, 4)),
    "scanned_result": (_config(16, 2, 8, 32, 2, 2), _config(32, 4, 8, 64, 3, 5, scan_layers=True)),
    "256_to_4096": (_config(256, 2, 16, 32, 1, 1), _config(4096, 4, 16, 64, 1, 2)),
}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_widened_logits_equal_original(pair):
    config, shape = PAIRS[pair]
    new_config = widen.widen_config(config, shape)
    assert new_config.layer_norm_epsilon == pytest.approx(1e-6 * config.emb_dim / shape.emb_dim)
    params = _params(config)
    wide = widen.widen(params, config, new_config)
    leaf = wide["decoder"]["layers" if shape.scan_layers else "layers_0"]["mlp"]["wo"]["kernel"]
    assert leaf.shape[-2:] == (shape.mlp_dim, shape.emb_dim)
    for name, want, got in zip(
        ("full forward", "cached decoding"),
        _logits(config, params),
        _logits(new_config, wide),
        strict=True,
    ):
        assert got.shape == want.shape and got.dtype == jnp.float32
        assert np.all(np.isfinite(np.asarray(got)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_without_epsilon_scaling_the_function_changes():
    """The ε scaling matters: the same widened weights with the original ε give other logits."""
    config, shape = _config(16, 2, 8, 32, 1, 1), _config(256, 2, 8, 32, 1, 1)
    params = _params(config)
    new_config = widen.widen_config(config, shape)
    wide = widen.widen(params, config, new_config)
    # Tiny activations make ε visible: shrink the embedding.
    small = {
        **params,
        "token_embedder": {"embedding": params["token_embedder"]["embedding"] * 1e-3},
    }
    wide["token_embedder"]["embedding"] = wide["token_embedder"]["embedding"] * 1e-3
    full = jax.jit(_full_logits, static_argnums=0)
    want = full(config, small)
    np.testing.assert_allclose(full(new_config, wide), want, rtol=1e-5, atol=1e-5)
    unscaled = dataclasses.replace(new_config, layer_norm_epsilon=1e-6)
    assert not np.allclose(full(unscaled, wide), want, rtol=1e-3, atol=1e-3)


def test_scanned_network_equals_unrolled_and_stacking_round_trips():
    config = _config(16, 2, 8, 32, 3, 2)
    params = _params(config)
    scanned = dataclasses.replace(config, scan_layers=True)
    stacked = widen.stack_layers(params)
    assert stacked["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (3, 16, 16)
    for got, want in zip(_logits(scanned, stacked), _logits(config, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    back = widen.unstack_layers(stacked)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


def test_numpy_leaves_and_dtype_cast():
    config, shape = _config(16, 2, 8, 32, 1, 1), _config(32, 2, 8, 32, 1, 2)
    params = jax.tree_util.tree_map(np.asarray, _params(config))
    wide = widen.widen(params, config, widen.widen_config(config, shape), dtype=jnp.bfloat16)
    leaves = jax.tree_util.tree_leaves(wide)
    assert all(isinstance(x, np.ndarray) and x.dtype == jnp.bfloat16 for x in leaves)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"emb_dim": 8}, "only grows"),
        ({"vocab_size": 64}, "keeps the vocabulary"),
        ({"layer_norm_epsilon": 1e-6}, "does not keep the function"),
        ({"mlp_activations": ("relu",)}, "mlp_activations"),
    ],
)
def test_bad_shapes_are_rejected(change, message):
    config = _config(16, 2, 8, 32, 1, 1)
    new_config = dataclasses.replace(widen.widen_config(config, _config(32, 2, 8, 32, 1, 1)))
    new_config = dataclasses.replace(new_config, **change)
    with pytest.raises(ValueError, match=message):
        widen.widen({}, config, new_config)
