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
