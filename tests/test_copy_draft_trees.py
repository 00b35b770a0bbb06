"""Token trees with the copy drafts (prompt lookup and the aligned draft): a tree call equals the
block calls along each path, slot moves, the ranked candidates of `branches`, greedy identity of
tree speculation and the exact distribution at T = 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_copy_drafts import _copying_table
from test_speculative import chi_square_pvalue, exact_sequence_probs
from test_tree import greedy_toy_decode, toy_cache, toy_tree_step

from specdec_t5x import copy_drafts, drafts, sampling, speculative, tree

VOCAB = 32
EOS = 1
A, B, C, D, E, X, THE, CAT, SAW, DOG, AND, BIRD, Z = range(3, 16)


def aligned(**kwargs):
    return copy_drafts.AlignedCopyDraft(VOCAB, **kwargs)


def lookup(**kwargs):
    return drafts.SourceCopyDraft(VOCAB, **kwargs)


DRAFTS = {
    "aligned": lambda: aligned(window=3),
    "aligned-3": lambda: aligned(window=3, branches=3, word_initial=np.arange(VOCAB) != D),
    "lookup": lambda: lookup(max_ngram=2),
    "lookup-2": lambda: lookup(max_ngram=2, branches=2),
}

# Row 0: source "A B C D E" (the output drops C, substitutes X for D, ...), root B at position 2;
# row 1: "the cat saw the dog and the bird" (repeats), root CAT at position 3.
SOURCES = jnp.asarray(
    [[A, B, C, D, E, EOS, 0, 0, 0], [THE, CAT, SAW, THE, DOG, AND, THE, BIRD, EOS]], jnp.int32
)
PREFIX = [[0, A, B, 0], [0, THE, THE, CAT]]  # decoder inputs 0..start; row 0's last is stale
START = jnp.array([2, 3])
SHAPE = tree.TreeShape((3, 2, 1))  # nodes 0 | 1 2 3 | 4 5, 6 7, 8 9 | 10 .. 15
# Node tokens (breadth first). Row 0: 1 = C (in sync), 2 = D (C deleted: re-aligns one ahead),
# 3 = X (new text); 4 = D after C, 5 = Z; 6 = E after D, 7 = C; 8 = D after X, 9 = E; then one
# child each. Row 1: the copy, "the" (repeat) and new text, likewise.
NODES = jnp.asarray(
    [
        [B, C, D, X, D, Z, E, C, D, E, E, D, EOS, D, E, EOS],
        [CAT, SAW, THE, Z, THE, DOG, DOG, CAT, SAW, THE, DOG, BIRD, AND, SAW, THE, DOG],
    ],
    jnp.int32,
)


def fed_prefix(draft, slots=24):
    """The draft's step (jitted per call shape and tree) and its cache after the decoder inputs
    before each row's root (row 0's extra slot is overwritten by the root)."""
    cache, step = draft.prepare(draft.params, SOURCES, slots)
    jitted = jax.jit(step, static_argnames="tree")
    jitted.move_slots, jitted.cache_slots = step.move_slots, step.cache_slots
    _, cache = jitted(jnp.asarray(PREFIX, jnp.int32), jnp.zeros((2,), jnp.int32), cache)
    return jitted, cache


def tree_call(step, tokens, cache, nodes):
    return step(tokens, START, cache, tree=tree.TreeQuery(SHAPE, tuple(nodes)))


@pytest.mark.parametrize("name", list(DRAFTS))
def test_tree_call_equals_block_calls_along_each_path(name):
    """As `expand_tree` calls it (the root as a block call, then one tree call per depth), and as
    one tree call on every node: node i's logits and cursor are those of a block call on its path
    root..i at the root's position (batch 2, rows with different sources and roots)."""
    draft = DRAFTS[name]()
    step, cache = fed_prefix(draft)
    root_logits, by_depth = step(NODES[:, :1], START, cache)
    logits = [root_logits]
    for d in range(1, SHAPE.max_depth + 1):
        got, by_depth = tree_call(step, NODES[:, SHAPE.nodes_at(d)], by_depth, SHAPE.nodes_at(d))
        logits.append(got)
    logits = np.concatenate(logits, axis=1)  # [b, K, V]
    whole_logits, whole = tree_call(step, NODES, cache, range(SHAPE.num_nodes))
    np.testing.assert_array_equal(whole_logits, logits)
    for key in by_depth:
        np.testing.assert_array_equal(whole[key], by_depth[key])
    rows = np.arange(2)
    for i in range(SHAPE.num_nodes):
        path = np.flatnonzero(SHAPE.ancestors[i])  # root .. i
        want, chain = step(NODES[:, path], START, cache)
        np.testing.assert_array_equal(logits[:, i], want[:, -1], err_msg=f"node {i}")
        if "cursor" in chain:  # the aligned draft's cursor after node i
            at_chain = np.asarray(chain["cursor"])[rows, START + len(path) - 1]
            np.testing.assert_array_equal(whole["cursor"][rows, START + i], at_chain)
    if name == "aligned":  # the hand-made nodes do what their comments say
        proposals = np.argmax(logits, -1)
        assert list(proposals[0, :4]) == [C, D, E, D]  # root; in sync, re-aligned, substituted
        assert list(proposals[1, [1, 2, 5]]) == [THE, DOG, AND]  # "the" repeated: its own copy


@pytest.mark.parametrize("name", ["aligned-3", "lookup-2"])
def test_moved_slots_then_a_block_call_equal_the_path_fed_as_a_chain(name):
    draft = DRAFTS[name]()
    step, cache = fed_prefix(draft)
    _, tree_cache = tree_call(step, NODES, cache, range(SHAPE.num_nodes))
    first = SHAPE.first_child
    paths = jnp.asarray(
        [
            [0, 2, first[2] + 1, first[first[2] + 1]],  # D (re-aligned), then C, then its child
            [0, 1, 1, 1],  # one accepted: entries past it repeat the last node
        ]
    )
    accepted = np.array([3, 1])
    moved = step.move_slots(tree_cache, START, paths)
    _, chain_cache = step(jnp.take_along_axis(NODES, paths, 1), START, cache)
    nxt = jnp.asarray([[E, EOS], [DOG, AND]], jnp.int32)
    got, got_cache = step(nxt, START + accepted + 1, moved)
    want, want_cache = step(nxt, START + accepted + 1, chain_cache)
    np.testing.assert_array_equal(got, want)
    for key in want_cache:
        for r in range(2):
            end = int(START[r] + accepted[r]) + 3  # positions written so far
            np.testing.assert_array_equal(got_cache[key][r, :end], want_cache[key][r, :end])
    assert step.cache_slots(tree_cache) == 24


def ranked(logits):
    """The finite-logit tokens of one row, best first, after checking the values 0, -1, ...
    (none for a uniform row: all logits 0)."""
    logits = np.asarray(logits)
    if np.all(logits == 0.0):
        return []
    finite = np.flatnonzero(logits > sampling.NEG_INF / 2)
    order = finite[np.argsort(-logits[finite], kind="stable")]
    np.testing.assert_array_equal(logits[order], -np.arange(len(order), dtype=np.float32))
    assert np.all(logits[logits <= sampling.NEG_INF / 2] == sampling.NEG_INF)
    return [int(t) for t in order]


def after(draft, cases):
    """The ranked candidates after each decoder input (start token, then the output) of each
    (source, output) case, all cases in one batch (one jitted call)."""
    src_len = max(len(source) for source, _ in cases)
    out_len = max(len(output) for _, output in cases) + 1
    enc = jnp.asarray([list(s) + [0] * (src_len - len(s)) for s, _ in cases], jnp.int32)
    fed = jnp.asarray([[0, *o] + [0] * (out_len - 1 - len(o)) for _, o in cases], jnp.int32)
    cache, step = draft.prepare(draft.params, enc, out_len)
    logits, _ = jax.jit(step)(fed, jnp.zeros((len(cases),), jnp.int32), cache)
    return [[ranked(row) for row in logits[c, : len(o) + 1]] for c, (_, o) in enumerate(cases)]


def test_aligned_branches_rank_the_edits_alternatives():
    source = [THE, CAT, SAW, THE, DOG, EOS]
    cases = [
        # Doubled source word: after "A B" in sync, the copy B, then C (the double skipped), D.
        ([A, B, B, C, D, EOS], [A, B]),
        # A source word the output drops (deletion): X, then C, then D.
        ([A, B, X, C, D, EOS], [A, B]),
        # Substitution (Z for X): C after the replaced word, then X (Z inserted), then D.
        ([A, X, C, D, EOS], [A, Z]),
        # A word the source dropped (the output inserts C): E by the substitution guess, then D
        # where the source was (insertion), then EOS.
        ([A, B, D, E, EOS], [A, B, C]),
        # Swapped words (source "A C B D", output "A B C D"): B is the skip after A, C the
        # insertion alternative after B (re-aligned to D), D the one after C.
        ([A, C, B, D, EOS], [A, B, C, D]),
        # Repeated words: the second "the" goes on with "dog"; past the end nothing (two ranks).
        (source, source[:4]),
        # Duplicates take no rank: "A A A B" after A gives A, then B (not A again).
        ([A, A, A, B, EOS], [A]),
        ([0, 0], [A]),  # no source: uniform
    ]
    got = after(aligned(branches=3), cases)
    assert got[0][2] == [B, C, D]
    assert got[1][2] == [X, C, D]
    assert got[2][2] == [C, X, D]
    assert got[3][3] == [E, D, EOS]
    assert got[4][1] == [C, B, D] and got[4][2] == [D, C, EOS] and got[4][3] == [B, D, EOS]
    assert got[5][4] == [DOG, EOS]
    assert got[6][1] == [A, B]
    assert got[7] == [[], []]
    # branches=1 keeps the one-hot draft; 2 cuts the list.
    assert after(aligned(), cases[2:3])[0][2] == [C]
    assert after(aligned(branches=2), cases[2:3])[0][2] == [C, X]
    with pytest.raises(ValueError, match="branches"):
        aligned(branches=0)


def test_lookup_branches_rank_longest_then_earliest_distinct_matches():
    source = [THE, CAT, SAW, THE, DOG, AND, THE, BIRD, EOS]
    cases = [
        (source, [SAW, THE]),  # "saw the" (two tokens) first, then "the" by position
        (source, [X, THE]),  # one-token matches by position
        # A continuation already ranked takes no rank: both "A" are followed by B, then C.
        ([A, B, Z, A, B, A, C, EOS], [X, A]),
        (source, [X, Z]),  # no match: uniform
    ]
    got = after(lookup(max_ngram=2, branches=3), cases)
    assert got[0][2] == [DOG, CAT, BIRD]
    assert got[1][2] == [CAT, DOG, BIRD]
    assert got[2][2] == [B, C]
    assert got[3][2] == []
    assert after(lookup(max_ngram=2), cases[1:2])[0][2] == [CAT]  # branches=1: one-hot
    with pytest.raises(ValueError, match="branches"):
        lookup(branches=0)


# ---------------------------------------------------------------------------------------------
# In the tree loop: greedy identity on a toy target, the exact distribution at T = 1.

MAX_LEN = 10
PATH = [A, B, C, D, E, THE, CAT, SAW, DOG, EOS]  # the toy target's greedy output


def greedy_table(seed=0, vocab=16):
    """A second-order toy target (test_tree.toy_tree_step) whose greedy output is PATH, and a few
    contexts where it is not (those rows then need the target's own tokens)."""
    rng = np.random.RandomState(seed)
    table = rng.randn(MAX_LEN, vocab, vocab, vocab).astype(np.float32)
    for t, y in enumerate(PATH):
        table[t, :, :, y] += 4.0
    return table


# Sources per row: the output itself, a substitution, a drop (the output inserts D), a doubled
# word and a swap: each draft's α is high but below 1 except row 0's.
EDITED = [
    PATH,
    [A, B, X, D, E, THE, CAT, SAW, DOG, EOS],
    [A, B, C, E, THE, CAT, SAW, DOG, EOS],
    [A, B, C, C, D, E, THE, CAT, SAW, DOG, EOS],
    [A, C, B, D, E, THE, SAW, CAT, DOG, EOS],
]


def copy_tree_decode(draft, table, shape, **kwargs):
    shape = tree.parse_tree(shape)
    slots = MAX_LEN + shape.num_nodes - 1
    enc = jnp.asarray([(row + [0] * 12)[:12] for row in EDITED], jnp.int32)
    batch = enc.shape[0]
    inputs = jnp.zeros((batch, MAX_LEN), jnp.int32)

    @jax.jit
    def run(table, rng):
        draft_cache, draft_step = draft.prepare(draft.params, enc, slots)
        return speculative.speculative_sample(
            inputs,
            toy_cache(batch, slots),
            toy_tree_step(table),
            draft_cache,
            draft_step,
            EOS,
            tree=shape,
            decode_rng=rng,
            **kwargs,
        )

    return inputs, run(jnp.asarray(table), jax.random.PRNGKey(0))


@pytest.mark.parametrize(
    "draft, shape",
    [
        (copy_drafts.AlignedCopyDraft(16, branches=1), (1, 1, 1)),
        (copy_drafts.AlignedCopyDraft(16, branches=1), (2, 1, 1)),
        (copy_drafts.AlignedCopyDraft(16, branches=3), (3, 1, 1)),
        (drafts.SourceCopyDraft(16, branches=3), (2, 2, 2)),
    ],
    ids=["aligned-1-chain", "aligned-1", "aligned-3", "lookup-3"],
)
def test_argmax_tree_speculation_with_a_copy_draft_is_greedy(draft, shape):
    table = greedy_table()
    inputs, (decodes, st) = copy_tree_decode(draft, table, shape, temperature=0.0)
    want = greedy_toy_decode(table, inputs)
    np.testing.assert_array_equal(decodes, want)
    tested, accepted = np.asarray(st.num_draft_tokens), np.asarray(st.num_accepted)
    if np.array_equal(want[0], PATH) and isinstance(draft, copy_drafts.AlignedCopyDraft):
        assert accepted[0] == tested[0] > 0  # the exact copy: every depth accepted
    assert 0 < accepted.sum() < tested.sum()
    if getattr(draft, "branches", 1) > 1:
        assert int(np.asarray(st.rank_accepted)[..., 1:].sum()) > 0  # second candidates win


@pytest.mark.slow
def test_sampling_with_a_branching_copy_draft_is_the_targets():
    """Chi-square at T = 1: the aligned draft with branches=2, tree (2, 2), the default rule
    ('without_replacement'), over every output of a toy target that likes to copy."""
    vocab, max_len, n = 5, 3, 20000
    sources = [[2, 3, 4, EOS], [4, 4, 2, EOS]]  # the second row repeats a token
    table = _copying_table([3, 4, 2], vocab, max_len, bonus=2.0, seed=1)
    enc = jnp.asarray([sources[i % 2] for i in range(n)], jnp.int32)
    draft = copy_drafts.AlignedCopyDraft(vocab, branches=2)
    shape = tree.TreeShape((2, 2))
    slots = max_len + shape.num_nodes - 1

    @jax.jit
    def run(rng):
        draft_cache, draft_step = draft.prepare(draft.params, enc, slots)
        return speculative.speculative_sample(
            jnp.zeros((n, max_len), jnp.int32),
            toy_cache(n, slots),
            toy_tree_step(table),
            draft_cache,
            draft_step,
            EOS,
            tree=shape,
            tree_rule="without_replacement",
            decode_rng=rng,
            temperature=1.0,
        )

    decodes, st = run(jax.random.PRNGKey(3))
    expected = exact_sequence_probs(table, max_len, 1.0, 0, 0.0)
    decodes = np.asarray(decodes)
    for parity in (0, 1):  # each source's rows follow the target's distribution
        assert chi_square_pvalue(decodes[parity::2], expected) > 1e-3
    assert 0 < int(st.num_accepted.sum()) < int(st.num_draft_tokens.sum())
    assert int(np.asarray(st.rank_accepted)[..., 1].sum()) > 0  # second children accepted
