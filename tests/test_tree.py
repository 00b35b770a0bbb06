"""Tree speculation: exact distributions (chi-square), greedy identity, the tree mask, stats."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, perturbed, tiny_config
from test_speculative import EOS, chi_square_pvalue, exact_sequence_probs, random_tables

from specdec_t5x import cpu_kernel, drafts, models, network, speculative, tree, tree_decoding
from specdec_t5x import steps as model_steps

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
    """A jitted tree decode of the toy pair (tables, inputs, key and max_decode_steps are
    arguments, so equal static settings share one compilation); caches of max_len + K - 1 slots
    (whole trees) unless `extra_slots` says otherwise."""
    max_len = p_table.shape[0]
    if inputs is None:
        inputs = jnp.zeros((batch, max_len), jnp.int32)
    if extra_slots is None:
        extra_slots = tree.parse_tree(tree_shape).num_nodes - 1
    steps = kwargs.pop("max_decode_steps", None)
    fresh = kwargs.pop("fresh", False)  # trace again (e.g. after monkeypatching a rule)
    static = (
        batch,
        max_len + extra_slots,
        tuple(tree_shape),
        steps is None,
        tuple(sorted(kwargs.items())),
    )
    fn = _toy_decoder.__wrapped__(*static) if fresh else _toy_decoder(*static)
    steps = jnp.int32(0 if steps is None else steps)
    return fn(jnp.asarray(p_table), jnp.asarray(q_table), inputs, jax.random.PRNGKey(seed), steps)


@functools.cache
def _toy_decoder(batch, slots, tree_shape, no_limit, kwargs):
    def decode(p_table, q_table, inputs, rng, max_decode_steps):
        return speculative.speculative_sample(
            inputs,
            toy_cache(batch, slots),
            toy_tree_step(p_table),
            toy_cache(batch, slots),
            toy_tree_step(q_table),
            EOS,
            tree=tree_shape,
            decode_rng=rng,
            max_decode_steps=None if no_limit else max_decode_steps,
            **dict(kwargs),
        )

    return jax.jit(decode)


def test_shape_layout():
    shape = tree.TreeShape((2, 3))
    assert shape.num_nodes == 1 + 2 + 6 and shape.num_inner == 3 and shape.max_depth == 2
    np.testing.assert_array_equal(shape.depth, [0, 1, 1, 2, 2, 2, 2, 2, 2])
    np.testing.assert_array_equal(shape.parent, [-1, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(shape.rank, [0, 0, 1, 0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(shape.first_child[:3], [1, 3, 6])
    assert shape.ancestors[7].tolist() == [True, False, True] + [False] * 4 + [True, False]


# Any tree by its nodes' child-rank paths: leaves at depths 1 and 2 beside a path to depth 3.
IRREGULAR = ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0))


def test_paths_give_the_branching_layout_and_any_tree():
    regular = tree.TreeShape((2, 3))
    same = tree.parse_tree([list(p) for p in regular.node_paths[1:]][::-1])  # any order
    for field in ("depth", "parent", "rank", "first_child", "num_children", "offsets"):
        np.testing.assert_array_equal(getattr(same, field), getattr(regular, field))
    assert regular.name == "tree(2,3)" and same.name == "tree[0,1,00,01,02,10,11,12]"
    shape = tree.parse_tree(IRREGULAR)  # nodes 0 | 1 2 3 | 4 5 (of 1) | 6 (of 4)
    assert shape.num_nodes == 7 and shape.max_depth == 3 and shape.name == "tree[0,1,2,00,01,000]"
    np.testing.assert_array_equal(shape.parent, [-1, 0, 0, 0, 1, 1, 4])
    np.testing.assert_array_equal(shape.num_children, [3, 2, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(shape.first_child[[0, 1, 4]], [1, 4, 6])
    assert shape.inner == (0, 1, 4) and shape.inner_at(1) == (1,) and shape.inner_at(2) == (4,)
    assert [shape.max_children(d) for d in range(4)] == [3, 2, 1, 0] and shape.max_children() == 3
    assert shape.ancestors[6].tolist() == [True, True, False, False, True, False, True]
    wide = tree.TreeShape(paths=tuple((r,) for r in range(11)) + ((10, 0),))
    assert wide.name == "tree{0,1,2,3,4,5,6,7,8,9,10,10.0}"
    for s in (regular, shape, wide):
        assert tree.shape_from_name(s.name) == tree.parse_tree(s.spec)
    for bad in ("tree(2,x)", "tree[0,00", "chain[0]", "tree[0,01]"):
        with pytest.raises(ValueError, match="a tree row name is"):
            tree.shape_from_name(bad)


@pytest.mark.parametrize(
    "paths, match",
    [
        (((0,), (0, 1)), r"path \(0, 1\) needs \(0, 0\)"),  # a lower-ranked sibling missing
        (((0,), (1, 0)), r"path \(1, 0\) needs \(1,\)"),  # the parent missing
        (((0,), (0,)), "must not repeat"),
        (((0,), (-1,)), "ints >= 0"),
        ((), "non-empty tuple"),
    ],
)
def test_bad_tree_paths_raise(paths, match):
    with pytest.raises(ValueError, match=match):
        tree.TreeShape(paths=paths)
    with pytest.raises(ValueError, match="not both"):
        tree.parse_tree(((0,), 2))
    with pytest.raises(ValueError, match="more than MAX_TREE_NODES=4096"):
        tree.parse_tree((2,) * 70)  # 2**71 nodes: refused before counting them
    assert tree.parse_tree("tree[0,1,00]") == tree.parse_tree([[0], [1], [0, 0]])
    with pytest.raises(ValueError, match="per-depth branching factors.*or the child-rank paths"):
        tree.TreeShape((2,), paths=((0,),))


def test_optimal_paths_adds_the_most_counted_node_that_keeps_a_tree():
    counts = {(0,): 50, (1,): 20, (2,): 4, (0, 0): 30, (0, 1): 6, (1, 0): 12, (0, 0, 0): 18}
    assert tree.optimal_paths(counts, 4) == ((0,), (1,), (0, 0))
    assert tree.optimal_paths(counts, 6) == ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))
    assert len(tree.optimal_paths(counts, 50)) == len(counts)  # all of them, still a tree
    # A second choice counted more often than the first still needs the first in the tree.
    assert tree.optimal_paths({(0,): 3, (1,): 10}, 2) == ((0,),)
    tree.TreeShape(paths=tree.optimal_paths({(1,): 9, (0,): 1, (1, 0): 8, (0, 1): 7}, 5))
    with pytest.raises(ValueError, match="num_nodes must be an int >= 2"):
        tree.optimal_paths(counts, 1)


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


# ---------------------------------------------------------------------------------------------
# Exact distributions: chi-square over every output sequence of the toy target.

SETTINGS = [(0.5, 0, 0.0), (1.0, 0, 0.0), (2.0, 0, 0.0), (1.0, 3, 0.0), (1.0, 0, 0.8)]
TREES = [(2, 2), (3, 1), (2, 2, 2)]
# Each rule at every setting, the trees rotating so every (rule, tree) and every (tree, setting)
# pair occurs (15 compiles instead of 45; the full grid was run once, see the module's report).
DISTRIBUTION_CASES = [
    (rule, TREES[(r + s) % len(TREES)], *setting)
    for r, rule in enumerate(tree.TREE_RULES)
    for s, setting in enumerate(SETTINGS)
] + [  # a tree given by paths, leaves above the deepest level, once per rule
    (rule, IRREGULAR, *setting)
    for rule, setting in zip(
        tree.TREE_RULES, [(1.0, 3, 0.0), (0.5, 0, 0.0), (1.0, 0, 0.0)], strict=True
    )
]


@pytest.mark.slow
@pytest.mark.parametrize("rule, shape, temperature, topk, topp", DISTRIBUTION_CASES)
def test_sampling_distribution_is_the_targets(rule, shape, temperature, topk, topp):
    p, q = random_tables(seed=len(shape) + tree.parse_tree(shape).max_children(0))
    decodes, st = run_toy(
        p, q, 20000, shape, seed=11, temperature=temperature, topk=topk, topp=topp, tree_rule=rule
    )
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, temperature, topk, topp)) > 1e-3
    depth_tested, rank_tested = np.asarray(st.depth_tested), np.asarray(st.rank_tested)
    assert 0 < int(st.num_accepted.sum()) < int(st.num_draft_tokens.sum())  # accept and reject
    assert depth_tested[:, 1].sum() > 0  # the second depth is reached
    assert rank_tested[:, :, 1].sum() > 0  # second children get tested (after a rejection)
    np.testing.assert_array_equal(st.num_draft_tokens, depth_tested.sum(1))


def first_order_table(seed, vocab=5, max_len=3):
    """logits depend on (position, current token) only: table [L, V, V, V] constant in `prev`."""
    rng = np.random.RandomState(seed)
    table = rng.randn(max_len, 1, vocab, vocab) * 1.5
    return np.broadcast_to(table, (max_len, vocab, vocab, vocab)).astype(np.float32)


def test_first_order_toy_as_target_and_draft():
    p, q = first_order_table(1), first_order_table(2)
    decodes, _ = run_toy(p, q, 20000, (2, 2), seed=3, temperature=1.0, tree_rule="topk")
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 1.0, 0, 0.0)) > 1e-3


def wrong_residual(r, q_i):
    """A deliberately wrong rejection update: max(r - q_i, 0) without renormalising it, so the
    later children are accepted with too small a probability min(1, r'(x) / q(x))."""
    return jnp.maximum(r - q_i, 0.0)


def test_a_wrong_residual_fails_the_distribution_test(monkeypatch):
    p, q = random_tables(seed=4)
    expected = exact_sequence_probs(p, 3, 1.0, 0, 0.0)
    kwargs = dict(seed=5, temperature=1.0, tree_rule="iid", fresh=True)
    decodes, _ = run_toy(p, q, 20000, (3, 1), **kwargs)
    assert chi_square_pvalue(decodes, expected) > 1e-3
    monkeypatch.setattr(tree_decoding, "residual_after_rejection", wrong_residual)
    decodes, _ = run_toy(p, q, 20000, (3, 1), **kwargs)
    assert chi_square_pvalue(decodes, expected) < 1e-3


def exact_probs_after(table, max_len, prompt, temperature):
    """{decode tuple: probability} of the toy target's continuations after a forced prompt."""
    free = max_len - len(prompt)
    adjusted = np.asarray(
        jax.nn.softmax(jnp.asarray(table, jnp.float32) / temperature, axis=-1), np.float64
    )
    probs = {}
    for seq in itertools.product(range(table.shape[-1]), repeat=free):
        prob, inputs, out = 1.0, [0, *prompt], []
        for y in seq:
            t = len(inputs) - 1
            prob *= adjusted[t, inputs[-2] if len(inputs) >= 2 else 0, inputs[-1], y]
            out.append(y)
            inputs.append(y)
            if y == EOS:
                break
        if seq[len(out) :] != (0,) * (free - len(out)):
            continue
        key = tuple(prompt) + tuple(out) + (0,) * (free - len(out))
        probs[key] = probs.get(key, 0.0) + prob
    return probs


@pytest.mark.parametrize("rule, shape", [("topk", (2, 2)), ("without_replacement", (3, 1))])
def test_rows_with_different_prompts_each_get_their_distribution(rule, shape):
    """batch > 1 with different rows: a third of the rows decode freely, the others after a forced
    prompt token (3 or 4), so rows differ in their distributions and end at different iterations."""
    p, q = random_tables(seed=9, max_len=4, vocab=5)
    n = 30000
    prompt = np.array([0, 3, 4])[np.arange(n) % 3]
    inputs = jnp.zeros((n, 4), jnp.int32).at[:, 1].set(jnp.asarray(prompt))
    decodes, _ = run_toy(p, q, n, shape, seed=2, inputs=inputs, temperature=1.0, tree_rule=rule)
    decodes = np.asarray(decodes)
    for token in (0, 3, 4):
        rows = decodes[prompt == token]
        if token == 0:
            expected = exact_sequence_probs(p, 4, 1.0, 0, 0.0)
        else:
            rows = rows[:, 1:]  # decodes: prompt, continuation
            expected = exact_probs_after(p, 4, [token], 1.0)
            expected = {k[1:]: v for k, v in expected.items()}
            rows = np.concatenate([rows, np.zeros((len(rows), 1), rows.dtype)], 1)[:, :3]
            expected = {k[:3]: v for k, v in expected.items()}
        assert chi_square_pvalue(rows, expected) > 1e-3, token


@pytest.mark.parametrize("rule", ["without_replacement"])
def test_batch_of_one_is_exact(rule):
    """The batch-1 loop, vectorised over 20000 independent keys (vmap of a batch-1 decode)."""
    p, q = random_tables(seed=10)
    max_len, slots = 3, 3 + tree.TreeShape((2, 2)).num_nodes - 1

    def one(rng):
        decodes, _ = speculative.speculative_sample(
            jnp.zeros((1, max_len), jnp.int32),
            toy_cache(1, slots),
            toy_tree_step(p),
            toy_cache(1, slots),
            toy_tree_step(q),
            EOS,
            tree=(2, 2),
            decode_rng=rng,
            temperature=2.0,
            tree_rule=rule,
        )
        return decodes[0]

    decodes = jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(6), 20000))
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 2.0, 0, 0.0)) > 1e-3


def test_chain_shaped_tree_is_exact_at_t1():
    p, q = random_tables(seed=12)
    decodes, st = run_toy(p, q, 20000, (1, 1, 1), seed=7, temperature=1.0, tree_rule="iid")
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 1.0, 0, 0.0)) > 1e-3
    assert int(np.asarray(st.rank_tested)[:, :, 0].sum()) == int(st.num_draft_tokens.sum())


# ---------------------------------------------------------------------------------------------
# Acceptance of each rule against its closed form (one depth, context-free p and q).


def context_free_tables(p_row, q_row, max_len=32):
    p = np.broadcast_to(np.log(p_row), (max_len, 4, 4, 4)).astype(np.float32)
    q = np.broadcast_to(np.log(q_row), (max_len, 4, 4, 4)).astype(np.float32)
    return p, q


def expected_first_depth_acceptance(rule, p, q, k=2):
    """P(some child of the root is accepted) for k = 2 children, exactly."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    beta = np.minimum(p, q).sum()
    r2 = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
    if rule == "topk":
        return float(np.sort(p[np.argsort(-q)[:k]]).sum())
    if rule == "iid":
        return float(beta + (1 - beta) * np.minimum(r2, q).sum())
    total = beta  # without replacement: second child from q without the first
    for x1 in range(len(q)):
        reject = q[x1] - min(q[x1], p[x1])  # P(x_1 = x1 and rejected)
        if reject <= 0:
            continue
        q2 = np.where(np.arange(len(q)) == x1, 0.0, q) / (1 - q[x1])
        total += reject * np.minimum(r2, q2).sum()
    return float(total)


@pytest.mark.parametrize("rule", tree.TREE_RULES)
def test_acceptance_per_depth_matches_the_rules_closed_form(rule):
    p_row = np.array([1e-12, 1e-12, 0.5, 0.5]) * np.array([1, 1, 0.7, 1.3])  # EOS never
    q_row = np.array([1e-12, 1e-12, 0.5, 0.5]) * np.array([1, 1, 1.5, 0.5])
    p_row, q_row = p_row / p_row.sum(), q_row / q_row.sum()
    p, q = context_free_tables(p_row, q_row)
    _, st = run_toy(p, q, 2000, (2, 2), seed=8, temperature=1.0, tree_rule=rule)
    tested, accepted = np.asarray(st.depth_tested).sum(0), np.asarray(st.depth_accepted).sum(0)
    want = expected_first_depth_acceptance(rule, p_row, q_row)
    for d in range(2):
        stderr = np.sqrt(want * (1 - want) / tested[d])
        assert abs(accepted[d] / tested[d] - want) < 4 * stderr + 1e-9, (d, rule, want)
    ranks = np.asarray(st.rank_accepted).sum((0, 1))
    assert ranks[1] > 0 or want == 1.0


def test_draft_equal_to_target_accepts_every_depth_with_iid_children():
    p, _ = random_tables(seed=5, max_len=4)
    _, st = run_toy(p, p, 5000, (2, 2), seed=3, temperature=1.0, tree_rule="iid")
    np.testing.assert_array_equal(st.num_accepted, st.num_draft_tokens)
    assert int(np.asarray(st.rank_tested)[:, :, 1].sum()) == 0  # the first child always wins
    np.testing.assert_allclose(st.beta_sum, st.num_beta, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Argmax mode: greedy's tokens, whatever the shape; EOS and the length limit inside a tree.


def greedy_toy_decode(table, inputs):
    """The toy target's greedy decode after each row's forced prompt, in NumPy."""
    table = np.asarray(table)
    out = np.zeros(inputs.shape, np.int32)
    for b, row in enumerate(np.asarray(inputs)):
        prompt = list(row[1 : 1 + np.argmin(np.append(row[1:], 0) != 0)])
        seq = [0, *prompt]
        while len(seq) - 1 < inputs.shape[1] and (len(seq) == 1 + len(prompt) or seq[-1] != EOS):
            t = len(seq) - 1
            seq.append(int(np.argmax(table[t, seq[-2] if t >= 1 else 0, seq[-1]])))
        out[b, : len(seq) - 1] = seq[1:]
    return out


GREEDY_SHAPES = [(1, 1, 1), (2, 2), (3, 1, 1), (2, 2, 2), (1, 3, 2), IRREGULAR]


@pytest.mark.parametrize("shape", GREEDY_SHAPES)
def test_argmax_mode_equals_greedy(shape):
    p, q = random_tables(seed=16, vocab=6, max_len=8)
    inputs = jnp.zeros((4, 8), jnp.int32).at[1, 1:3].set(jnp.array([3, 2])).at[2, 1].set(5)
    want = greedy_toy_decode(p, inputs)
    got, st = run_toy(p, q, 4, shape, inputs=inputs, temperature=0.0)
    np.testing.assert_array_equal(got, want)
    if tree.parse_tree(shape).max_depth == 3:  # trees cut at the cache end: the same tokens
        got, _ = run_toy(p, q, 4, shape, inputs=inputs, extra_slots=0, temperature=0.0)
        np.testing.assert_array_equal(got, want)
    if tree.parse_tree(shape).max_children(0) > 1:
        assert int(np.asarray(st.rank_accepted)[..., 1:].sum()) > 0  # second children win too


def test_a_path_ending_at_a_shallow_leaf_feeds_the_draft_next_time():
    """The leaf (0,) has no children, so the draft never saw it: the next iteration must feed it
    before its root. With draft = target every draft is then right (a stale draft cache would
    propose from a wrong previous token)."""
    p, _ = random_tables(seed=16, vocab=6, max_len=8)
    p[..., EOS] -= 30.0  # no EOS: rows run to the limit, 3 iterations each
    paths = ((0,), (1,), (1, 0))
    got, st = run_toy(p, p, 3, paths, temperature=0.0)
    np.testing.assert_array_equal(got, greedy_toy_decode(p, jnp.zeros((3, 8), jnp.int32)))
    assert int(st.num_draft_tokens.min()) >= 3
    np.testing.assert_array_equal(st.num_accepted, st.num_draft_tokens)
    assert int(np.asarray(st.rank_accepted)[..., 1:].sum()) == 0  # the first choice, every time


def test_eos_accepted_inside_the_tree_ends_the_row():
    vocab, max_len = 6, 8
    path = [3, 4, EOS, 5, 5, 5, 5, 5]
    table = np.zeros((max_len, vocab, vocab, vocab), np.float32)
    for t, y in enumerate(path):
        table[t, ..., y] = 5.0
    draft = table.copy()
    draft[1, ..., 2] = 9.0  # the draft's first choice at position 1 is wrong, its second is 4
    decodes, st = run_toy(table, draft, 2, (2, 2, 2), temperature=0.0)
    np.testing.assert_array_equal(decodes, [[3, 4, EOS, 0, 0, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(st.num_iterations, [1, 1])
    np.testing.assert_array_equal(st.num_generated, [3, 3])
    np.testing.assert_array_equal(st.num_accepted, [3, 3])
    np.testing.assert_array_equal(st.accept_histogram[:, 3], [1, 1])
    np.testing.assert_array_equal(st.depth_accepted, [[1, 1, 1]] * 2)
    np.testing.assert_array_equal(st.rank_accepted[0], [[1, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(st.rank_tested[0], [[1, 0], [1, 1], [1, 0]])


@pytest.mark.parametrize("shape", [(3, 1, 1)])
def test_length_limit_is_never_exceeded(shape):
    vocab, max_len = 6, 7
    table = np.zeros((max_len, vocab, vocab, vocab), np.float32)
    table[..., 4] = 5.0  # never EOS
    for steps, extra_slots in [(None, None), (5, None), (2, 0), (0, None), (None, 0), (6, 0)]:
        decodes, st = run_toy(
            table, table, 2, shape, temperature=0.0, max_decode_steps=steps, extra_slots=extra_slots
        )
        n = max_len if steps is None else steps
        np.testing.assert_array_equal(decodes, [[4] * n + [0] * (max_len - n)] * 2)
        np.testing.assert_array_equal(st.num_generated, [n, n])


# ---------------------------------------------------------------------------------------------
# The T5 network: a tree call equals calls along each node's path; decodes equal greedy.

BATCH, ENC_LEN, MAX_LEN = 4, 9, 16


@pytest.fixture(params=["kernel", "no_kernel"])
def kernel_env(request, monkeypatch):
    """The CPU kernel's inference path (packed weights, fused attention) and XLA's (raw)."""
    if request.param == "no_kernel":
        monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    return request.param


@pytest.mark.parametrize(
    "kernel, scan_layers", [(True, False), (False, False), (True, True)], ids=str
)
def test_tree_call_equals_calls_along_each_path(monkeypatch, kernel, scan_layers):
    """Node i's logits from one tree call equal the last logits of an ordinary block call on its
    path (root..i) at the same positions; after `move_slots` the cache is the path's cache
    (per-layer caches, and scanned layers' [layers, ...] leaves)."""
    if not kernel:
        monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    module = network.Transformer(tiny_config(scan_layers=scan_layers))
    params = init_params(module, 1)
    enc = encoder_inputs(3, ENC_LEN, [9, 5, 7])
    tree_step = model_steps.make_block_step(module, params, enc)
    step = jax.jit(tree_step)  # the ordinary calls (one compile per block length)
    cache = jax.jit(lambda p, e: model_steps.prepare_cache(module, p, e, 24))(params, enc)
    rng = np.random.RandomState(0)
    prefix = jnp.asarray(rng.randint(2, 32, (3, 6)), jnp.int32).at[:, 0].set(0)
    _, cache = step(prefix, jnp.zeros(3, jnp.int32), cache)
    start = jnp.array([3, 5, 2])  # rows' roots at different positions (stale slots after them)
    shape = tree.TreeShape((2, 2, 1))
    k = shape.num_nodes
    tokens = jnp.asarray(rng.randint(2, 32, (3, k)), jnp.int32)
    tokens = tokens.at[:, 0].set(prefix[jnp.arange(3), start])
    query = tree.TreeQuery(shape, tuple(range(k)))
    logits, tree_cache = jax.jit(lambda t, s, c: tree_step(t, s, c, tree=query))(
        tokens, start, cache
    )
    for i in range(k):
        path = np.flatnonzero(shape.ancestors[i])  # root .. i
        want, _ = step(tokens[:, path], start, cache)
        np.testing.assert_allclose(logits[:, i], want[:, -1], atol=1e-5, err_msg=f"node {i}")
    paths = jnp.array([[0, 2, 5, 9], [0, 1, 3, 7], [0, 2, 6, 10]])
    moved = jax.jit(tree_step.move_slots)(tree_cache, start, paths)
    _, chain_cache = step(jnp.take_along_axis(tokens, paths, 1), start, cache)
    nxt = jnp.array([[7], [8], [9]])
    got, _ = step(nxt, start + 4, moved)
    want, _ = step(nxt, start + 4, chain_cache)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.fixture(scope="module")
def t5_pair():
    module = network.Transformer(tiny_config())
    params = init_params(module, 1)
    enc = encoder_inputs(BATCH, ENC_LEN, [9, 5, 7, 3])
    batch = {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": jnp.zeros((BATCH, MAX_LEN), jnp.int32),
    }
    return module, params, batch


def greedy_and_tree_decodes(module, params, batch, draft, shapes):
    baseline = models.EncoderDecoderModel(module)
    want = jax.jit(
        lambda p, b: baseline.predict_batch_with_aux(p, b, decoder_params={"temperature": 0.0})[0]
    )(params, batch)
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    for shape in shapes:
        decoder_params = {"tree": shape, "temperature": 0.0}
        got, aux = jax.jit(
            lambda p, dp, b, dparams=decoder_params: model.predict_batch_with_aux(
                p, b, decoder_params=dparams, draft_params=dp
            )
        )(params, draft.params, batch)
        yield shape, want, got, aux["stats"]


@pytest.mark.parametrize(
    "shapes_by_kernel",
    [{"kernel": [(1, 1, 1), (2, 2), (3, 1, 1), IRREGULAR], "no_kernel": [(2, 2, 2), IRREGULAR]}],
    ids=["shapes"],
)
def test_argmax_identity_with_a_t5_draft(t5_pair, kernel_env, shapes_by_kernel):
    module, params, batch = t5_pair
    draft = drafts.T5Draft(module, perturbed(params, 0.3, 2))
    for shape, want, got, st in greedy_and_tree_decodes(
        module, params, batch, draft, shapes_by_kernel[kernel_env]
    ):
        np.testing.assert_array_equal(got, want, err_msg=f"tree {shape}")
        alpha = int(st.num_accepted.sum()) / int(st.num_draft_tokens.sum())
        assert 0 < alpha < 1, shape  # acceptance and rejection both happen
        if tree.parse_tree(shape).max_children() > 1:
            assert int(np.asarray(st.rank_accepted)[..., 1:].sum()) > 0  # a second child won


def test_chain_shaped_tree_gives_the_chains_tokens(t5_pair):
    module, params, batch = t5_pair
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 1))
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    fn = jax.jit(
        lambda p, b, dp: model.predict_batch_with_aux(
            p, b, decoder_params={"gamma": 3, "temperature": 0.0}, draft_params=dp
        )
    )
    chain, chain_aux = fn(params, batch, draft.params)
    ((_, _, got, st),) = greedy_and_tree_decodes(module, params, batch, draft, [(1, 1, 1)])
    np.testing.assert_array_equal(got, chain)
    np.testing.assert_array_equal(st.num_iterations, chain_aux["stats"].num_iterations)
    np.testing.assert_array_equal(st.num_accepted, chain_aux["stats"].num_accepted)


def test_argmax_identity_with_ngram_drafts(t5_pair):
    module, params, batch = t5_pair
    unigram, bigram = drafts.fit_ngram_drafts([[6, 11, 13, 14, EOS], [11, 11, EOS]], 32)
    for draft in (unigram, bigram):
        for shape, want, got, _ in greedy_and_tree_decodes(module, params, batch, draft, [(3, 2)]):
            np.testing.assert_array_equal(got, want, err_msg=f"{type(draft).__name__} {shape}")


def test_source_copy_draft_runs_with_trees():
    """Copy drafts are tree steps (tests/test_copy_draft_trees.py has the rest): with trees the
    prompt-lookup draft is accepted and argmax mode gives the toy target's greedy tokens."""
    p, _ = random_tables(seed=0, vocab=32, max_len=4)
    enc = encoder_inputs(2, ENC_LEN, [9, 4])
    copy = drafts.SourceCopyDraft(32, branches=2)
    shape = tree.TreeShape((2, 2))
    slots = 4 + shape.num_nodes - 1
    decodes, _ = speculative.speculative_sample(
        jnp.zeros((2, 4), jnp.int32),
        toy_cache(2, slots),
        toy_tree_step(p),
        copy.init_cache(copy.params, enc, slots),
        copy.make_step(copy.params, enc),
        EOS,
        tree=shape,
        temperature=0.0,
    )
    np.testing.assert_array_equal(decodes, greedy_toy_decode(p, jnp.zeros((2, 4), jnp.int32)))


@pytest.mark.parametrize("rule", ["without_replacement"])  # the rules differ only in verify_tree
def test_sampling_on_the_network_compiles_once_and_keeps_its_invariants(t5_pair, rule):
    module, params, batch = t5_pair
    draft = drafts.T5Draft(module, perturbed(params, 0.3, 2))
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    traces = []

    def decode(p, dp, b, rng):
        traces.append(1)
        decoder_params = {"tree": (2, 2), "tree_rule": rule, "temperature": 1.0}
        return model.predict_batch_with_aux(p, b, rng, decoder_params, draft_params=dp)

    fn = jax.jit(decode)
    for seed in range(2):
        decodes, aux = fn(params, draft.params, batch, jax.random.PRNGKey(seed))
        st = aux["stats"]
        decodes = np.asarray(decodes)
        lengths = np.where(
            (decodes == EOS).any(1), (decodes == EOS).argmax(1) + 1, MAX_LEN
        )  # tokens up to EOS
        np.testing.assert_array_equal(st.num_generated, lengths)
        assert np.all(decodes[np.arange(MAX_LEN)[None] >= lengths[:, None]] == 0)
        np.testing.assert_array_equal(st.accept_histogram.sum(1), st.num_iterations)
        # Each call emits its accepted path and one more token, except a last call cut at EOS
        # inside the path or at the length limit (one token fewer than that).
        slack = np.asarray(st.num_iterations + st.num_accepted - st.num_generated)
        assert np.all((slack == 0) | (slack == 1)), slack
    assert len(traces) == 1


def network_sequence_probs(module, params, enc, max_len, temperature):
    """{decode tuple: probability} of the network's adjusted distribution for one source,
    enumerated from teacher-forced logits of every prefix (vocabulary V, V**(max_len-1) rows)."""
    from specdec_t5x import sampling

    vocab = module.config.vocab_size
    prefixes = np.array(list(itertools.product(range(vocab), repeat=max_len - 1)), np.int32)
    inputs = np.concatenate([np.zeros((len(prefixes), 1), np.int32), prefixes], 1)  # [N, L]
    logits = module.apply(
        {"params": params},
        jnp.broadcast_to(enc, (len(prefixes), enc.shape[1])),
        jnp.asarray(inputs),
        jnp.ones_like(jnp.asarray(inputs)),  # every position valid (token 0 is an output too)
        enable_dropout=False,
    )
    probs = np.asarray(sampling.adjusted_probs(logits, temperature), np.float64)  # [N, L, V]
    index = {tuple(row): i for i, row in enumerate(prefixes)}
    out = {}
    for seq in itertools.product(range(vocab), repeat=max_len):
        prob, emitted = 1.0, []
        for t, y in enumerate(seq):
            prefix = tuple(emitted) + (0,) * (max_len - 1 - len(emitted))
            prob *= probs[index[prefix], t, y]
            emitted.append(y)
            if y == EOS:
                break
        if seq[len(emitted) :] != (0,) * (max_len - len(emitted)):
            continue
        key = tuple(emitted) + (0,) * (max_len - len(emitted))
        out[key] = out.get(key, 0.0) + prob
    return out


def sibling_visible_attention(query, start, cache_len):
    """A deliberately wrong tree mask: every tree slot up to a node's own is visible (siblings and
    cousins included), i.e. the position-addressed causal mask applied to slots."""
    positions, att = RIGHT_ATTENTION(query, start, cache_len)
    visible = jnp.arange(cache_len)[None, None, :] <= att.slots[:, :, None]
    return positions, network.TreeAttention(att.slots, att.key_positions, visible)


RIGHT_ATTENTION = tree.TreeQuery.attention


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["ancestors", "wrong"])
def test_sampling_on_the_network_is_exact(monkeypatch, mask):
    """Chi-square on the T5 network itself (vocabulary 8, 3 tokens: 8**3 outcomes), tree (2, 2)
    at T = 1 with the default rule: the tree mask, positions, slot moves and cross-attention of
    the real decoder at T > 0, checked against the teacher-forced distribution. With siblings
    visible (`sibling_visible_attention`) the same test fails."""
    if mask == "wrong":
        monkeypatch.setattr(tree.TreeQuery, "attention", sibling_visible_attention)
    module = network.Transformer(tiny_config(vocab_size=8))
    params = init_params(module, 5)
    draft = drafts.T5Draft(module, perturbed(params, 0.5, 6))
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    n, max_len = 20000, 3
    enc = encoder_inputs(1, 6, [6], vocab=8, seed=3)
    batch = {
        "encoder_input_tokens": jnp.broadcast_to(enc, (n, 6)),
        "decoder_input_tokens": jnp.zeros((n, max_len), jnp.int32),
    }
    decodes, aux = jax.jit(
        lambda p, dp, b: model.predict_batch_with_aux(
            p, b, jax.random.PRNGKey(4), {"tree": (2, 2), "temperature": 1.0}, draft_params=dp
        )
    )(params, draft.params, batch)
    st = aux["stats"]
    assert 0 < int(st.num_accepted.sum()) < int(st.num_draft_tokens.sum())
    assert int(np.asarray(st.rank_accepted)[..., 1].sum()) > 0
    expected = network_sequence_probs(module, params, enc, max_len, 1.0)
    pvalue = chi_square_pvalue(decodes, expected)
    assert pvalue > 1e-3 if mask == "ancestors" else pvalue < 1e-3
