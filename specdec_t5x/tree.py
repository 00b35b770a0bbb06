"""Exact tree speculation: the draft proposes a token tree, the target verifies it in one call.

A chain of γ drafts is accepted up to its first rejection; a tree keeps several continuations at
each depth, so a draft whose second choice is often the target's first gives more tokens per target
call. A tree is given by per-depth branching factors: `tree=(3, 2, 1)` gives the root 3
children, each of them 2, each of those 1 (1 + 3 + 6 + 6 = 16 nodes); a chain of γ is `(1,) * γ`.
Or any tree, by its nodes' child-rank paths: `tree=((0,), (1,), (0, 0))` is the draft's first and
second choice after the root and the first choice after the first (`TreeShape`; `optimal_paths`
picks the tree of each size from measured counts, `scripts/tree_ceiling.py` counts them).

Nodes are numbered breadth first: the root (the last emitted token) is node 0, then depth 1 in
child-rank order, then depth 2 grouped by parent, and so on (`TreeShape`). In an encoder-decoder
model only the decoder's self-attention sees the tree: each node gets its own cache slot (start +
node index, so siblings never overwrite each other), attends to the prefix in the cache plus its
ancestors, and has position start + depth for T5's relative position bias (`TreeQuery.attention`,
`network.TreeAttention`). Cross-attention is unchanged. After verification the accepted path's
entries are moved to slots start..start + depth (`TreeStep.move_slots`), so the next iteration sees
an ordinary position-addressed cache.

Modules: `tree_shape` holds the pure layout (`TreeShape`, `parse_tree`, `optimal_paths`: NumPy
index arithmetic, re-exported here); this module what a tree call hands the network
(`TreeQuery`), the step contract (`TreeStep`) and the statistics (`TreeStats`, extending `loop.LoopStats`); `tree_decoding`
the acceptance rules, the walk and the loop.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import loop, network
from specdec_t5x.tree_shape import MAX_TREE_NODES as MAX_TREE_NODES
from specdec_t5x.tree_shape import TREE_RULES as TREE_RULES
from specdec_t5x.tree_shape import TreeShape as TreeShape
from specdec_t5x.tree_shape import optimal_paths as optimal_paths
from specdec_t5x.tree_shape import parse_tree as parse_tree
from specdec_t5x.tree_shape import shape_from_name as shape_from_name
from specdec_t5x.tree_shape import tree_name as tree_name

Array = jax.Array

UNLIMITED_SLOTS = 2**30  # `cache_slots` of a step without a cache


# ---------------------------------------------------------------------------------------------
# The attention inputs of a tree call and the step contract (the layout: `tree_shape`).


@dataclasses.dataclass(frozen=True)
class TreeQuery:
    """Static description of a tree call: which nodes of `shape` the call's tokens are.

    Attributes:
      shape: the `TreeShape`.
      nodes: node indices (breadth-first), one per token of the call, in the call's order.
    """

    shape: TreeShape
    nodes: tuple[int, ...]

    def attention(self, start: Array, cache_len: int) -> tuple[Array, network.TreeAttention]:
        """Positions and cache addressing of this call's tokens for a tree rooted at `start`.

        Node i lives in cache slot start + i and has position start + depth(i); a node attends to
        slots < start (the prefix, where slot = position) and to the slots of its ancestors and
        itself. For a chain (every branching factor 1, all nodes) this is exactly the causal
        position-addressed call.

        Args:
          start: int32 [batch] the root's slot and position (the last emitted token's position).
          cache_len: max_len, slots of the self-attention cache.

        Returns:
          positions: int32 [batch, m] each token's decoder position.
          `network.TreeAttention` with slots int32 [batch, m], key_positions int32 [batch,
          cache_len] and visible bool [batch, m, cache_len].
        """
        shape, nodes = self.shape, np.asarray(self.nodes, np.int32)
        start = jnp.asarray(start, jnp.int32)
        k = shape.num_nodes
        positions = start[:, None] + jnp.asarray(shape.depth[nodes])[None]  # [b, m]
        slots = start[:, None] + jnp.asarray(nodes)[None]  # [b, m]
        rel = jnp.arange(cache_len, dtype=jnp.int32)[None] - start[:, None]  # [b, L]
        in_tree = (rel >= 0) & (rel < k)
        index = jnp.where(in_tree, rel, k)  # k: a padding column (not an ancestor, depth 0)
        anc = np.concatenate([shape.ancestors[nodes], np.zeros((nodes.size, 1), bool)], 1)
        visible = jnp.asarray(anc)[:, index]  # [m, b, L]
        visible = jnp.moveaxis(visible, 0, 1) | (rel < 0)[:, None, :]  # [b, m, L]
        depth = jnp.asarray(np.append(shape.depth, 0))
        key_positions = jnp.where(in_tree, start[:, None] + depth[index], rel + start[:, None])
        return positions, network.TreeAttention(slots, key_positions, visible)


class TreeStep(Protocol):
    """The block-step contract (`steps.BlockStep`) extended to token trees.

    `step(tokens, positions, cache)` is the ordinary block step. With `tree=TreeQuery(shape,
    nodes)`: `tokens int32 [batch, m]` are the nodes `nodes` of a tree rooted at `positions int32
    [batch]`; node i is written to cache slot positions + i, has position positions + depth(i) and
    attends to the cache slots < positions plus the slots of its ancestors and itself
    (`TreeQuery.attention` gives these as arrays: slots, key positions, visible mask). The nodes'
    ancestors must have been written by this call or an earlier one of the same iteration. The
    result is `(logits float32 [batch, m, vocab], cache)`, logits[:, j] being the distribution of
    the token after node nodes[j].

    `step.move_slots(cache, start int32 [batch], path int32 [batch, D + 1]) -> cache` copies slot
    start + path[:, d] to slot start + d for every d (reads before writes): the accepted path's
    entries to their positions. Slots past the cache end are dropped.

    `step.cache_slots(cache) -> int` (static) is the number of self-attention slots of `cache`:
    nodes whose slot would pass it are cut from the tree (exactly: fewer children), so caches
    built for max_decode_len + K - 1 slots keep every tree whole up to the length limit.

    `steps.make_block_step` builds all three for the T5 network (`steps.move_cache_slots`,
    `steps.self_cache_len`); `stateless_step` adapts a step whose logits depend only on the tokens
    fed.
    """

    def __call__(
        self, tokens: Array, positions: Array, cache: Any, tree: TreeQuery | None = None
    ) -> tuple[Array, Any]: ...

    def move_slots(self, cache: Any, start: Array, path: Array) -> Any: ...

    def cache_slots(self, cache: Any) -> int: ...


def stateless_step(step):
    """A `TreeStep` from a block step whose logits depend only on the tokens fed (unigram, bigram
    drafts): the tree is ignored and the cache is never moved."""

    def tree_step(tokens, positions, cache, tree=None):
        del tree
        return step(tokens, positions, cache)

    tree_step.move_slots = lambda cache, start, path: cache
    tree_step.cache_slots = lambda cache: UNLIMITED_SLOTS
    return tree_step


def check_tree_step(step, name: str):
    try:
        takes_tree = "tree" in inspect.signature(step).parameters
    except (TypeError, ValueError):
        takes_tree = False
    methods = all(callable(getattr(step, m, None)) for m in ("move_slots", "cache_slots"))
    if not takes_tree or not methods:
        raise ValueError(
            f"tree speculation needs a {name} step that takes tree= and has move_slots and "
            "cache_slots "
            f"(`tree.TreeStep`: steps.make_block_step, or tree.stateless_step for context-free "
            f"drafts); got {step!r}."
        )


# ---------------------------------------------------------------------------------------------
# The loop's statistics (proposals, verification and the loop: `tree_decoding`).


class TreeVerdict(flax.struct.PyTreeNode):
    """Outcome of verifying one tree per row.

    Attributes:
      path: int32 [batch, D + 1] node index at depths 0..D of the accepted path (root 0; entries
        past `n_accepted` repeat the last accepted node and only ever reach stale slots).
      n_accepted: int32 [batch] accepted depth a (0..D).
      extra: int32 [batch] token emitted after the path (residual sample or bonus).
      depth_tested: bool [batch, D] a child test ran at depth d + 1.
      rank_tested: bool [batch, D, k_max] child of rank i at depth d + 1 was tested.
      rank_accepted: bool [batch, D, k_max] ... and accepted.
      beta: float32 [batch, D] Σ_x min(p, q) at the node whose children depth d + 1 tested.
    """

    path: Array
    n_accepted: Array
    extra: Array
    depth_tested: Array
    rank_tested: Array
    rank_accepted: Array
    beta: Array


@flax.struct.dataclass
class TreeStats(loop.LoopStats):
    """Per-row statistics of a tree-speculative decode (only iterations before a row ended).

    `loop.LoopStats`' fields for a tree, a "draft test" being one depth of the tree (α_counted =
    num_accepted / num_draft_tokens is the per-depth acceptance; accept_histogram int32 [batch,
    D + 1]; num_proposed: K - 1 nodes per iteration, fewer near the length limit), then the
    tree's own.

    Attributes:
      depth_tested: int32 [batch, D] iterations that tested children at depth d + 1.
      depth_accepted: int32 [batch, D] ... and accepted one (acceptance per depth = ratio).
      rank_tested: int32 [batch, D, k_max] tests of the child of rank i at depth d + 1.
      rank_accepted: int32 [batch, D, k_max] ... that accepted it (acceptance per rank = ratio).
      node_accepted: int32 [batch, K] iterations whose accepted path passed node i (the root:
        every iteration), counted as depth_accepted is: per child-rank path, what
        `optimal_paths` takes to choose a smaller tree from a run with a larger one.
    """

    depth_tested: Array
    depth_accepted: Array
    rank_tested: Array
    rank_accepted: Array
    node_accepted: Array

    @classmethod
    def zeros(cls, batch: int, shape: TreeShape) -> TreeStats:
        """The statistics before the first iteration, for `batch` rows and tree `shape`."""
        zeros = lambda *s: jnp.zeros((batch,) + s, jnp.int32)
        depth_max, k_max = shape.max_depth, shape.max_children()
        return cls.start(
            batch,
            depth_max,
            depth_tested=zeros(depth_max),
            depth_accepted=zeros(depth_max),
            rank_tested=zeros(depth_max, k_max),
            rank_accepted=zeros(depth_max, k_max),
            node_accepted=zeros(shape.num_nodes),
        )

    def add(self, verdict, valid: Array, num_new: Array, active: Array) -> TreeStats:
        """These statistics plus one iteration's (depth d counts when d <= num_new: tokens past
        EOS / the limit do not; rows not `active` add nothing).

        Args:
          verdict: the iteration's `TreeVerdict` (`tree_decoding.verify_tree`).
          valid: bool [batch, K] the nodes that existed (the rest were past the cache end).
          num_new: int32 [batch] tokens written.
          active: bool [batch] rows still decoding at the iteration's start.
        """
        depth_max = verdict.depth_tested.shape[1]
        depths = jnp.arange(1, depth_max + 1)[None]
        counted = depths <= num_new[:, None]  # [b, D]
        tested = verdict.depth_tested & counted
        accepted = tested & (depths <= verdict.n_accepted[:, None])
        n_tested, n_acc = jnp.sum(tested, 1), jnp.sum(accepted, axis=1)
        beta = jnp.sum(jnp.where(tested, verdict.beta, 0.0), 1)
        s = self.count(active, n_tested, n_acc, beta, num_new, jnp.sum(valid, 1) - 1)
        rows = jnp.arange(num_new.shape[0])
        return s.replace(
            depth_tested=s.depth_tested + tested,
            depth_accepted=s.depth_accepted + accepted,
            rank_tested=s.rank_tested + (verdict.rank_tested & counted[..., None]),
            rank_accepted=s.rank_accepted + (verdict.rank_accepted & counted[..., None]),
            node_accepted=s.node_accepted.at[rows[:, None], verdict.path].add(
                jnp.concatenate([active[:, None], accepted], axis=1).astype(jnp.int32)
            ),
        )
