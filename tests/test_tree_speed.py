"""The tree loop's fast pieces equal what they replace (`tree_decoding.top_k_indices`, ...)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import sampling, tree_decoding


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


@pytest.mark.parametrize("shape", [(3, 2, 1), (2, 2, 2), (1, 1)])
def test_expand_tree_children_are_the_drafts_top_k_at_every_node(shape):
    from test_tree import toy_cache, toy_tree_step

    from specdec_t5x import tree

    shape = tree.TreeShape(shape)
    length, vocab, batch = 12, 9, 2
    table = np.random.default_rng(0).standard_normal((length, vocab, vocab, vocab))
    step = toy_tree_step(table.astype(np.float32))
    start = jnp.asarray([3, 5], jnp.int32)
    prefix = jnp.asarray(np.random.default_rng(1).integers(1, vocab, (batch, length)), jnp.int32)
    cache = toy_cache(batch, length + shape.num_nodes)
    _, cache = step(prefix, jnp.zeros((batch,), jnp.int32), cache)  # slots 0.. hold the prefix
    last = prefix[jnp.arange(batch), start]
    root_logits, cache = step(last[:, None], start, cache)

    @jax.jit
    def expand(root_logits, cache):
        return tree_decoding.expand_tree(
            step, shape, last, root_logits[:, 0], start, cache, "topk", True, None, None
        )

    tokens, q, _ = expand(root_logits, cache)
    assert q is None and tokens.shape == (batch, shape.num_nodes)
    tokens = np.asarray(tokens)
    for b in range(batch):
        s = int(start[b])
        prev_of = {0: int(prefix[b, s - 1])}  # the token before each node (its parent's token)
        for j in range(1, shape.num_nodes):
            prev_of[j] = int(tokens[b, shape.parent[j]])
        assert tokens[b, 0] == last[b]
        for j in range(shape.num_inner):
            d, first = int(shape.depth[j]), int(shape.first_child[j])
            k = shape.branching[d]
            logits = table[s + d, prev_of[j], tokens[b, j]]
            want = np.asarray(jax.lax.top_k(jnp.asarray(logits, jnp.float32), k)[1])
            np.testing.assert_array_equal(tokens[b, first : first + k], want)


def test_children_without_replacement_are_sequential_draws_from_q():
    """(x_1, x_2, x_3) ~ q(x_1) q(x_2) / (1 - q(x_1)) q(x_3) / (1 - q(x_1) - q(x_2)); a row whose
    support is smaller than k gets every supported token first (its other children never tested)."""
    from test_speculative import chi_square_pvalue

    q = np.array([0.4, 0.25, 0.2, 0.1, 0.05, 0.0], np.float32)
    logits = jnp.log(jnp.asarray(q))[None, None]  # [1, 1, 6]; log 0 = -inf
    n = 20000

    @jax.jit
    def draw(keys):
        def one(key):
            children, q_out = tree_decoding.propose_children(
                logits, 3, "without_replacement", False, lambda x: x, key
            )
            return children[0, 0], q_out[0, 0]

        return jax.vmap(one)(keys)

    children, q_out = draw(jax.random.split(jax.random.PRNGKey(0), n))
    np.testing.assert_allclose(np.asarray(q_out[0]), q, atol=1e-6)
    expected, q = {}, q.astype(np.float64)
    for a in range(5):
        for b in range(5):
            for c in range(5):
                if len({a, b, c}) == 3:
                    expected[(a, b, c)] = q[a] * q[b] / (1 - q[a]) * q[c] / (1 - q[a] - q[b])
    assert chi_square_pvalue(np.asarray(children), expected) > 1e-3

    two = jnp.log(jnp.asarray([0.7, 0.3, 0.0, 0.0], np.float32))[None, None]
    small = tree_decoding.propose_children(
        two, 3, "without_replacement", False, lambda x: x, jax.random.PRNGKey(1)
    )[0]
    assert sorted(np.asarray(small)[0, 0, :2].tolist()) == [0, 1]


@pytest.mark.parametrize("k", [1, 3, 40, 60])
def test_topk_mask_of_several_rows_equals_lax_top_k_threshold(k):
    """`sampling.topk_mask` of several rows finds the k-th largest logit by passes (k <= 32) or
    by `lax.top_k`: either way the threshold, and so the mask, is `lax.top_k`'s (ties kept)."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    x[0, 1, :] = 0.25  # all tied: everything kept
    x[1, 2, 5:9] = x[1, 2].max() + 1  # a tie at the top
    x[2, 0, ::2] = x[2, 0, 1]  # many ties inside the top k
    kth = jax.lax.top_k(jnp.asarray(x), k)[0][..., -1:]
    want = np.where(x >= np.asarray(kth), x, sampling.NEG_INF)
    got = jax.jit(lambda a: sampling.topk_mask(a, k))(x)
    np.testing.assert_array_equal(np.asarray(got), want)
    one_row = np.asarray(sampling.topk_mask(jnp.asarray(x[:1, :1]), k))  # lax.top_k path
    np.testing.assert_array_equal(one_row, want[:1, :1])
