"""Tree speculation's acceptance rules, the walk down the tree and the decode loop.

`tree` defines the shapes, the node layout and the tree call; this module proposes the children
(`propose_children`), verifies a tree per row (`verify_tree`) and builds the loop (`tree_iteration`).

Acceptance rules (p = target, q = draft, both adjusted as in `sampling`; each keeps the target's
distribution exactly, they differ in how often they accept). At a node with target distribution p
and children x_1..x_k, r <- p, then for i = 1..k: accept x_i with min(1, r(x_i) / q_i(x_i)) and
descend into it; on rejection r <- norm(max(r - q_i, 0)); if every child is rejected the node emits
a sample from r (at a leaf reached by acceptance: the bonus token from p).

* 'topk' (deterministic distinct children, the draft's top-k): q_i is the point mass on x_i, so
  x_i is accepted with probability r(x_i) and a rejection sets r(x_i) = 0 and renormalises.
* 'iid' (SpecInfer, Miao et al. 2023, "multi-step speculative sampling"): children i.i.d. from q,
  q_i = q for every i.
* 'without_replacement' (Jeon et al. 2024, "Recursive Speculative Decoding"): children drawn from q
  without replacement (sequential inverse-CDF draws, each drawn token removed), q_1 = q and
  q_{i+1} = q_i with x_i removed and renormalised;
  the residual uses q_i *before* removing x_i. Children beyond q's support do not exist.

The default is 'without_replacement': on the toy pairs of tests/test_tree.py (trees (2, 2), (3, 1),
(2, 2, 2) at T in {0.5, 1, 2}, top-k, top-p) it gave the most tokens per target call in most
settings and 'iid' in the others (by little), while 'topk' trailed, the more so the higher T: a
point mass is accepted with probability p(x), a sampled child with min(1, p(x) / q(x)). The DDTP
measurements decide for real.

Argmax mode (temperature at or below `sampling.MIN_TEMPERATURE`) is the same for every rule: the
children are the draft's top-k tokens, the walk follows the child equal to the target's argmax and
emits the argmax where none is (the bonus argmax at a leaf): the output is greedy decoding's.

Why a loop beside `speculative`'s rather than one loop for both: folding the chain into this loop
would change the chain's outputs at T > 0 (another random stream: one uniform per depth and rank,
children drawn per depth) and add work to every chain iteration (the slot move, the tree's mask
and key-position arrays, the per-rank walk), and the chain's block verification and early exit
have no tree counterpart here. So `speculative.speculative_sample(tree=None)` runs the chain code
unchanged, and `tree=(1,) * γ` runs this loop: the chain's tokens in argmax mode (tested on the T5
network) and the same distribution at T > 0 with another random stream.

Worked example, tree (2, 1), 2 accepted (start = n - 1 = 2, last token b at position 2)::

  nodes:  0 = b (depth 0, slot 2); 1 = x, 2 = x' (depth 1, slots 3, 4, position 3);
          3 = y (child of x), 4 = y' (child of x') (depth 2, slots 5, 6, position 4)
  draft:  feed b@2 -> q_0, children x, x'; feed [x, x'] (tree call) -> q_1, q_2, children y, y'
  verify: target on all 5 nodes at once (node 4 sees slots 0..2 and 4, 6) -> p_0..p_4
  accept: x' (rank 1) after x was rejected, then y': path = [0, 2, 4], bonus t ~ p_4
  move:   slot 3 <- slot 4, slot 4 <- slot 6; the caches now hold b, x', y' at positions 2..4;
          buffer gets x', y', t at positions 3..5 and n = 6.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import loop
from specdec_t5x import sampling as sampling_lib  # `sampling` is the settings' name below
from specdec_t5x import tree as tree_lib
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation

Array = jax.Array


top_k_indices = sampling_lib.top_k_indices  # here since the tree loop was its first user
TreeVerdict = tree_lib.TreeVerdict  # the walk's result (with the statistics it feeds)


def propose_children(logits: Array, k: int, rule: str, greedy: bool, adjust, rng):
    """The k children of each frontier node and the draft distribution q there.

    Args:
      logits: float32 [batch, n, vocab] draft logits at n frontier nodes.
      k: children per node (static).
      rule: one of `tree_lib.TREE_RULES` (ignored in argmax mode).
      greedy: argmax mode (children = the draft's top-k logits, q = None).
      adjust: raw logits -> adjusted logits (`sampling.adjust_logits` with the run's settings).
      rng: PRNG key (None in argmax mode).

    Returns:
      children int32 [batch, n, k] (rank order) and q float32 [batch, n, vocab] (None in argmax
      mode).
    """
    if greedy:
        return top_k_indices(logits, k), None
    adjusted = adjust(logits)
    q = jax.nn.softmax(adjusted, axis=-1)
    if rule == "topk":
        children = top_k_indices(adjusted, k)
    elif rule == "iid":
        u = jax.random.uniform(rng, (k,) + logits.shape[:-1])  # [k, b, n]
        children = jnp.stack([sampling_lib.inverse_cdf_sample(u[i], q) for i in range(k)], -1)
    else:  # without replacement: x_i ~ q with x_1..x_{i-1} removed (one uniform per child; a
        # Gumbel per vocabulary entry, the same distribution, cost ~10x more on CPU). Past q's
        # support the row has no mass left: its child is any id, with q_i = 0 it is never tested.
        u = jax.random.uniform(rng, (k,) + logits.shape[:-1])  # [k, b, n]
        vocab_ids = jnp.arange(q.shape[-1])
        remaining, picks = q, []
        for i in range(k):
            picks.append(sampling_lib.inverse_cdf_sample(u[i], remaining))
            remaining = jnp.where(vocab_ids == picks[-1][..., None], 0.0, remaining)
        children = jnp.stack(picks, -1)
    return children.astype(jnp.int32), q


def expand_tree(draft_step, shape, last, root_logits, start, cache, rule, greedy, adjust, rng):
    """The draft's tree: the root's children from `root_logits`, then one tree call per depth
    whose frontier (the nodes with children) are its M rows, each node's children from its logits.

    Args:
      draft_step: the draft's `tree_lib.TreeStep`.
      shape: the `tree_lib.TreeShape` (static).
      last: int32 [batch] the root token (already fed: `root_logits` are its logits).
      root_logits: float32 [batch, vocab] the draft's logits after the root.
      start: int32 [batch] the root's slot and position.
      cache: the draft's cache with the root written.
      rule, greedy, adjust: as `propose_children`.
      rng: PRNG key (None in argmax mode), split into one key per depth.

    Returns:
      tokens int32 [batch, K] (breadth first, node 0 = `last`), q float32 [batch, num_inner,
      vocab] (the draft distribution at each node with children, in `shape.inner` order; None in
      argmax mode) and the cache.
    """
    batch, depth_max = last.shape[0], shape.max_depth
    depth_rngs = [None] * depth_max if greedy else list(jax.random.split(rng, depth_max))
    frontier_logits = root_logits[:, None]  # [b, 1, V]
    level = last[:, None]  # the tokens of the nodes at depth d, [b, n_d]
    tokens, q_parts = [level], []
    for d in range(depth_max):
        if d > 0:  # feed the nodes at depth d that have children
            query = tree_lib.TreeQuery(shape, shape.inner_at(d))
            columns = shape.frontier_columns(d)
            fed = level if columns is None else level[:, np.asarray(columns)]
            frontier_logits, cache = draft_step(fed, start, cache, tree=query)
        children, q_d = propose_children(
            frontier_logits, shape.max_children(d), rule, greedy, adjust, depth_rngs[d]
        )  # [b, len(inner), k]
        level = children.reshape(batch, -1)  # [b, len(inner) * k]
        columns = shape.children_columns(d)  # some nodes have fewer than k children
        level = level if columns is None else level[:, np.asarray(columns)]  # [b, n_{d+1}]
        tokens.append(level)
        q_parts.append(q_d)
    q = None if greedy else jnp.concatenate(q_parts, axis=1)  # [b, num_inner, V]
    return jnp.concatenate(tokens, axis=1), q, cache  # [b, K] breadth first


def _normalised(r: Array, fallback: Array) -> Array:
    mass = jnp.sum(r, axis=-1, keepdims=True)
    return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), fallback)


def residual_after_rejection(r: Array, q_i: Array) -> Array:
    """norm(max(r - q_i, 0)), the target left after rejecting a child drawn from q_i (float32
    [batch, vocab] each); r itself where nothing is left (r = q_i up to rounding)."""
    return _normalised(jnp.maximum(r - q_i, 0.0), r)


def verify_tree(
    shape: tree_lib.TreeShape,
    tokens: Array,
    valid: Array,
    rule: str,
    *,
    target_argmax: Array | None = None,
    p: Array | None = None,
    q: Array | None = None,
    rng: Array | None = None,
) -> TreeVerdict:
    """Walks each row's tree from the root: at each node test its children in rank order.

    Args:
      shape: the `tree_lib.TreeShape` (static).
      tokens: int32 [batch, K] node tokens (node 0 = the root, not tested).
      valid: bool [batch, K] nodes that exist for the row (the tree is cut where its slots pass the
        cache end; invalid nodes are never tested).
      rule: one of `tree_lib.TREE_RULES` (ignored in argmax mode).
      target_argmax: int32 [batch, K] the target's argmax after each node (argmax mode).
      p: float32 [batch, K, vocab] adjusted target distributions after each node (sampling).
      q: float32 [batch, num_inner, vocab] adjusted draft distributions at the nodes with
        children (`shape.inner` order), the ones the children were drawn from (sampling).
      rng: PRNG key (sampling): one uniform per depth and rank, and one for the extra token.

    Returns:
      `TreeVerdict`.
    """
    greedy = target_argmax is not None
    batch = tokens.shape[0]
    rows = jnp.arange(batch)
    depth_max, k_max = shape.max_depth, shape.max_children()
    first_child = jnp.asarray(shape.first_child)
    num_children = jnp.asarray(shape.num_children)
    inner_index = jnp.asarray(shape.inner_index)
    if not greedy:
        u = jax.random.uniform(rng, (batch, depth_max * k_max + 1))
    cur = jnp.zeros((batch,), jnp.int32)
    alive = jnp.ones((batch,), bool)
    path = [cur]
    extra = jnp.zeros((batch,), jnp.int32)
    r_final = None if greedy else jnp.zeros_like(p[:, 0])
    depth_tested, rank_tested, rank_accepted, betas = [], [], [], []
    for d in range(1, depth_max + 1):
        k = shape.max_children(d - 1)
        first, n_children = first_child[cur], num_children[cur]  # [b] each
        allowed = [alive & (i < n_children) & valid[rows, first + i] for i in range(k)]
        if greedy:
            t = target_argmax[rows, cur]
            betas.append((tokens[rows, first] == t).astype(jnp.float32))  # one-hot p and q
            chosen, found, tested_i, accepted_i = _greedy_children(t, tokens, cur, first, allowed)
            extra = jnp.where(alive & ~found, t, extra)
        else:
            r = p[rows, cur]  # [b, V]
            q_node = q[rows, inner_index[cur]]  # [b, V] (a leaf's is unused)
            betas.append(jnp.sum(jnp.minimum(r, q_node), axis=-1))
            u_d = u[:, (d - 1) * k_max : (d - 1) * k_max + k]
            chosen, found, tested_i, accepted_i, r = _sampled_children(
                r, q_node, u_d, tokens, cur, first, allowed, rule
            )
            r_final = jnp.where((alive & ~found)[:, None], r, r_final)
        pad = [jnp.zeros((batch,), bool)] * (k_max - k)
        rank_tested.append(jnp.stack(tested_i + pad, axis=1))
        rank_accepted.append(jnp.stack(accepted_i + pad, axis=1))
        depth_tested.append(jnp.any(rank_tested[-1], axis=1))
        cur = jnp.where(found, chosen, cur)
        alive &= found
        path.append(cur)
    # Rows that accepted a leaf: the bonus token after it.
    if greedy:
        extra = jnp.where(alive, target_argmax[rows, cur], extra)
    else:
        r_final = jnp.where(alive[:, None], p[rows, cur], r_final)
        extra = sampling_lib.inverse_cdf_sample(u[:, -1], r_final)
    rank_accepted = jnp.stack(rank_accepted, axis=1)  # [b, D, k_max]
    return TreeVerdict(
        path=jnp.stack(path, axis=1),  # [b, D + 1]
        n_accepted=jnp.sum(jnp.any(rank_accepted, axis=2), axis=1).astype(jnp.int32),
        extra=extra,
        depth_tested=jnp.stack(depth_tested, axis=1),
        rank_tested=jnp.stack(rank_tested, axis=1),
        rank_accepted=rank_accepted,
        beta=jnp.stack(betas, axis=1),
    )


def _greedy_children(t, tokens, cur, first, allowed):
    """Argmax mode at each row's node: its first child equal to the target's argmax t int32
    [batch]. `allowed` bool [batch] per rank: the child exists, is valid and the row is alive.

    Returns:
      chosen int32 [batch] (the accepted child, else `cur`), found bool [batch], and per rank
      tested / accepted bool [batch] lists.
    """
    rows = jnp.arange(tokens.shape[0])
    found, chosen, tested, accepted = jnp.zeros(cur.shape, bool), cur, [], []
    for i, ok_i in enumerate(allowed):
        c = first + i
        testing = ok_i & ~found
        ok = testing & (tokens[rows, c] == t)
        chosen = jnp.where(ok, c, chosen)
        found |= ok
        tested.append(testing)
        accepted.append(ok)
    return chosen, found, tested, accepted


def _sampled_children(r, q_node, u, tokens, cur, first, allowed, rule):
    """The rule's child tests at each row's node, in rank order (the module docstring).

    Args:
      r: float32 [batch, vocab] the target's distribution p at the node.
      q_node: float32 [batch, vocab] the draft's q there (the children's first proposal).
      u: float32 [batch, k] one uniform per rank.
      tokens, cur, first: node tokens int32 [batch, K], the node and its first child int32
        [batch].
      allowed: per rank bool [batch] (the child exists, is valid and the row is alive).
      rule: one of `tree_lib.TREE_RULES`.

    Returns:
      chosen int32 [batch], found bool [batch], per rank tested / accepted bool [batch] lists and
      r float32 [batch, vocab], the residual left after the rejections.
    """
    rows = jnp.arange(tokens.shape[0])
    found, chosen, tested, accepted = jnp.zeros(cur.shape, bool), cur, [], []
    q_i, k = q_node, len(allowed)
    for i in range(k):
        c = first + i
        x = tokens[rows, c]
        q_x = jnp.ones(cur.shape) if rule == "topk" else q_i[rows, x]
        testing = allowed[i] & ~found & (q_x > 0)
        ok = testing & (u[:, i] * q_x < r[rows, x])
        rejected = testing & ~ok
        if rule == "topk":
            point = jax.nn.one_hot(x, r.shape[-1], dtype=r.dtype)
            r_next = residual_after_rejection(r, point)
        else:
            r_next = residual_after_rejection(r, q_i)
        r = jnp.where(rejected[:, None], r_next, r)
        if rule == "without_replacement" and i < k - 1:  # q_{i+1}: q_i without x
            removed = q_i * (jnp.arange(q_i.shape[-1]) != x[:, None])
            q_i = jnp.where(rejected[:, None], _normalised(removed, removed), q_i)
        chosen = jnp.where(ok, c, chosen)
        found |= ok
        tested.append(testing)
        accepted.append(ok)
    return chosen, found, tested, accepted, r


def tree_iteration(
    inputs: Array,
    target_cache: Any,
    target_tokens_to_logits: tree_lib.TreeStep,
    draft_cache: Any,
    draft_tokens_to_logits: tree_lib.TreeStep,
    eos_id: int,
    *,
    sampling: SamplingSettings,
    speculation: Speculation,
    decode_rng: Array | None = None,
) -> tuple[loop.LoopState, Any]:
    """The tree loop's initial state and body (`speculative.speculative_sample(tree=...)` runs the
    body until every row is done; `experiments/trees/profile_tree.py` times one body alone).

    The target's exact output distribution, verifying a draft tree per call. One iteration
    per row: the draft expands the tree depth by depth (one call per depth, the frontier's nodes as
    its M rows), the target scores all K nodes in one call, `verify_tree` picks the accepted path,
    the path and the extra token are emitted (cut at EOS and at the row's length limit), and the
    path's cache entries are moved to their positions. Each row has its own path; no shape
    depends on it (one compilation), and nothing leaves the device inside the loop.

    Args:
      inputs: int32 [batch, max_decode_len] (T5X semantics: zeros, or a forced prompt after the
        start slot).
      target_cache, draft_cache: the steps' caches, at least max_decode_len slots each (nodes
        whose slot start + i passes either cache's end are cut, see
        `tree_lib.TreeStep.cache_slots`; give them max_decode_len + K - 1 slots to keep every tree
        whole).
      target_tokens_to_logits, draft_tokens_to_logits: `tree_lib.TreeStep`s.
      eos_id: end-of-sequence id.
      sampling: `sampling.SamplingSettings` (a static temperature).
      speculation: `speculation.Speculation` with a tree (its `tree_rule` None: the default
        'without_replacement'; `max_decode_steps` as `speculative.speculative_sample`'s).
      decode_rng: PRNG key (None: `PRNGKey(0)`); unused in argmax mode.

    Returns:
      (init, body): the `loop.LoopState` before the first iteration (its `done` bool [batch] says
      which rows are finished; `buffer[:, 1 : max_decode_len + 1]` are the decodes, `stats` the
      `tree_lib.TreeStats`) and `body(state) -> state`, one iteration for every row (rows already
      done keep their tokens, length and statistics; their caches past their length may change).

    Raises:
      ValueError: a step without tree support, caches shorter than max_decode_len, or (`loop.check`)
        inputs not 2-D, a bad max_decode_steps, vocabularies of different size, eos_id outside
        the vocabulary.
    """
    shape = speculation.shape
    tree_lib.check_tree_step(target_tokens_to_logits, "target")
    tree_lib.check_tree_step(draft_tokens_to_logits, "draft")
    target = (target_tokens_to_logits, target_cache)
    draft = (draft_tokens_to_logits, draft_cache)
    steps_limit = speculation.max_decode_steps
    batch, max_len = loop.check(inputs, steps_limit, target, draft, eos_id)
    cache_slots = min(
        target_tokens_to_logits.cache_slots(target_cache),
        draft_tokens_to_logits.cache_slots(draft_cache),
    )
    if cache_slots < max_len:
        raise ValueError(
            f"the caches hold {cache_slots} decoder slots; tree speculation needs at least "
            f"max_decode_len={max_len} (max_decode_len + {shape.num_nodes - 1} keeps trees whole)."
        )
    return loop.start(
        _iteration, inputs, steps_limit, shape.max_depth, target, draft, eos_id, decode_rng,
        tree_lib.TreeStats.zeros(batch, shape), cache_slots=cache_slots, shape=shape,
        rule=speculation.tree_rule or "without_replacement", sampling=sampling,
    )  # fmt: skip


def _iteration(
    state: loop.LoopState,
    *,
    target_fn,
    draft_fn,
    eos_id: int,
    limit: Array,
    cache_slots: int,
    shape: tree_lib.TreeShape,
    rule: str,
    sampling: SamplingSettings,
) -> loop.LoopState:
    """One iteration of the tree loop for every row (`tree_iteration`'s body)."""
    greedy, adjust = sampling.greedy, sampling.adjust_logits
    if greedy:
        rng, draft_rng, verify_rng = state.rng, None, None
    else:
        rng, draft_rng, verify_rng = jax.random.split(state.rng, 3)
    n, active = state.length, ~state.done
    start = n - 1  # the root: the last emitted token, at position (and slot) n - 1
    rows = jnp.arange(n.shape[0])
    last = state.buffer[rows, start]

    # 1. Draft: the root's logits (a plain call; rows behind also feed the previous leaf),
    # then one tree call per depth whose frontier nodes are its M rows.
    root_logits, dc = loop.draft_root_logits(draft_fn, state, active)
    tokens, q, dc = expand_tree(
        draft_fn, shape, last, root_logits, start, dc, rule, greedy, adjust, draft_rng
    )
    valid = jnp.arange(shape.num_nodes)[None] < (cache_slots - start)[:, None]  # slot in cache

    # 2. One target call on every node.
    all_nodes = tree_lib.TreeQuery(shape, tuple(range(shape.num_nodes)))
    target_logits, tc = target_fn(tokens, start, state.target_cache, tree=all_nodes)

    # 3. Verification: the accepted path and the extra token.
    if greedy:
        argmax = sampling_lib.first_argmax(target_logits)
        verdict = verify_tree(shape, tokens, valid, rule, target_argmax=argmax)
    else:
        p = jax.nn.softmax(adjust(target_logits), axis=-1)  # [b, K, V]
        verdict = verify_tree(shape, tokens, valid, rule, p=p, q=q, rng=verify_rng)

    # 4. Emit the path's tokens and the extra token; cut at EOS and at the length limit.
    path_tokens = jnp.take_along_axis(tokens, verdict.path[:, 1:], axis=1)  # [b, D]
    out = loop.emit(state, path_tokens, verdict.n_accepted, verdict.extra, eos_id, limit, active)

    # 5. The accepted path's cache entries to positions start..start + a (both caches).
    tc = target_fn.move_slots(tc, start, verdict.path)
    dc = draft_fn.move_slots(dc, start, verdict.path)
    has_children = jnp.asarray(shape.num_children > 0)
    return loop.LoopState(
        buffer=out.buffer,
        length=out.length,
        draft_behind=active & ~has_children[verdict.path[rows, verdict.n_accepted]],  # not fed
        done=state.done | out.ended,
        target_cache=tc,
        draft_cache=dc,
        rng=rng,
        stats=state.stats.add(verdict, valid, out.num_new, active),
    )
