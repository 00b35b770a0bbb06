"""Sampling edge semantics against goldens produced by real T5X (see tests/golden/README.md).

Each expected value here was computed by T5X's own `binary_search.topp_mask / topk_mask` and
`decoding.temperature_sample` (commit in tests/golden/t5x_sampling.json), not re-derived by us.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import decoding, sampling

GOLDEN = pathlib.Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDEN / "t5x_sampling.json").read_text())
    with np.load(GOLDEN / "t5x_sampling.npz") as arrays:
        return dict(arrays), meta


def _kept(mask_fn, logits, settings, values):
    """bool [rows, vocab]: our kept tokens, one call per distinct setting (T5X's are static)."""
    kept = np.zeros(logits.shape, bool)
    for value in np.unique(settings):
        rows = settings == value
        masked = np.asarray(mask_fn(jnp.asarray(logits[rows]), values(value)))
        kept[rows] = masked != sampling.NEG_INF
    return kept


@pytest.mark.parametrize("case", ["topp_grid", "topp_cont"])
def test_topp_keeps_t5x_set(golden, case):
    # topp_grid: probabilities are multiples of 0.05 and topp an exact top-k mass (boundary cases
    # where an exclusive cumsum rounds differently); topp_cont: continuous random logits.
    arrays, _ = golden
    logits, topp = arrays[f"{case}_logits"], arrays[f"{case}_p"]
    kept = _kept(sampling.topp_mask, logits, topp, float)
    differing = np.flatnonzero((kept != arrays[f"{case}_keep"]).any(-1))
    assert differing.size == 0, f"rows {differing[:10]} keep a different set than T5X"


def test_topp_issue_example_keeps_smallest_set():
    # probs [0.3, 0.1, 0.1, 0.5], p = 0.8: the smallest set with mass >= 0.8 is {3, 0}.
    logits = jnp.log(jnp.array([[0.3, 0.1, 0.1, 0.5]], jnp.float32))
    kept = np.asarray(sampling.topp_mask(logits, 0.8)) != sampling.NEG_INF
    np.testing.assert_array_equal(kept, [[True, False, False, True]])


def test_topk_keeps_t5x_set_with_ties_and_k_beyond_vocab(golden):
    arrays, _ = golden
    kept = _kept(sampling.topk_mask, arrays["topk_logits"], arrays["topk_k"], int)
    np.testing.assert_array_equal(kept, arrays["topk_keep"])


def test_min_temperature_is_greedy_like_t5x():
    assert sampling.is_greedy(1e-4) and sampling.is_greedy(0.0)
    assert not sampling.is_greedy(1.0001e-4)
    assert bool(sampling.greedy_rows(jnp.float32(1e-4)))


def _toy_decode(arrays, settings):
    """Runs our temperature_sample on the golden toy model: logits = table[token, index]."""
    table = jnp.asarray(arrays["toy_table"])
    inputs = jnp.asarray(arrays["toy_inputs"])

    def tokens_to_logits(state):
        return table[state.cur_token[:, 0], state.cur_index], state.cache

    kwargs = dict(settings)
    num_decodes = kwargs.pop("num_decodes")
    for key, value in kwargs.items():
        if isinstance(value, list):
            kwargs[key] = jnp.asarray(value, jnp.float32)  # per-row temperatures
    cache = {"dummy": jnp.zeros((inputs.shape[0], 1), jnp.float32)}
    return decoding.temperature_sample(
        inputs, cache, tokens_to_logits, 1, jax.random.PRNGKey(42), num_decodes, **kwargs
    )


@pytest.mark.parametrize(
    "name",
    [
        "t1e-4",
        "scalar_t0.7_topp0.8",
        "rows_topk0",
        "rows_topp0.9",
        "rows_topk3",
        "rows_topk0_nd2",
        "rows_noscale",
    ],
)
def test_temperature_sample_tokens_and_log_probs_bitwise(golden, name):
    # Covers T = 1e-4 (greedy in T5X, log-prob 0) and per-row temperature arrays (T5X samples each
    # row on its own with one shared key), with top-k / top-p, num_decodes = 2 and raw log-probs.
    arrays, meta = golden
    decodes, log_probs = _toy_decode(arrays, meta["cases"][name])
    np.testing.assert_array_equal(np.asarray(decodes), arrays[f"sample_{name}_decodes"])
    np.testing.assert_array_equal(np.asarray(log_probs), arrays[f"sample_{name}_log_probs"])
