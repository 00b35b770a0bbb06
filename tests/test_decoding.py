"""Baseline `temperature_sample`: T5X semantics on fakes and on the tiny T5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs
from scipy import stats

from specdec_t5x import decoding, models, sampling

VOCAB, EOS = 6, 1


def fake_from_table(table):
    """tokens_to_logits whose logits depend only on the position: table float32 [L, V]."""
    table = jnp.asarray(table, jnp.float32)

    def tokens_to_logits(state: decoding.DecodingState):
        return table[state.cur_index], state.cache

    return tokens_to_logits


def one_hot_path(tokens, vocab=VOCAB):
    """Logits table making `tokens` the argmax path."""
    return np.where(np.eye(vocab)[tokens] > 0, 5.0, 0.0)


def run(inputs, table, **kwargs):
    cache = {"dummy": jnp.zeros((inputs.shape[0],))}
    return decoding.temperature_sample(
        jnp.asarray(inputs, jnp.int32), cache, fake_from_table(table), EOS, **kwargs
    )


def test_greedy_with_eos_pads_with_zeros():
    decodes, log_probs = run(np.zeros((2, 6)), one_hot_path([3, 4, 1, 5, 5, 5]), temperature=0.0)
    assert decodes.shape == (2, 1, 6) and log_probs.shape == (2, 1)
    np.testing.assert_array_equal(decodes[:, 0], [[3, 4, 1, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(log_probs, 0.0)  # rescaled greedy log-prob is 0


def test_forced_prompt_with_eos_inside_and_log_probs_not_counted():
    # Prompt [2, 1] (an EOS inside the prompt must not stop decoding), then the model path.
    inputs = np.array([[0, 2, 1, 0, 0, 0]])
    table = one_hot_path([5, 5, 4, 3, 1, 4])
    decodes, lp = run(inputs, table, temperature=0.0, rescale_log_probs=False)
    np.testing.assert_array_equal(decodes[0, 0], [2, 1, 4, 3, 1, 0])
    expected = sum(
        jax.nn.log_softmax(jnp.asarray(table[i]))[t] for i, t in [(2, 4), (3, 3), (4, 1)]
    )
    np.testing.assert_allclose(lp[0, 0], expected, rtol=1e-6)


def test_max_decode_steps_counts_from_the_prompt():
    inputs = np.array([[0, 2, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    decodes, _ = run(inputs, one_hot_path([3] * 6), temperature=0.0, max_decode_steps=2)
    # Row 0: nonzero count 1 -> limit 3 tokens; row 1: limit 2 tokens.
    np.testing.assert_array_equal(decodes[:, 0], [[2, 3, 3, 0, 0, 0], [3, 3, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="max_decode_steps"):
        run(inputs, one_hot_path([3] * 6), temperature=0.0, max_decode_steps=7)


def test_default_topk_1_is_greedy_like_t5x():
    table = np.random.RandomState(0).randn(4, VOCAB)
    decodes, _ = run(np.zeros((8, 4)), table, temperature=1.0)  # topk defaults to 1
    np.testing.assert_array_equal(decodes[:, 0], np.broadcast_to(np.argmax(table, -1), (8, 4)))


@pytest.mark.parametrize(
    "temperature, topk, topp", [(1.0, 0, 0.0), (0.5, 0, 0.0), (2.0, 3, 0.0), (1.0, 0, 0.8)]
)
def test_sample_frequencies_pass_chi_square(temperature, topk, topp):
    logits = np.array([1.0, -0.5, 0.3, 2.0, 0.0, -1.0])
    n = 20000
    decodes, _ = run(
        np.zeros((n, 1)),
        logits[None],
        temperature=temperature,
        topk=topk,
        topp=topp,
        decode_rng=jax.random.PRNGKey(7),
    )
    probs = np.asarray(sampling.adjusted_probs(jnp.asarray(logits), temperature, topk, topp))
    probs = probs.astype(np.float64) / probs.sum(dtype=np.float64)
    counts = np.bincount(np.asarray(decodes[:, 0, 0]), minlength=VOCAB)
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs[support] / probs[support].sum() * n
    _, pvalue = stats.chisquare(counts[support], expected)
    assert pvalue > 1e-3, (counts, probs * n)


def test_num_decodes_sorted_best_last_and_rescale_false_is_raw_log_prob():
    table = np.random.RandomState(1).randn(5, VOCAB)
    decodes, lp = run(
        np.zeros((2, 5)),
        table,
        temperature=1.0,
        topk=0,
        num_decodes=4,
        rescale_log_probs=False,
        decode_rng=jax.random.PRNGKey(3),
    )
    assert decodes.shape == (2, 4, 5)
    assert np.all(np.diff(np.asarray(lp), axis=1) >= 0)
    raw = jax.nn.log_softmax(jnp.asarray(table), -1)
    for b in range(2):
        for d in range(4):
            seq = np.asarray(decodes[b, d])
            ended = np.cumsum(seq == EOS) - (seq == EOS) > 0
            want = sum(float(raw[i, t]) for i, t in enumerate(seq) if not ended[i])
            np.testing.assert_allclose(lp[b, d], want, rtol=1e-5)


def test_per_example_temperature_array():
    table = np.random.RandomState(2).randn(4, VOCAB)
    temps = jnp.array([0.0, 1.0, 0.0])
    decodes, _ = jax.jit(
        lambda t: run(np.zeros((3, 4)), table, temperature=t, topk=0),
    )(temps)
    np.testing.assert_array_equal(decodes[0, 0], np.argmax(table, -1))
    np.testing.assert_array_equal(decodes[2, 0], np.argmax(table, -1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(topk=2, topp=0.5), "topk"),
        (dict(topk=0, topp=1.5), "topp"),
        (dict(topk=0, temperature=-1.0), "temperature"),
        (dict(topk=-3), "topk"),
    ],
)
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        run(np.zeros((1, 3)), np.zeros((3, VOCAB)), **kwargs)


def test_greedy_equals_brute_force_argmax_rollout(tiny_target):
    """The cached loop equals re-scoring the whole prefix with the full forward every step."""
    module, params = tiny_target
    batch, length = 3, 10
    enc = encoder_inputs(batch, 6, [6, 3, 5])
    model = models.EncoderDecoderModel(module)
    batch_in = {"encoder_input_tokens": enc, "decoder_input_tokens": jnp.zeros((batch, length))}
    decodes, _ = jax.jit(
        lambda p, b: model.predict_batch_with_aux(p, b, decoder_params={"temperature": 0.0})
    )(params, {**batch_in, "decoder_input_tokens": jnp.zeros((batch, length), jnp.int32)})

    full = jax.jit(
        lambda dec: module.apply({"params": params}, enc, dec, dec + 1, enable_dropout=False)
    )
    out = np.zeros((batch, length), np.int32)
    ended = np.zeros(batch, bool)
    for t in range(length):
        dec_in = np.pad(out[:, :-1], ((0, 0), (1, 0)))
        tok = np.argmax(np.asarray(full(jnp.asarray(dec_in)))[:, t], -1)
        out[:, t] = np.where(ended, 0, tok)
        ended |= tok == EOS
    np.testing.assert_array_equal(decodes, out)


def test_score_batch_of_greedy_decode_equals_sum_of_log_probs(tiny_target):
    module, params = tiny_target
    batch, length = 2, 8
    enc = encoder_inputs(batch, 5, [5, 2])
    model = models.EncoderDecoderModel(module)
    zeros = jnp.zeros((batch, length), jnp.int32)
    decodes, aux = model.predict_batch_with_aux(
        params,
        {"encoder_input_tokens": enc, "decoder_input_tokens": zeros},
        decoder_params={"temperature": 0.0, "rescale_log_probs": False},
    )
    targets = decodes
    dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    scores = model.score_batch(
        params,
        {
            "encoder_input_tokens": enc,
            "decoder_input_tokens": dec_in,
            "decoder_target_tokens": targets,
            "decoder_loss_weights": (jnp.cumsum(targets == EOS, 1) - (targets == EOS) == 0)
            & (targets > 0),
        },
    )
    np.testing.assert_allclose(scores, aux["scores"], rtol=1e-5, atol=1e-5)
