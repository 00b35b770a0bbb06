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

The acceptance rules, the walk and the loop: `tree_decoding`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import network

Array = jax.Array

TREE_RULES = ("topk", "iid", "without_replacement")
MAX_TREE_NODES = 4096  # far past any tree that pays (a verify call of K rows); larger is a typo
UNLIMITED_SLOTS = 2**30  # `cache_slots` of a step without a cache


# ---------------------------------------------------------------------------------------------
# Shapes, node layout and the attention inputs of a tree call.


def _is_int(x) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A token tree and its static breadth-first layout.

    Given either way (exactly one of the two):
      branching: (b_1, ..., b_D), b_d >= 1 children for every node at depth d - 1: (3, 2, 1) gives
        the root 3 children, each of them 2, each of those 1.
      paths: any tree, as the child-rank path of every node but the root (the draft's i-th choice
        is rank i), e.g. ((0,), (1,), (0, 0), (0, 0, 0)): the root's first and second choice, and
        two more levels under the first. Every prefix of a path must be in the tree, and a node's
        children must be ranks 0..m-1. `optimal_paths` builds one from measured path counts.

    Properties (NumPy, static): `depth` int32 [K], `parent` int32 [K] (-1 for the root), `rank`
    int32 [K] (child index among siblings), `first_child` int32 [K] (0 for leaves),
    `num_children` int32 [K], `offsets` (first node of each depth, D + 2 entries), `ancestors`
    bool [K, K] (ancestor-or-self), `inner` (the nodes with children, increasing) and
    `inner_index` int32 [K] (a node's index in `inner`, 0 for leaves).

    Raises:
      ValueError: neither or both given, an empty shape, a branching factor that is not an int
        >= 1, a path that is not a tuple of ints >= 0, a missing prefix or rank, a repeat.
    """

    branching: tuple[int, ...] | None = None
    paths: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self):
        b, paths = self.branching, self.paths
        if (b is None) == (paths is None):
            raise ValueError(
                "a tree is per-depth branching factors, e.g. (3, 2, 1), or the child-rank paths of "
                f"its nodes, e.g. ((0,), (1,), (0, 0)); got branching={b!r}, paths={paths!r}."
            )
        if b is not None:
            if not isinstance(b, tuple) or not b or not all(_is_int(x) and x >= 1 for x in b):
                raise ValueError(
                    f"tree must be a non-empty tuple of branching factors (ints >= 1) per depth, "
                    f"e.g. (3, 2, 1); got tree={b!r}."
                )
            nodes = width = 1
            for x in b:
                width *= int(x)
                nodes += width
                if nodes > MAX_TREE_NODES:
                    raise ValueError(
                        f"tree={b!r} has more than MAX_TREE_NODES={MAX_TREE_NODES} nodes (every "
                        "node is a row of one verify call)."
                    )
            return
        if (
            not isinstance(paths, tuple)
            or not paths
            or not all(
                isinstance(p, tuple) and p and all(_is_int(r) and r >= 0 for r in p) for p in paths
            )
        ):
            raise ValueError(
                "tree paths must be a non-empty tuple of non-empty tuples of child ranks (ints >= "
                f"0), e.g. ((0,), (1,), (0, 0)); got paths={paths!r}."
            )
        if len(paths) + 1 > MAX_TREE_NODES:
            raise ValueError(
                f"tree paths give {len(paths) + 1} nodes, more than MAX_TREE_NODES="
                f"{MAX_TREE_NODES} (every node is a row of one verify call)."
            )
        known = set(paths)
        if len(known) != len(paths):
            raise ValueError(f"tree paths must not repeat a node; got paths={paths!r}.")
        for p in paths:
            needs = ([p[:-1]] if len(p) > 1 else []) + ([p[:-1] + (p[-1] - 1,)] if p[-1] else [])
            for need in needs:
                if need not in known:
                    raise ValueError(
                        f"tree path {p} needs {need} in the tree too (every node's parent and "
                        f"lower-ranked siblings); got paths={paths!r}."
                    )
        canonical = tuple(
            sorted((tuple(int(r) for r in p) for p in paths), key=lambda p: (len(p), p))
        )
        object.__setattr__(self, "paths", canonical)  # equal trees compare (and hash) equal

    @functools.cached_property
    def node_paths(self) -> tuple[tuple[int, ...], ...]:
        """Every node's child-rank path in layout order (the root's is ())."""
        if self.paths is None:
            level, paths = [()], [()]
            for b in self.branching:
                level = [p + (i,) for p in level for i in range(b)]
                paths += level
            return tuple(paths)
        return ((),) + self.paths

    @property
    def spec(self) -> tuple:
        """What the tree was given as (`parse_tree` takes it back): branching or paths."""
        return self.branching if self.paths is None else self.paths

    @property
    def name(self) -> str:
        """The tree's row name (`shape_from_name` reads it back): 'tree(3,2,1)' for branching
        factors, 'tree[0,1,00,000]' for paths (each node's ranks as digits, ',' between nodes),
        'tree{0,10,0.1}' for paths with a rank >= 10 (ranks joined by '.')."""
        if self.paths is None:
            return "tree(" + ",".join(str(int(b)) for b in self.branching) + ")"
        if all(r < 10 for p in self.paths for r in p):
            return "tree[" + ",".join("".join(map(str, p)) for p in self.node_paths[1:]) + "]"
        return "tree{" + ",".join(".".join(map(str, p)) for p in self.node_paths[1:]) + "}"

    @property
    def max_depth(self) -> int:
        """D, the depth of the deepest leaves (drafts per accepted path at most)."""
        return len(self.node_paths[-1])

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        counts = np.bincount(self.depth, minlength=self.max_depth + 1)  # nodes per depth 0..D
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)  # [D + 2]

    @property
    def num_nodes(self) -> int:
        """K, nodes including the root."""
        return len(self.node_paths)

    @property
    def num_inner(self) -> int:
        """Nodes with children (the ones whose children are drafted)."""
        return len(self.inner)

    @functools.cached_property
    def _index(self) -> dict[tuple[int, ...], int]:
        return {p: i for i, p in enumerate(self.node_paths)}

    @functools.cached_property
    def depth(self) -> np.ndarray:
        return np.asarray([len(p) for p in self.node_paths], np.int32)

    @functools.cached_property
    def parent(self) -> np.ndarray:
        return np.asarray([self._index[p[:-1]] if p else -1 for p in self.node_paths], np.int32)

    @functools.cached_property
    def rank(self) -> np.ndarray:
        return np.asarray([p[-1] if p else 0 for p in self.node_paths], np.int32)

    @functools.cached_property
    def num_children(self) -> np.ndarray:
        return np.bincount(self.parent[1:], minlength=self.num_nodes).astype(np.int32)

    @functools.cached_property
    def first_child(self) -> np.ndarray:
        first = np.zeros(self.num_nodes, np.int32)
        for i in range(self.num_nodes - 1, 0, -1):  # children are contiguous, in rank order
            first[self.parent[i]] = i
        return first

    @functools.cached_property
    def inner(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.flatnonzero(self.num_children))

    @functools.cached_property
    def inner_index(self) -> np.ndarray:
        index = np.zeros(self.num_nodes, np.int32)
        index[list(self.inner)] = np.arange(self.num_inner)
        return index

    def max_children(self, d: int | None = None) -> int:
        """Most children of a node (at depth d; anywhere when d is None)."""
        counts = self.num_children if d is None else self.num_children[self.depth == d]
        return int(counts.max(initial=0))

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        anc = np.eye(self.num_nodes, dtype=bool)
        for i in range(1, self.num_nodes):
            anc[i] |= anc[self.parent[i]]
        return anc

    def nodes_at(self, d: int) -> tuple[int, ...]:
        """The node indices at depth d (0..D)."""
        return tuple(range(int(self.offsets[d]), int(self.offsets[d + 1])))

    def inner_at(self, d: int) -> tuple[int, ...]:
        """The nodes at depth d that have children (the frontier the draft expands)."""
        return tuple(i for i in self.nodes_at(d) if self.num_children[i])


def parse_tree(tree) -> TreeShape:
    """A `TreeShape` from branching factors (ints), child-rank paths (tuples of ints) or a row
    name ('tree(2,1)', 'tree[0,1,00]', `shape_from_name`); gin and JSON give lists, taken as
    tuples.

    Raises:
      ValueError: see `TreeShape` and `shape_from_name`; ints and paths mixed.
    """
    if isinstance(tree, TreeShape):
        return tree
    if isinstance(tree, str):
        return shape_from_name(tree)
    nested = [isinstance(p, list | tuple) for p in tree] if isinstance(tree, list | tuple) else []
    if any(nested) and not all(nested):
        raise ValueError(
            "a tree is either branching factors (ints, e.g. (3, 2, 1)) or child-rank paths "
            f"(tuples, e.g. ((0,), (1,), (0, 0))), not both; got tree={tree!r}."
        )
    if any(nested):
        return TreeShape(paths=tuple(tuple(p) for p in tree))
    if isinstance(tree, list | tuple):
        tree = tuple(tree)
    return TreeShape(tree)


def shape_from_name(name: str) -> TreeShape:
    """The `TreeShape` of a row name written by `TreeShape.name` ('tree(3,2,1)', 'tree[0,1,00]',
    'tree{0,10,0.1}').

    Raises:
      ValueError: a name of none of those forms, or of a bad tree.
    """
    body = name[5:-1] if isinstance(name, str) and len(name) > 6 else ""
    try:
        if name.startswith("tree(") and name.endswith(")"):
            return TreeShape(tuple(int(b) for b in body.split(",")))
        if name.startswith("tree[") and name.endswith("]"):
            return TreeShape(paths=tuple(tuple(int(r) for r in p) for p in body.split(",")))
        if name.startswith("tree{") and name.endswith("}"):
            return TreeShape(paths=tuple(tuple(map(int, p.split("."))) for p in body.split(",")))
    except (ValueError, AttributeError):
        pass
    raise ValueError(
        f"a tree row name is 'tree(3,2,1)', 'tree[0,1,00]' or 'tree{{0,10,0.1}}'; got {name!r}."
    )


def tree_name(tree) -> str:
    """A tree row's name (`TreeShape.name`), e.g. 'tree(3,2,1)' or 'tree[0,1,00]'."""
    return parse_tree(tree).name


def optimal_paths(path_counts, num_nodes: int) -> tuple[tuple[int, ...], ...]:
    """The tree of `num_nodes` nodes (root included) that would have accepted the most tokens.

    At T = 0 an iteration accepts the longest path of the tree that the target's own tokens
    follow, so a node's worth is how often its child-rank path is a prefix of the target's
    continuation (its count). Nodes are added most counted first among those whose parent and
    lower-ranked sibling are in already (ties: shorter, then lower ranks). A path's count is at
    most its prefix's, so where a lower rank is counted at least as often as a higher one this
    is the tree of that size that accepts the most on the data counted (Sequoia, Chen et al.
    2024, with measured counts in place of a per-position acceptance model).

    Args:
      path_counts: {child-rank path (tuple of ints): count} (`scripts/tree_ceiling.py` counts
        them from the draft's ranks of the target's greedy tokens).
      num_nodes: K >= 2.

    Returns:
      The paths (a `TreeShape(paths=...)` spec), fewer when fewer paths can be added.

    Raises:
      ValueError: num_nodes < 2 or no path counted.
    """
    if not _is_int(num_nodes) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an int >= 2 (root and one draft); got {num_nodes!r}.")
    counts = {tuple(int(r) for r in p): c for p, c in dict(path_counts).items() if c > 0 and p}
    if not counts:
        raise ValueError("optimal_paths needs at least one counted path.")
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < num_nodes - 1:
        ready = [
            p
            for p in counts
            if p not in chosen
            and (len(p) == 1 or p[:-1] in chosen)
            and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in chosen)
        ]
        if not ready:
            break
        chosen.add(min(ready, key=lambda p: (-counts[p], len(p), p)))
    return tuple(sorted(chosen, key=lambda p: (len(p), p)))


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
# Proposals and verification.


# ---------------------------------------------------------------------------------------------
# The loop.


@flax.struct.dataclass
class TreeStats:
    """Per-row statistics of a tree-speculative decode (only iterations before a row ended).

    The first eight fields mean what `speculative.SpeculativeStats`' do, with a "draft test" being
    one depth of the tree (α_counted = num_accepted / num_draft_tokens is the per-depth
    acceptance); the rest are the tree's own.

    Attributes:
      num_iterations: int32 [batch] target verify calls.
      num_draft_tokens: int32 [batch] depths whose child tests ran (cut at EOS / the limit).
      num_accepted: int32 [batch] accepted depths.
      accept_histogram: int32 [batch, D + 1] iterations whose accepted depth was a.
      beta_sum: float32 [batch] Σ β at the tested depths' nodes; num_beta: int32 [batch] terms.
      num_generated: int32 [batch] tokens written (EOS included); tokens per target call =
        num_generated / num_iterations.
      num_proposed: int32 [batch] draft nodes proposed (K - 1 per iteration, fewer near the
        length limit).
      depth_tested: int32 [batch, D] iterations that tested children at depth d + 1.
      depth_accepted: int32 [batch, D] ... and accepted one (acceptance per depth = ratio).
      rank_tested: int32 [batch, D, k_max] tests of the child of rank i at depth d + 1.
      rank_accepted: int32 [batch, D, k_max] ... that accepted it (acceptance per rank = ratio).
      node_accepted: int32 [batch, K] iterations whose accepted path passed node i (the root:
        every iteration), counted as depth_accepted is: per child-rank path, what
        `optimal_paths` takes to choose a smaller tree from a run with a larger one.
    """

    num_iterations: Array
    num_draft_tokens: Array
    num_accepted: Array
    accept_histogram: Array
    beta_sum: Array
    num_beta: Array
    num_generated: Array
    num_proposed: Array
    depth_tested: Array
    depth_accepted: Array
    rank_tested: Array
    rank_accepted: Array
    node_accepted: Array
