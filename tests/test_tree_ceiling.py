"""experiments/trees/tree_ceiling.py: tokens per target call of a tree from the draft's ranks of the target's
greedy tokens, checked against the tree loop itself on the toy Markov pair."""

import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from test_speculative import EOS
from test_tree import IRREGULAR, greedy_toy_decode, random_tables, run_toy

from specdec_t5x import tree

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments" / "trees"))
import tree_ceiling  # noqa: E402


def toy_ranks(p, q, batch, max_len):
    """The target's greedy decodes (from zeros) and the draft table's rank of each token."""
    out = greedy_toy_decode(p, jnp.zeros((batch, max_len), jnp.int32))
    ranks = np.zeros(out.shape, np.int32)
    for b, row in enumerate(out):
        seq = [0, *row.tolist()]
        for i in range(max_len):
            logits = q[i, seq[i - 1] if i >= 1 else 0, seq[i]]
            ranks[b, i] = int(np.argsort(-logits, kind="stable").tolist().index(row[i]))
    lengths = np.asarray(
        [int(np.argmax(r == EOS)) + 1 if (r == EOS).any() else max_len for r in out]
    )
    return out, ranks, lengths


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2), (3, 1, 1), IRREGULAR, ((0,), (1,), (1, 0))])
def test_tokens_per_call_from_ranks_is_the_loops(shape):
    max_len = 8
    for seed in (3, 4, 5):
        p, q = random_tables(seed=seed, vocab=6, max_len=max_len)
        p[..., EOS] -= 2.0  # long rows, some ending in EOS
        out, ranks, lengths = toy_ranks(p, q, 1, max_len)
        _, st = run_toy(p, q, 1, shape, temperature=0.0)
        loop = int(st.num_generated[0]) / int(st.num_iterations[0])
        assert tree_ceiling.tokens_per_call(ranks, lengths, tree.parse_tree(shape)) == loop


def test_accepted_depth_and_path_counts_by_hand():
    ranks = np.asarray([[0, 1, 0, 2, 0]], np.int32)
    paths = {(0,), (1,), (0, 0), (0, 1), (0, 1, 0)}
    assert tree_ceiling.accepted_depth(ranks[0], 0, 5, paths, 3) == 3  # 0, 1, 0
    assert tree_ceiling.accepted_depth(ranks[0], 1, 5, paths, 3) == 1  # (1,); (1, 0) is not in it
    assert tree_ceiling.accepted_depth(ranks[0], 0, 2, paths, 3) == 2  # cut at the length
    counts = tree_ceiling.path_counts(ranks, np.asarray([5]), max_depth=2)
    assert counts[(0,)] == 3 and counts[(1,)] == 1 and counts[(2,)] == 1
    assert counts[(0, 1)] == 1 and counts[(1, 0)] == 1 and counts[(0, 2)] == 1
    # A chain of 2 from 0: rank 0 then 1 (not a chain's): 2 tokens; from 2: 0 then 2: 2; from 4: 1
    chain = tree.TreeShape((1, 1))
    assert tree_ceiling.tokens_per_call(ranks, np.asarray([5]), chain) == 5 / 3


def test_branchings_and_cost_curve():
    got = sorted(tree_ceiling.branchings(5, max_depth=4))
    assert got == [(1, 1, 1, 1), (1, 1, 2), (1, 3), (2, 1), (4,)]
    assert all(tree.TreeShape(b).num_nodes == 5 for b in got)
    tk = {1: 10.0, 4: 13.0, 8: 21.0}
    assert tree_ceiling.cost(tk, 4) == 13.0 and tree_ceiling.cost(tk, 6) == 17.0
    assert tree_ceiling.cost(tk, 10) == 25.0  # past the last point: its slope


def test_choices_by_draft_confidence():
    ranks = np.asarray([0, 1, 3, 0, 0], np.int32)
    top1 = np.asarray([0.1, 0.15, 0.3, 0.99, 1.0], np.float32)
    rows = tree_ceiling.by_confidence(ranks, top1)
    assert [r["q_top1"] for r in rows] == [[0.0, 0.2], [0.2, 0.4], [0.95, 1.0]]  # empty bins cut
    assert rows[0] == {"q_top1": [0.0, 0.2], "tokens": 2, "share": 0.4, "first": 0.5,
                       "second": 0.5, "later_or_none": 0.0}  # fmt: skip
    assert rows[1]["later_or_none"] == 1.0 and rows[2]["tokens"] == 2 and rows[2]["first"] == 1.0


def toy_draft_log_probs(q, out):
    """`draft_log_probs` of the toy draft table after the decoded prefixes of `out`'s rows."""

    def log_probs(b, prefixes):
        rows = []
        for prefix in prefixes:
            seq, t = [0, *prefix], len(prefix)
            if t >= q.shape[0]:  # past the length limit: never accepted, any distribution
                rows.append(np.full(q.shape[-1], -np.log(q.shape[-1])))
                continue
            logits = q[t, seq[t - 1] if t >= 1 else 0, seq[t]]
            rows.append(logits - np.log(np.sum(np.exp(logits))))
        return np.asarray(rows)

    return log_probs


def test_trees_chosen_per_iteration_reduce_to_the_static_ones():
    """One candidate per depth is the chain; every candidate kept is the full tree (3, 3)."""
    max_len = 8
    for seed in (3, 4):
        p, q = random_tables(seed=seed, vocab=6, max_len=max_len)
        p[..., EOS] -= 2.0
        out, ranks, lengths = toy_ranks(p, q, 1, max_len)
        lp = toy_draft_log_probs(q, out)
        chain = tree_ceiling.dynamic_tokens_per_call(lp, out, lengths, 4, 1, 1, 3)
        assert chain == tree_ceiling.tokens_per_call(ranks, lengths, tree.TreeShape((1, 1, 1)))
        full = tree_ceiling.dynamic_tokens_per_call(lp, out, lengths, 13, 3, 3, 2)
        assert full == tree_ceiling.tokens_per_call(ranks, lengths, tree.TreeShape((3, 3)))
        small = tree_ceiling.dynamic_tokens_per_call(lp, out, lengths, 5, 3, 3, 2)
        assert 1.0 <= small <= full
