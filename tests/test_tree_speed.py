"""The tree loop's fast pieces equal what they replace (`tree_decoding.top_k_indices`, ...)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import tree_decoding


@pytest.mark.parametrize("k", [1, 2, 4])
def test_top_k_indices_equals_lax_top_k(k):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((2, 5, 50)).astype(np.float32)
    x[0, 0, 10:] = -np.inf  # -inf ties: lower index first, as lax.top_k
    x[0, 1, :] = 1.0  # a row of ties
    x[1, 2, 3:8] = x[1, 2].max() + 1  # a tie at the top
    x[1, 3, :] = -np.inf  # nothing finite
    want = jax.lax.top_k(jnp.asarray(x), k)[1]
    got = jax.jit(lambda a: tree_decoding.top_k_indices(a, k))(x)
    assert got.dtype == jnp.int32 and got.shape == (2, 5, k)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    def body(i, acc):  # inside a loop body, where lax.top_k of several rows becomes a sort
        return acc + tree_decoding.top_k_indices(jnp.asarray(x) + i * 0.0, k)

    looped = jax.jit(lambda: jax.lax.fori_loop(0, 2, body, jnp.zeros((2, 5, k), jnp.int32)))()
    np.testing.assert_array_equal(np.asarray(looped), 2 * np.asarray(want))


def test_top_k_indices_with_nan_gives_distinct_indices_nan_first():
    x = np.array([[0.5, np.nan, 2.0, np.nan, -np.inf]], np.float32)
    got = np.asarray(tree_decoding.top_k_indices(jnp.asarray(x), 5))
    np.testing.assert_array_equal(got, [[1, 3, 2, 0, 4]])


@pytest.mark.parametrize("k", [0, 6])
def test_top_k_indices_rejects_bad_k(k):
    with pytest.raises(ValueError, match=f"k={k}"):
        tree_decoding.top_k_indices(jnp.zeros((1, 5)), k)
