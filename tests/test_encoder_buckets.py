"""Encoder length buckets on the CPU inference path (`steps.bucketed`): same decodes, less set-up."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, tiny_config

from specdec_t5x import cpu_kernel, drafts, models, network, speculative, steps

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.available(),
    reason="CPU kernel extension not built (bucketing follows packed parameters)",
)

ENC_LEN = 40  # buckets (16, 32, 40)
LENGTHS = [3, 16, 17, 33, 40, 0]  # first bucket, its edge, second, third, full, a padding row


@pytest.fixture(scope="module")
def target():
    module = network.Transformer(tiny_config(vocab_size=48))
    params = init_params(module, 3)
    return module, params, models.pack_params(module, params)


def test_bucket_lengths():
    assert steps.encoder_length_buckets(64) == (16, 32, 48, 64)
    assert steps.encoder_length_buckets(256) == tuple(range(32, 257, 32))
    assert steps.encoder_length_buckets(40) == (16, 32, 40)
    assert steps.encoder_length_buckets(16) == (16,)
    assert steps.encoder_length_buckets(8) == (8,)
    assert steps.encoder_length_buckets(17) == (16, 17)
    for n in (100, 512, 1000, 4096):
        b = steps.encoder_length_buckets(n)
        assert b[-1] == n and len(b) <= steps.MAX_BUCKETS and list(b) == sorted(set(b))
        assert all(x % steps.MIN_BUCKET == 0 for x in b[:-1])
    with pytest.raises(ValueError, match="enc_len=0"):
        steps.encoder_length_buckets(0)


@needs_kernel
def test_bucketing_follows_packed_parameters_and_env(target, monkeypatch):
    module, params, packed = target
    assert steps.length_bucketing(packed, ENC_LEN)
    assert not steps.length_bucketing(params, ENC_LEN)  # raw tree: T5X's padded encoder
    assert not steps.length_bucketing(packed, 16)  # one bucket only
    monkeypatch.setenv(steps.BUCKETS_ENV_VAR, "0")
    assert not steps.length_bucketing(packed, ENC_LEN)


@needs_kernel
@pytest.mark.parametrize("length", LENGTHS)
def test_encoder_output_at_each_bucket(target, length):
    """Real positions: the padded-length encoder's values (float32 rounding); past the bucket:
    zeros; the bucket the host helper names is the one used."""
    module, params, packed = target
    enc = encoder_inputs(2, ENC_LEN, [min(length, 5), length], vocab=48, seed=length)
    full = np.asarray(steps.encode(module, params, enc))
    out = np.asarray(jax.jit(lambda p, e: steps.encode(module, p, e))(packed, enc))
    bucket = steps.setup_length(packed, enc)
    assert bucket == next(b for b in (16, 32, 40) if b >= length)
    for row, n in enumerate([min(length, 5), length]):
        np.testing.assert_allclose(out[row, :n], full[row, :n], rtol=1e-5, atol=1e-6)
    assert not out[:, bucket:].any()
    if bucket < ENC_LEN:
        assert full[:, bucket:].any()  # so the zeros above are the bucketing's doing


@needs_kernel
def test_env_off_and_raw_params_keep_padded_encoder_bit_for_bit(target, monkeypatch):
    module, params, packed = target
    enc = encoder_inputs(1, ENC_LEN, [7], vocab=48)
    ref = module.apply({"params": params}, enc, enable_dropout=False, method=module.encode)
    np.testing.assert_array_equal(steps.encode(module, params, enc), ref)
    monkeypatch.setenv(steps.BUCKETS_ENV_VAR, "0")
    # The encoder's own projections on the kernel change only the float32 summation order...
    np.testing.assert_allclose(steps.encode(module, packed, enc), ref, rtol=1e-5, atol=1e-5)
    assert steps.setup_length(packed, enc) == ENC_LEN
    # ... and with them on jnp.dot (SPECDEC_CPU_KERNEL_SETUP=0) it is T5X's encoder bit for bit.
    with cpu_kernel.env_var(cpu_kernel.SETUP_ENV_VAR, "0"):
        decode_only = models.pack_params(module, params)
    np.testing.assert_array_equal(steps.encode(module, decode_only, enc), ref)


@needs_kernel
def test_cache_and_logits_match_the_padded_set_up(target, monkeypatch):
    """Cross K/V zero past the bucket, equal (float32 rounding) before it; the block step's logits
    from either cache agree to 1e-5."""
    module, params, packed = target
    enc = encoder_inputs(2, ENC_LEN, [9, 20], vocab=48, seed=5)
    cache = steps.prepare_cache(module, packed, enc, 6)
    monkeypatch.setenv(steps.BUCKETS_ENV_VAR, "0")
    ref = steps.prepare_cache(module, packed, enc, 6)
    flat, ref_flat = jax.tree_util.tree_flatten_with_path(cache)[0], jax.tree.leaves(ref)
    crossed = 0
    for (path, leaf), r in zip(flat, ref_flat, strict=True):
        assert leaf.shape == r.shape
        if "encoder_decoder_attention" in jax.tree_util.keystr(path):
            crossed += 1
            for row, n in enumerate([9, 20]):  # real positions (pads differ: another length)
                np.testing.assert_allclose(
                    leaf[row, ..., :n, :], r[row, ..., :n, :], rtol=1e-5, atol=1e-6
                )
            assert not np.asarray(leaf[..., 32:, :]).any()
        else:
            np.testing.assert_array_equal(leaf, r)
    assert crossed == 2 * module.config.num_decoder_layers
    step = steps.make_block_step(module, packed, enc)
    tokens, pos = jnp.asarray([[0, 4, 9], [0, 7, 7]], jnp.int32), jnp.zeros((2,), jnp.int32)
    np.testing.assert_allclose(
        step(tokens, pos, cache)[0], step(tokens, pos, ref)[0], rtol=1e-5, atol=1e-6
    )


@needs_kernel
def test_under_vmap_and_while_loop(target):
    """A batched bucket index (vmap) runs every branch and selects; inside a loop it still picks
    each iteration's own bucket."""
    module, _, packed = target
    enc = encoder_inputs(3, ENC_LEN, [4, 25, 40], vocab=48, seed=2)
    one = lambda e: steps.encode(module, packed, e[None])[0]  # noqa: E731
    mapped = jax.jit(jax.vmap(one))(enc)
    looped = jax.lax.fori_loop(
        0, 3, lambda i, acc: acc.at[i].set(one(enc[i])), jnp.zeros(mapped.shape)
    )
    for row, n in enumerate([4, 25, 40]):
        ref = one(enc[row])
        np.testing.assert_allclose(mapped[row, :n], ref[:n], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(looped[row], ref)


@needs_kernel
@pytest.mark.parametrize("share_target_encoder", [False, True])
def test_speculative_greedy_equals_baseline_with_buckets(target, share_target_encoder):
    """The exactness claim on the bucketed path: speculative greedy == baseline greedy, with the
    draft's own encoder or the target's (its cross K/V padded inside the same bucket)."""
    module, params, packed = target
    if share_target_encoder:
        dmod = network.TargetEncoderTransformer(
            tiny_config(vocab_size=48, num_decoder_layers=1), encoder_config=module.config
        )
        dparams = drafts.with_target_encoder(init_params(dmod, 7), params)
    else:
        dmod = network.Transformer(tiny_config(vocab_size=48, num_decoder_layers=1))
        dparams = init_params(dmod, 7)
    draft = drafts.T5Draft(dmod, dparams, share_target_encoder=share_target_encoder)
    spec = models.SpeculativeEncoderDecoderModel(module, draft)
    base = models.EncoderDecoderModel(module)
    batch = {
        "encoder_input_tokens": encoder_inputs(4, ENC_LEN, [12, 30, 38, 5], vocab=48, seed=9),
        "decoder_input_tokens": jnp.zeros((4, 10), jnp.int32),
    }
    greedy = {"temperature": 0.0}
    ref = base.predict_batch_with_aux(packed, batch, decoder_params=greedy)[0]
    out, aux = spec.predict_batch_with_aux(packed, batch, decoder_params={**greedy, "gamma": 3})
    np.testing.assert_array_equal(out, ref)
    assert isinstance(aux["stats"], speculative.SpeculativeStats)
    assert steps.setup_length(packed, batch["encoder_input_tokens"]) == ENC_LEN
    one = {k: v[:1] for k, v in batch.items()}  # 12 tokens: the first bucket
    assert steps.setup_length(packed, one["encoder_input_tokens"]) == 16
    np.testing.assert_array_equal(
        spec.predict_batch_with_aux(packed, one, decoder_params={**greedy, "gamma": 2})[0], ref[:1]
    )


@needs_kernel
def test_warmup_sources_cover_every_bucket(target, monkeypatch):
    module, params, packed = target
    enc = encoder_inputs(2, ENC_LEN, [5, 9], vocab=48)
    sources = steps.warmup_sources(packed, enc)
    assert [steps.setup_length(packed, s) for s in sources] == [16, 32, 40]
    assert all(s.shape == enc.shape and s.dtype == jnp.int32 for s in sources)
    assert steps.warmup_sources(params, enc) == [enc]  # raw parameters: no buckets
    monkeypatch.setenv(steps.BUCKETS_ENV_VAR, "0")
    assert steps.warmup_sources(packed, enc) == [enc]
