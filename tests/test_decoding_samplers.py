"""Baseline samplers: the fair draw ('inverse_cdf') samples T5X's distribution ('t5x').

Sequences of a toy first-order Markov model are enumerated exactly; both samplers' frequencies are
chi-square tested against that distribution and against each other (homogeneity).
"""

import itertools

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs
from scipy import stats

from specdec_t5x import decoding, gin_utils, models, sampling

VOCAB, EOS, LENGTH = 6, 1, 3
N = 20000
SETTINGS = [(0.5, 0, 0.0), (1.0, 0, 0.0), (2.0, 0, 0.0), (1.0, 3, 0.0), (1.0, 0, 0.8)]


def markov_table(seed: int = 0) -> np.ndarray:
    """float32 [LENGTH, VOCAB, VOCAB] logits of output t given the token fed at step t."""
    return (np.random.RandomState(seed).randn(LENGTH, VOCAB, VOCAB) * 1.5).astype(np.float32)


def markov_logits(table):
    table = jnp.asarray(table)

    def tokens_to_logits(state: decoding.DecodingState):
        return table[state.cur_index, state.cur_token[:, 0]], state.cache  # [B', V]

    return tokens_to_logits


def sample(table, sampler, rows=N, seed=5, **settings):
    inputs = jnp.zeros((rows, LENGTH), jnp.int32)
    cache = jnp.zeros((rows,), jnp.float32)
    fn = jax.jit(
        lambda rng: decoding.temperature_sample(
            inputs, cache, markov_logits(table), EOS, rng, sampler=sampler, **settings
        )
    )
    decodes, log_probs = fn(jax.random.PRNGKey(seed))
    return np.asarray(decodes[:, 0]), np.asarray(log_probs[:, 0])  # [rows, L], [rows]


def exact_sequence_probs(table, temperature, topk, topp) -> dict[tuple[int, ...], float]:
    """{decode: probability} under the adjusted distribution (EOS ends a row; zeros after it)."""
    adjusted = np.asarray(
        sampling.adjusted_probs(jnp.asarray(table), temperature, topk, topp), np.float64
    )
    adjusted /= adjusted.sum(-1, keepdims=True)
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        p, fed, out = 1.0, 0, []
        for t, y in enumerate(seq):
            p *= adjusted[t, fed, y]
            out.append(y)
            fed = y
            if y == EOS:
                break
        if seq[len(out) :] != (0,) * (LENGTH - len(out)):
            continue  # each truncated sequence once
        key = tuple(out) + (0,) * (LENGTH - len(out))
        probs[key] = probs.get(key, 0.0) + p
    return probs


def counts(decodes) -> dict[tuple[int, ...], int]:
    keys, freq = np.unique(decodes, axis=0, return_counts=True)
    return {tuple(int(t) for t in k): int(c) for k, c in zip(keys, freq, strict=True)}


def pooled_bins(expected: dict, observed: list[dict]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Expected counts (per N draws) and observed counts per bin; bins below 5 pooled."""
    keys = sorted(expected, key=expected.get, reverse=True)
    exp = np.array([expected[k] * N for k in keys])
    obs = [np.array([o.get(k, 0) for k in keys], np.float64) for o in observed]
    big = exp >= 5
    exp = np.append(exp[big], exp[~big].sum())
    obs = [np.append(o[big], o[~big].sum()) for o in obs]
    if exp[-1] < 5:  # merge a small pooled bin into the last big one
        exp = np.append(exp[:-2], exp[-2:].sum())
        obs = [np.append(o[:-2], o[-2:].sum()) for o in obs]
    return exp, obs


@pytest.mark.parametrize("temperature, topk, topp", SETTINGS)
def test_fair_and_t5x_samplers_draw_the_exact_distribution(temperature, topk, topp):
    table = markov_table()
    settings = dict(temperature=temperature, topk=topk, topp=topp)
    expected = exact_sequence_probs(table, **settings)
    fair = counts(sample(table, "inverse_cdf", **settings)[0])
    t5x = counts(sample(table, "t5x", **settings)[0])
    for name, observed in (("inverse_cdf", fair), ("t5x", t5x)):
        impossible = {k: v for k, v in observed.items() if expected.get(k, 0.0) == 0.0}
        assert not impossible, (name, impossible)  # e.g. a token top-k / top-p removed
    exp, (fair_obs, t5x_obs) = pooled_bins(expected, [fair, t5x])
    assert len(exp) >= 10  # enough bins for the test to have power
    for name, obs in (("inverse_cdf", fair_obs), ("t5x", t5x_obs)):
        pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
        assert pvalue > 1e-3, (name, pvalue)
    # The two samplers against each other (homogeneity of two samples of N).
    assert stats.chi2_contingency(np.stack([fair_obs, t5x_obs])).pvalue > 1e-3


def test_fair_sampler_is_not_t5x_draw_but_argmax_mode_is_identical():
    table = markov_table(1)
    fair, fair_lp = sample(table, "inverse_cdf", rows=64, temperature=1.0, topk=0)
    t5x, _ = sample(table, "t5x", rows=64, temperature=1.0, topk=0)
    assert np.any(fair != t5x)  # a different draw (same distribution: test above)
    greedy = {s: sample(table, s, rows=4, temperature=0.0, topk=0) for s in decoding.SAMPLERS}
    path, fed = [], 0
    for t in range(LENGTH):
        fed = int(np.argmax(table[t, fed]))
        path.append(fed)
        if fed == EOS:
            break
    path += [0] * (LENGTH - len(path))
    for tokens, log_probs in greedy.values():
        np.testing.assert_array_equal(tokens, np.broadcast_to(path, (4, LENGTH)))
        np.testing.assert_array_equal(log_probs, 0.0)
    # Rescaled log-probs: the sum over emitted tokens of log p_adjusted (T5X's meaning).
    log_p = np.log(np.asarray(sampling.adjusted_probs(jnp.asarray(table), 1.0), np.float64))
    for row, lp in zip(fair, fair_lp, strict=True):
        fed, want = 0, 0.0
        for t, y in enumerate(row):
            want += log_p[t, fed, y]
            fed = y
            if y == EOS:
                break
        np.testing.assert_allclose(lp, want, rtol=1e-5, atol=1e-5)


def test_fair_sampler_per_row_temperature_array():
    table = markov_table(2)
    temps = jnp.tile(jnp.array([0.0, 1.0], jnp.float32), N // 2)  # even rows greedy
    decodes, _ = sample(table, "inverse_cdf", temperature=temps, topk=0)
    greedy, _ = sample(table, "t5x", rows=1, temperature=0.0, topk=0)
    np.testing.assert_array_equal(decodes[0::2], np.broadcast_to(greedy[0], (N // 2, LENGTH)))
    expected = exact_sequence_probs(table, 1.0, 0, 0.0)
    exp, (obs,) = pooled_bins(expected, [counts(decodes[1::2])])
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_bad_sampler_name_is_a_value_error_naming_it(tiny_target):
    table = markov_table()
    with pytest.raises(ValueError, match=r"one of \('t5x', 'inverse_cdf'\); got sampler='gumbel'"):
        sample(table, "gumbel", rows=2, temperature=1.0, topk=0)
    module, _ = tiny_target
    with pytest.raises(ValueError, match="gumbel"):
        models.EncoderDecoderModel(module, sampler="gumbel")
    with pytest.raises(ValueError, match="takes no sampler"):
        models.SpeculativeEncoderDecoderModel(module, draft=None, sampler="inverse_cdf")


def test_model_constructor_and_decoder_params_select_the_sampler(tiny_target):
    module, params = tiny_target
    batch = {
        "encoder_input_tokens": encoder_inputs(4, 5, [5, 3, 4, 2]),
        "decoder_input_tokens": jnp.zeros((4, 6), jnp.int32),
    }
    settings = {"temperature": 1.0, "topk": 0}
    rng = jax.random.PRNGKey(4)

    def decode(model, **extra):
        return np.asarray(
            model.predict_batch_with_aux(params, batch, rng, decoder_params={**settings, **extra})[
                0
            ]
        )

    fair_model = models.EncoderDecoderModel(module, sampler="inverse_cdf")
    plain = models.EncoderDecoderModel(module)
    fair = decode(fair_model)
    np.testing.assert_array_equal(fair, decode(plain, sampler="inverse_cdf"))
    np.testing.assert_array_equal(decode(plain), decode(plain, sampler="t5x"))  # default: T5X
    np.testing.assert_array_equal(decode(fair_model, sampler="t5x"), decode(plain))  # per call
    # The model's decoder closure called directly with the fair draw gives the same tokens.
    cache, step = plain.decoder_state(params, batch["encoder_input_tokens"], 6)
    direct = decoding.temperature_sample(
        jnp.zeros((4, 6), jnp.int32),
        cache,
        models.one_token_logits_fn(step),
        EOS,
        rng,
        sampler="inverse_cdf",
        **settings,
    )[0][:, -1]
    np.testing.assert_array_equal(fair, direct)


def test_gin_baseline_sampler_macro(clean_gin):
    gin_utils.parse(
        ["gin/models/t5_1_1_tiny.gin", "gin/decoding/temperature.gin"],
        ["DROPOUT_RATE = 0.0", "BASELINE_SAMPLER = 'inverse_cdf'", "gin_utils.build.obj = %MODEL"],
        finalize=False,
    )
    model = gin_utils.build()
    assert gin.query_parameter("%BASELINE_SAMPLER") == "inverse_cdf"
    table = markov_table()
    inputs, cache = jnp.zeros((8, LENGTH), jnp.int32), jnp.zeros((8,), jnp.float32)
    rng = jax.random.PRNGKey(9)
    via_gin = model.decode_fn(inputs, cache, markov_logits(table), EOS, rng)[0]
    direct = decoding.temperature_sample(
        inputs,
        cache,
        markov_logits(table),
        EOS,
        rng,
        temperature=1.0,
        topk=0,
        sampler="inverse_cdf",
    )[0]
    np.testing.assert_array_equal(via_gin, direct)
