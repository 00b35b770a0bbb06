"""Tree speculation: exact distributions (chi-square), greedy identity, the tree mask, stats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_speculative import EOS, random_tables

from specdec_t5x import speculative, tree

# ---------------------------------------------------------------------------------------------
# Toy tree steps: the second-order Markov table of test_speculative (logits of output t given
# the inputs at t - 1 and t), where "the input at t - 1" is read through the tree call's own
# addressing: the one visible cache slot whose key position is t - 1. A wrong ancestor mask (a
# sibling's or cousin's slot visible, or the parent's hidden) or wrong key positions give a wrong
# previous token, which the distribution and greedy tests below detect.


def toy_tree_step(table):
    """`tree.TreeStep` over table float32 [L, V, V, V]; cache {'history': int32 [b, L]} by slot."""
    table = jnp.asarray(table, jnp.float32)
    max_len = table.shape[0]

    def step(tokens, positions, cache, tree=None):
        history = cache["history"]
        batch, k = tokens.shape
        slot_ids = jnp.arange(history.shape[1])
        if tree is None:  # the ordinary block call: slot = position, causal
            pos = positions[:, None] + jnp.arange(k)  # [b, k]
            slots, key_pos = pos, jnp.broadcast_to(slot_ids, history.shape)
            visible = slot_ids[None, None, :] <= pos[:, :, None]
        else:
            pos, att = tree.attention(positions, history.shape[1])
            slots, key_pos, visible = att.slots, att.key_positions, att.visible
        rows = jnp.arange(batch)[:, None]
        history = history.at[rows, slots].set(tokens, mode="drop")
        is_prev = visible & (key_pos[:, None, :] == pos[:, :, None] - 1)  # [b, k, L]
        prev = jnp.sum(jnp.where(is_prev, history[:, None, :], 0), axis=-1)  # 0 at position 0
        logits = table[jnp.clip(pos, 0, max_len - 1), prev, tokens]
        return logits, {"history": history}

    def move_slots(cache, start, path):
        history = cache["history"]
        rows = jnp.arange(history.shape[0])[:, None]
        src = jnp.clip(start[:, None] + path, 0, history.shape[1] - 1)
        dst = start[:, None] + jnp.arange(path.shape[1])
        return {"history": history.at[rows, dst].set(history[rows, src], mode="drop")}

    step.move_slots = move_slots
    step.cache_slots = lambda cache: cache["history"].shape[1]
    return step


def toy_cache(batch, slots):
    return {"history": jnp.zeros((batch, slots), jnp.int32)}


def run_toy(p_table, q_table, batch, tree_shape, seed=0, inputs=None, extra_slots=None, **kwargs):
    """One jitted tree decode of the toy pair; caches of max_len + K - 1 slots (whole trees) unless
    `extra_slots` says otherwise."""
    max_len = p_table.shape[0]
    if inputs is None:
        inputs = jnp.zeros((batch, max_len), jnp.int32)
    if extra_slots is None:
        extra_slots = tree.parse_tree(tree_shape).num_nodes - 1
    slots = max_len + extra_slots
    fn = jax.jit(
        lambda rng: speculative.speculative_sample(
            inputs,
            toy_cache(batch, slots),
            toy_tree_step(p_table),
            toy_cache(batch, slots),
            toy_tree_step(q_table),
            EOS,
            tree=tree_shape,
            decode_rng=rng,
            **kwargs,
        )
    )
    return fn(jax.random.PRNGKey(seed))


def test_shape_layout():
    shape = tree.TreeShape((2, 3))
    assert shape.num_nodes == 1 + 2 + 6 and shape.num_inner == 3 and shape.max_depth == 2
    np.testing.assert_array_equal(shape.depth, [0, 1, 1, 2, 2, 2, 2, 2, 2])
    np.testing.assert_array_equal(shape.parent, [-1, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(shape.rank, [0, 0, 1, 0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(shape.first_child[:3], [1, 3, 6])
    assert shape.ancestors[7].tolist() == [True, False, True] + [False] * 4 + [True, False]


def test_attention_inputs_of_a_chain_are_the_causal_call():
    chain = tree.TreeShape((1, 1, 1))
    start = jnp.array([0, 2, 5])
    pos, att = tree.TreeQuery(chain, (0, 1, 2, 3)).attention(start, 8)
    want_pos = start[:, None] + jnp.arange(4)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(att.slots, want_pos)
    np.testing.assert_array_equal(att.key_positions, jnp.broadcast_to(jnp.arange(8), (3, 8)))
    np.testing.assert_array_equal(att.visible, jnp.arange(8)[None, None] <= want_pos[..., None])


def test_attention_inputs_of_a_branching_tree():
    shape = tree.TreeShape((2, 2))  # nodes 0 | 1 2 | 3 4 (of 1) 5 6 (of 2)
    pos, att = tree.TreeQuery(shape, (2, 5)).attention(jnp.array([3]), 12)
    np.testing.assert_array_equal(pos, [[4, 5]])
    np.testing.assert_array_equal(att.slots, [[5, 8]])
    np.testing.assert_array_equal(att.key_positions, [[0, 1, 2, 3, 4, 4, 5, 5, 5, 5, 10, 11]])
    visible = [np.flatnonzero(row).tolist() for row in np.asarray(att.visible[0])]
    assert visible == [[0, 1, 2, 3, 5], [0, 1, 2, 3, 5, 8]]  # prefix, root, (parent 2), itself


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tree=()), "tree must be a non-empty tuple"),
        (dict(tree=(2, 0)), "tree must be a non-empty tuple"),
        (dict(tree=(2, 2), tree_rule="spec"), "tree_rule='spec'"),
        (dict(tree=(2, 2), gamma=3), "gamma must be None or the tree's depth 2"),
        (dict(tree=(2,), verification="block"), "verification='block'"),
        (dict(tree=(2,), draft_confidence_threshold=0.5), "no early exit"),
    ],
)
def test_bad_tree_input_raises(kwargs, match):
    p, _ = random_tables(seed=0, vocab=6)
    with pytest.raises(ValueError, match=match):
        speculative.speculative_sample(
            jnp.zeros((1, 3), jnp.int32),
            toy_cache(1, 3),
            toy_tree_step(p),
            toy_cache(1, 3),
            toy_tree_step(p),
            EOS,
            **kwargs,
        )


def test_a_step_without_tree_support_is_refused():
    from test_speculative import toy_step

    p, _ = random_tables(seed=0, vocab=6)
    with pytest.raises(ValueError, match="draft step that takes tree="):
        speculative.speculative_sample(
            jnp.zeros((1, 3), jnp.int32),
            toy_cache(1, 3),
            toy_tree_step(p),
            toy_cache(1, 3),
            toy_step(p),
            EOS,
            tree=(2,),
        )
