"""A draft token tree's shape and its static breadth-first layout: pure index arithmetic.

NumPy only (nothing here touches a network or traces): `TreeShape` (the layout: depth, parent,
rank, children, ancestors, per-depth frontiers and how the draft's children fill the next depth),
`parse_tree` / `shape_from_name` / `tree_name` (what users and row names give), and
`optimal_paths` (the tree of each size from measured path counts). `tree` re-exports every name;
the tree call's attention inputs and the step contract are there, the loop in `tree_decoding`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

TREE_RULES = ("topk", "iid", "without_replacement")
MAX_TREE_NODES = 4096  # far past any tree that pays (a verify call of K rows); larger is a typo


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

    def frontier_columns(self, d: int) -> tuple[int, ...] | None:
        """Columns of `inner_at(d)` among `nodes_at(d)` (the depth-d tokens the draft feeds to
        expand depth d + 1); None when every node at depth d has children (feed them all)."""
        nodes, inner = self.nodes_at(d), self.inner_at(d)
        return None if inner == nodes else tuple(nodes.index(i) for i in inner)

    def children_columns(self, d: int) -> tuple[int, ...] | None:
        """Where the nodes at depth d + 1 sit among the [len(inner_at(d)) * max_children(d)]
        proposed children of depth d's frontier (row-major: frontier node, then rank); None when
        they are all of them in order (every frontier node has max_children(d) children)."""
        inner, k = self.inner_at(d), self.max_children(d)
        pick = [
            inner.index(int(self.parent[j])) * k + int(self.rank[j]) for j in self.nodes_at(d + 1)
        ]
        return None if pick == list(range(len(inner) * k)) else tuple(pick)


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
