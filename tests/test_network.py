"""T5 v1.1 network: parameter tree, parameter counts, and cached block decoding == full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, tiny_config

from specdec_t5x import models, network

T5X_SIZES = {  # emb, heads, enc layers, dec layers, head_dim, mlp; expected params (T5 1.1)
    "small": (512, 6, 8, 8, 64, 1024, 77e6),
    "base": (768, 12, 12, 12, 64, 2048, 248e6),
    "large": (1024, 16, 24, 24, 64, 2816, 783e6),
    "xl": (2048, 32, 24, 24, 64, 5120, 2.85e9),
    "xxl": (4096, 64, 24, 24, 64, 10240, 11.1e9),
}


def t5x_param_names(num_enc: int, num_dec: int) -> set[str]:
    """T5X's parameter tree for T5 v1.1 (t5x/examples/t5/network.py), as '/'-joined paths."""
    names = {"token_embedder/embedding", "encoder/relpos_bias/rel_embedding"}
    names |= {"encoder/encoder_norm/scale", "decoder/relpos_bias/rel_embedding"}
    names |= {"decoder/decoder_norm/scale", "decoder/logits_dense/kernel"}
    for i in range(num_enc):
        p = f"encoder/layers_{i}/"
        names |= {p + "pre_attention_layer_norm/scale", p + "pre_mlp_layer_norm/scale"}
        names |= {p + f"attention/{n}/kernel" for n in ("query", "key", "value", "out")}
        names |= {p + f"mlp/{n}/kernel" for n in ("wi_0", "wi_1", "wo")}
    for i in range(num_dec):
        p = f"decoder/layers_{i}/"
        names |= {
            p + f"{n}/scale"
            for n in (
                "pre_self_attention_layer_norm",
                "pre_cross_attention_layer_norm",
                "pre_mlp_layer_norm",
            )
        }
        for att in ("self_attention", "encoder_decoder_attention"):
            names |= {p + f"{att}/{n}/kernel" for n in ("query", "key", "value", "out")}
        names |= {p + f"mlp/{n}/kernel" for n in ("wi_0", "wi_1", "wo")}
    return names


def flat_names(tree) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): leaf.shape for path, leaf in flat}


@pytest.mark.parametrize("size", sorted(T5X_SIZES))
def test_param_tree_and_counts_match_t5x(size):
    emb, heads, enc, dec, head_dim, mlp, expected = T5X_SIZES[size]
    shape = dict(emb_dim=emb, num_heads=heads, num_encoder_layers=enc, num_decoder_layers=dec)
    cfg = tiny_config(32128, dtype=jnp.bfloat16, head_dim=head_dim, mlp_dim=mlp, **shape)
    module = network.Transformer(cfg)
    ones = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)
    )["params"]
    names = flat_names(shapes)
    assert set(names) == t5x_param_names(enc, dec)
    assert names["encoder/layers_0/attention/query/kernel"] == (emb, heads * head_dim)
    assert names["encoder/layers_0/attention/out/kernel"] == (heads * head_dim, emb)
    assert names["decoder/logits_dense/kernel"] == (emb, 32128)
    assert names["decoder/relpos_bias/rel_embedding"] == (heads, 32)
    count = sum(int(np.prod(s)) for s in names.values())
    assert abs(count - expected) / expected < 0.02, (size, count)


def teacher_forced(module, params, enc, targets):
    dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # shift right, start token 0
    return dec_in, module.apply({"params": params}, enc, dec_in, targets, enable_dropout=False)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_block_cached_decoding_equals_full_forward(tiny_target, k):
    module, params = tiny_target
    batch, length = 3, 13
    enc = encoder_inputs(batch, 7, [7, 4, 6])
    targets = jnp.asarray(np.random.RandomState(1).randint(3, 32, (batch, length)), jnp.int32)
    dec_in, full = teacher_forced(module, params, enc, targets)
    model = models.EncoderDecoderModel(module)
    cache, step = model.decoder_state(params, enc, length)
    outs, t = [], 0
    while t < length:
        width = min(k, length - t)
        logits, cache = step(dec_in[:, t : t + width], jnp.full((batch,), t, jnp.int32), cache)
        outs.append(logits)
        t += width
    cached = jnp.concatenate(outs, axis=1)
    assert cached.shape == (batch, length, 32) and cached.dtype == jnp.float32
    np.testing.assert_allclose(cached, full, atol=1e-4)


def test_rows_at_different_positions(tiny_target):
    """One block call where each row starts at its own position."""
    module, params = tiny_target
    batch, length, k = 3, 14, 3
    enc = encoder_inputs(batch, 7, [7, 4, 6])
    targets = jnp.asarray(np.random.RandomState(2).randint(3, 32, (batch, length)), jnp.int32)
    dec_in, full = teacher_forced(module, params, enc, targets)
    cache, step = models.EncoderDecoderModel(module).decoder_state(params, enc, length)
    starts = np.array([0, 4, 9])
    # Fill each row's prefix one token at a time (other rows rewrite their own slot 0..).
    for t in range(int(starts.max())):
        pos = np.minimum(t, starts - 1).clip(0)
        toks = dec_in[np.arange(batch), pos][:, None]
        _, cache = step(toks, jnp.asarray(pos, jnp.int32), cache)
    block = jnp.stack([dec_in[b, s : s + k] for b, s in enumerate(starts)])
    logits, _ = step(block, jnp.asarray(starts, jnp.int32), cache)
    for b, s in enumerate(starts):
        np.testing.assert_allclose(logits[b], full[b, s : s + k], atol=1e-4)


def test_rollback_overwrites_stale_entries(tiny_target):
    """Write 5..12, then write again from 8 with other tokens: equals a fresh decode."""
    module, params = tiny_target
    batch, length = 2, 16
    enc = encoder_inputs(batch, 6, [6, 3])
    rng = np.random.RandomState(3)
    old = jnp.asarray(rng.randint(3, 32, (batch, length)), jnp.int32)
    new = old.at[:, 8:].set(jnp.asarray(rng.randint(3, 32, (batch, length - 8)), jnp.int32))
    dec_old, _ = teacher_forced(module, params, enc, old)
    dec_new, full_new = teacher_forced(module, params, enc, new)
    cache, step = models.EncoderDecoderModel(module).decoder_state(params, enc, length)
    pos = lambda t: jnp.full((batch,), t, jnp.int32)
    _, cache = step(dec_old[:, :5], pos(0), cache)
    _, cache = step(dec_old[:, 5:13], pos(5), cache)  # positions 5..12
    logits, cache = step(dec_new[:, 8:12], pos(8), cache)  # roll back to 8
    np.testing.assert_allclose(logits, full_new[:, 8:12], atol=1e-4)
    logits, _ = step(dec_new[:, 12:16], pos(12), cache)
    np.testing.assert_allclose(logits, full_new[:, 12:16], atol=1e-4)


def test_cross_attention_kv_is_cached_not_recomputed(tiny_target):
    """Steps read the cached encoder K/V: zeroing the cross-attention kernels changes nothing."""
    module, params = tiny_target
    enc = encoder_inputs(2, 5, [5, 2])
    cache, step = models.EncoderDecoderModel(module).decoder_state(params, enc, 6)
    tokens, pos = jnp.zeros((2, 1), jnp.int32), jnp.zeros((2,), jnp.int32)
    logits, _ = step(tokens, pos, cache)
    zeroed = jax.tree_util.tree_map_with_path(
        lambda p, x: (
            jnp.zeros_like(x)
            if any(getattr(k, "key", "") == "encoder_decoder_attention" for k in p)
            and p[-2].key in ("key", "value")
            else x
        ),
        params,
    )
    step_zeroed = models.make_block_step(module, zeroed, enc)
    logits_zeroed, _ = step_zeroed(tokens, pos, cache)
    np.testing.assert_array_equal(logits, logits_zeroed)
    layer = cache["decoder"]["layers_0"]
    assert layer["encoder_decoder_attention"]["cached_key"].shape == (2, 4, 5, 3)
    assert layer["self_attention"]["cached_key"].shape == (2, 4, 6, 3)


def test_cached_calls_without_positions_use_and_advance_cache_index(tiny_target):
    # T5X's convention (one token per call, position from the cache index) and ours (explicit
    # positions, which neither read nor move the index) give the same logits.
    module, params = tiny_target
    enc = encoder_inputs(2, 4, [4, 2])
    cache, step = models.EncoderDecoderModel(module).decoder_state(params, enc, 5)
    assert cache["decoder"]["cache_index"].shape == ()
    tokens = jnp.asarray([[0, 5, 7], [0, 9, 4]], jnp.int32)
    want, _ = step(tokens, jnp.zeros((2,), jnp.int32), cache)
    for t in range(3):
        logits, variables = module.apply(
            {"params": params, "cache": cache},
            None,
            enc,
            tokens[:, t : t + 1],
            decode=True,
            enable_dropout=False,
            mutable=["cache"],
            method=module.decode,
        )
        cache = variables["cache"]
        assert int(cache["decoder"]["cache_index"]) == t + 1
        np.testing.assert_allclose(logits[:, 0], want[:, t], rtol=1e-5, atol=1e-5)
    _, cache = step(tokens[:, :1], jnp.full((2,), 3, jnp.int32), cache)
    assert int(cache["decoder"]["cache_index"]) == 3


def test_relative_position_buckets_match_t5_reference():
    """Spot values of T5's bucketing (32 buckets, max distance 128)."""
    uni = network._bucket_table(False)
    bi = network._bucket_table(True)
    at = lambda table, n: int(table[n + network.MAX_DISTANCE])
    # Unidirectional: n = query - key >= 0 exact below 16, log-spaced to 31.
    assert [at(uni, n) for n in (0, 1, 15, 16, 127, 128)] == [0, 1, 15, 16, 31, 31]
    assert at(uni, -5) == 0
    # Bidirectional: n < 0 (key after query) in buckets 16..31, exact below 8.
    assert [at(bi, n) for n in (0, 7, 8, -1, -7, 128, -128)] == [0, 7, 8, 17, 23, 15, 31]


@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (2, 4), (4, 4), (1, 17), (3, 40)])
def test_embed_few_token_rows_equal_one_gather(shape):
    """`Embed` looks up <= FEW_TOKENS tokens one row at a time: the rows (and an out-of-range id's
    NaN fill, as `jnp.take`) are exactly those of the single gather T5X uses."""
    embed = network.Embed(num_embeddings=11, features=5, dtype=jnp.float32)
    tokens = jax.random.randint(jax.random.PRNGKey(0), shape, 0, 11).astype(jnp.int32)
    tokens = tokens.at[0, 0].set(11)  # out of range
    variables = embed.init(jax.random.PRNGKey(1), tokens)
    table = variables["params"]["embedding"]
    got = jax.jit(embed.apply)(variables, tokens)
    want = jnp.take(table, tokens, axis=0)
    assert got.shape == (*shape, 5)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.isnan(np.asarray(got)[0, 0]).all()
