"""bfloat16 end to end, as the paper path runs (T5X's T5 1.1 gins: bfloat16 activations, parameters
restored as bfloat16): dtypes and shapes on the way, and greedy speculative == greedy baseline."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import init_params, perturbed, tiny_config

from specdec_t5x import drafts, models, network

ENC = jnp.array([[5, 9, 3, 7, 1, 0], [4, 4, 8, 1, 0, 0]], jnp.int32)
MAX_LEN = 10


def _bf16(tree):
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), tree)


def test_bf16_speculative_greedy_equals_baseline_with_bf16_dtypes():
    config = tiny_config(vocab_size=32, dtype="bfloat16", emb_dim=16, head_dim=8)
    module = network.Transformer(config)
    params = _bf16(init_params(network.Transformer(tiny_config(32, emb_dim=16, head_dim=8)), 1))
    draft_params = _bf16(perturbed(jax.tree_util.tree_map(np.float32, params), 0.05, 2))
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}

    encoded = models.encode(module, params, ENC)
    assert encoded.dtype == jnp.bfloat16 and encoded.shape == (2, 6, 16)
    cache = models.init_cache(module, params, encoded, ENC, MAX_LEN)
    kv = cache["decoder"]["layers_0"]["self_attention"]["cached_key"]
    assert kv.dtype == jnp.bfloat16 and kv.shape == (2, config.num_heads, MAX_LEN, 8)
    logits, _ = models.make_block_step(module, params, ENC)(
        jnp.zeros((2, 3), jnp.int32), jnp.zeros((2,), jnp.int32), cache
    )
    assert logits.dtype == jnp.float32 and logits.shape == (2, 3, 32)

    spec = models.SpeculativeEncoderDecoderModel(module, drafts.T5Draft(module, draft_params))
    base = models.EncoderDecoderModel(module)
    batch = {
        "encoder_input_tokens": ENC,
        "decoder_input_tokens": jnp.zeros((2, MAX_LEN), jnp.int32),
    }
    greedy = {"temperature": 0.0, "topk": 0}
    want = jax.jit(lambda p, b: base.predict_batch(p, b, decoder_params=greedy))(params, batch)
    got, aux = jax.jit(
        lambda p, d, b: spec.predict_batch_with_aux(
            p, b, decoder_params={**greedy, "gamma": 3}, draft_params=d
        )
    )(params, draft_params, batch)
    assert got.dtype == jnp.int32 and got.shape == (2, MAX_LEN)
    np.testing.assert_array_equal(got, want)
    # The perturbed draft disagrees sometimes: both accept and reject paths ran.
    stats = aux["stats"]
    assert 0 < int(stats.num_accepted.sum()) < int(stats.num_draft_tokens.sum())
