"""Adjusted distributions: top-k / top-p masks against a NumPy reference, ties included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import sampling


def np_topk_keep(logits: np.ndarray, k: int) -> np.ndarray:
    kth = np.sort(logits, axis=-1)[..., ::-1][..., k - 1 : k]
    return logits >= kth


def np_topp_keep(logits: np.ndarray, p: float) -> np.ndarray:
    keep = np.zeros(logits.shape, bool)
    for i, row in enumerate(logits):
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        mass, threshold = 0.0, None
        for j in order:  # smallest prefix with mass >= p
            threshold = probs[j]
            mass += probs[j]
            if mass >= p:
                break
        keep[i] = probs >= threshold * (1 - 1e-6)
    return keep


def random_logits(seed, ties: bool):
    rng = np.random.RandomState(seed)
    logits = rng.randn(16, 11).astype(np.float32)
    if ties:  # round so many values repeat exactly
        logits = np.round(logits * 2) / 2
    return logits


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 11])
def test_topk_mask_matches_numpy(ties, k):
    logits = random_logits(k, ties)
    masked = np.asarray(sampling.topk_mask(jnp.asarray(logits), k))
    np.testing.assert_array_equal(masked > sampling.NEG_INF / 2, np_topk_keep(logits, k))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.8, 0.95])
def test_topp_mask_matches_numpy(ties, p):
    logits = random_logits(int(p * 100), ties)
    masked = np.asarray(sampling.topp_mask(jnp.asarray(logits), p))
    np.testing.assert_array_equal(masked > sampling.NEG_INF / 2, np_topp_keep(logits, p))


def test_adjusted_probs_is_distribution_and_greedy_is_one_hot():
    logits = jnp.asarray(random_logits(0, False))
    for temperature, topk, topp in [(1.0, 0, 0.0), (0.5, 3, 0.0), (2.0, 0, 0.8)]:
        probs = sampling.adjusted_probs(logits, temperature, topk, topp)
        np.testing.assert_allclose(jnp.sum(probs, -1), 1.0, rtol=1e-5)
        assert not jnp.any(jnp.isnan(probs))
    greedy = sampling.adjusted_probs(logits, 0.0)
    np.testing.assert_array_equal(jnp.argmax(greedy, -1), jnp.argmax(logits, -1))
    np.testing.assert_array_equal(jnp.sum(greedy, -1), 1.0)


def test_sample_is_argmax_below_min_temperature():
    logits = jnp.asarray(random_logits(3, False))
    token = sampling.sample(jax.random.PRNGKey(0), logits, sampling.MIN_TEMPERATURE / 2)
    np.testing.assert_array_equal(token, jnp.argmax(logits, -1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.1, topk=0, topp=0.0), "temperature"),
        (dict(temperature=1.0, topk=-1, topp=0.0), "topk"),
        (dict(temperature=1.0, topk=0, topp=1.5), "topp"),
        (dict(temperature=1.0, topk=2, topp=0.5), "topk"),
    ],
)
def test_validate_names_the_bad_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sampling.validate(**kwargs)


def test_first_argmax_equals_jnp_argmax_with_ties_nan_and_inf():
    rng = np.random.RandomState(0)
    logits = np.round(rng.randn(64, 300) * 2).astype(np.float32)  # many exact ties
    logits[1] = -np.inf  # all -inf: index 0
    logits[2, [7, 200]] = np.inf  # first +inf
    logits[3, [5, 250]] = np.nan  # first NaN wins, as jnp.argmax
    logits[4] = 3.0  # all equal
    logits[5, -1] = 100.0  # last index
    got = sampling.first_argmax(jnp.asarray(logits))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.argmax(jnp.asarray(logits), axis=-1))
    np.testing.assert_array_equal(got[1:6], [0, 7, 5, 0, 299])
    cube = jnp.asarray(logits.reshape(8, 8, 300))
    np.testing.assert_array_equal(sampling.first_argmax(cube), jnp.argmax(cube, axis=-1))


def _inverse_cdf_rows(vocab: int) -> np.ndarray:
    """Test distributions float32 [4, vocab] over several `INVERSE_CDF_BLOCK` blocks: top-k and
    top-p masked rows (zeros, including whole zero blocks), and rows with tiny entries."""
    rng = np.random.RandomState(1)
    logits = jnp.asarray(rng.randn(4, vocab).astype(np.float32) * 2)
    rows = [
        sampling.adjusted_probs(logits[0], 1.0, topk=9),
        sampling.adjusted_probs(logits[1], 1.5, topp=0.9),
        sampling.adjusted_probs(logits[2], 1.0),
    ]
    tiny = np.zeros(vocab, np.float32)  # tiny masses among zeros, far apart
    tiny[[3, 150, vocab - 1]] = [0.5, 0.497, 0.003]
    return np.stack([np.asarray(r) for r in rows] + [tiny])


@pytest.mark.parametrize("row", range(4))
def test_inverse_cdf_sample_has_the_exact_distribution(row):
    from scipy import stats

    vocab, n = 300, 60000  # 3 blocks of 128 (the last one padded)
    probs = _inverse_cdf_rows(vocab)[row]
    u = jax.random.uniform(jax.random.PRNGKey(100 + row), (n,))
    tokens = np.asarray(sampling.inverse_cdf_sample(u, jnp.broadcast_to(probs * 3.0, (n, vocab))))
    assert np.all(probs[tokens] > 0), "sampled a token with probability 0"
    # The token is the float64 inverse CDF at u (up to float32 rounding at interval edges).
    cdf = np.cumsum(probs.astype(np.float64)) / probs.sum(dtype=np.float64)
    want = np.minimum(np.searchsorted(cdf, np.asarray(u, np.float64), side="right"), vocab - 1)
    assert np.mean(tokens != want) < 1e-3
    counts = np.bincount(tokens, minlength=vocab).astype(np.float64)
    expected = probs.astype(np.float64) / probs.sum() * n
    big = expected >= 5  # pool small bins (tiny entries) into one
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    assert len(obs) >= 3  # a real test: several bins
    assert stats.chisquare(obs, exp).pvalue > 1e-3


def test_inverse_cdf_sample_never_returns_a_zero_probability_token():
    vocab = 300
    probs = np.zeros((6, vocab), np.float32)
    probs[0, 0] = 1.0  # only the first token
    probs[1, vocab - 1] = 1.0  # only the last token (in the padded block)
    probs[2, [127, 128]] = [1e-30, 1.0]  # a tiny entry at a block edge
    probs[3, [5, 256]] = [1.0, 1e-30]  # a tiny last entry after two empty blocks
    probs[4, 130:140] = 1e-37  # the smallest normal float32 magnitudes only
    probs[5] = _inverse_cdf_rows(vocab)[0]  # top-k masked
    # u = 1 is outside jax.random.uniform's range but accepted (u · total is kept below total).
    extremes = np.array([0.0, 1e-30, 0.5, np.nextafter(np.float32(1), 0), 1.0], np.float32)
    u = np.concatenate([extremes, np.linspace(0, 1, 2001, endpoint=False, dtype=np.float32)])
    for r, row in enumerate(probs):
        tokens = np.asarray(
            sampling.inverse_cdf_sample(jnp.asarray(u), jnp.broadcast_to(row, (len(u), vocab)))
        )
        assert np.all(row[tokens] > 0), (r, np.unique(tokens[row[tokens] == 0]))
    # u = 0 gives the first token with positive mass, u -> 1 the last one (up to float32).
    first = sampling.inverse_cdf_sample(jnp.zeros(4), jnp.asarray(probs[:4]))
    np.testing.assert_array_equal(first, [0, vocab - 1, 127, 5])
    for u_last in extremes[-2:]:
        last = sampling.inverse_cdf_sample(jnp.full(4, u_last), jnp.asarray(probs[:4]))
        np.testing.assert_array_equal(last, [0, vocab - 1, 128, 5])  # 1 + 1e-30 rounds to 1
    # No positive mass at all (contract violated): still an id inside the vocabulary.
    empty = sampling.inverse_cdf_sample(jnp.asarray(extremes), jnp.zeros((len(extremes), vocab)))
    assert np.all((np.asarray(empty) >= 0) & (np.asarray(empty) < vocab))


def test_inverse_cdf_sample_keeps_leading_dimensions():
    probs = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (2, 3, 200)))
    u = jax.random.uniform(jax.random.PRNGKey(1), (2, 3))
    got = sampling.inverse_cdf_sample(u, probs)
    assert got.shape == (2, 3) and got.dtype == jnp.int32
    np.testing.assert_array_equal(
        got.reshape(-1), sampling.inverse_cdf_sample(u.reshape(-1), probs.reshape(6, 200))
    )
