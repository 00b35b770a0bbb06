"""Prompt lookup over the source (`SourceCopyDraft`) and the slot-indexed cache helpers it
shares with `copy_drafts`: where each fed token's n-gram suffix lies in a block or tree call
(`context_offsets`, `suffix_context`), moving an accepted tree path's slots
(`move_position_slots`) and ranking several candidate continuations as logits
(`ranked_logits`). `drafts` re-exports every public name here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import sampling, tree
from specdec_t5x.draft_base import Draft

Array = jax.Array


def context_offsets(query: tree.TreeQuery | None, k: int, max_ngram: int):
    """Where each fed token's n-gram suffix lies, for drafts whose cache is indexed by slot.

    Token j of a call has position positions + depth[j]; the m-th token back from it (m = 0: the
    token itself) is read at cache slot positions + offsets[j, m]: in a chain (query None) slot =
    position, so offsets[j, m] = j - m; in a tree call (`tree.TreeQuery`) the first depth[j] + 1
    tokens back are the node and its ancestors (their node indices), the older ones the committed
    history before the root (offsets d - m < 0, slot = position there).

    Args:
      query: None (a block call of k consecutive tokens) or the call's `tree.TreeQuery`.
      k: tokens in the call (m = len(query.nodes) for a tree call).
      max_ngram: M, suffix length.

    Returns:
      (nodes, depth, offsets): NumPy int32 [k] (node index of each token, its slot offset),
      int32 [k] and int32 [k, M], all static.
    """
    back = np.arange(max_ngram)
    if query is None:
        nodes = np.arange(k, dtype=np.int32)
        return nodes, nodes, (nodes[:, None] - back[None]).astype(np.int32)
    shape, nodes = query.shape, np.asarray(query.nodes, np.int32)
    depth = shape.depth[nodes]
    offsets = np.zeros((nodes.size, max_ngram), np.int32)
    for j, (node, d) in enumerate(zip(nodes, depth, strict=True)):
        for m in range(max_ngram):
            offsets[j, m] = node if m <= d else d - m
            node = shape.parent[node] if m < d else node
    return nodes, depth.astype(np.int32), offsets


def suffix_context(history: Array, positions: Array, depth, offsets) -> Array:
    """The last M decoder inputs of each fed token, newest first (`context_offsets`' layout).

    Args:
      history: int32 [batch, L] decoder inputs by slot (this call's tokens already written).
      positions: int32 [batch] the call's first position (a tree call: the root's).
      depth, offsets: from `context_offsets` (static int32 [k], [k, M]).

    Returns:
      int32 [batch, k, M]: token m back from token j, or -1 before position 1 (the start token at
      position 0 is never matched).
    """
    max_len = history.shape[1]
    rows = jnp.arange(history.shape[0])[:, None, None]
    slots = positions[:, None, None] + jnp.asarray(offsets)[None]  # [b, k, M]
    back = (
        positions[:, None, None] + jnp.asarray(depth)[None, :, None] - jnp.arange(offsets.shape[1])
    )
    return jnp.where(back >= 1, history[rows, jnp.clip(slots, 0, max_len - 1)], -1)


def move_position_slots(cache, start: Array, path: Array):
    """`tree.TreeStep.move_slots` for a cache of int32 [batch, L] leaves indexed by slot: slot
    start + path[:, d] to slot start + d for each leaf (reads before writes; past L dropped).

    Args:
      cache: dict of int32 [batch, L] arrays (copy drafts: decoder inputs, cursors).
      start: int32 [batch] the tree root's slot; path: int32 [batch, D + 1] node indices.
    """
    start, path = jnp.asarray(start, jnp.int32), jnp.asarray(path, jnp.int32)

    def move(leaf):
        rows = jnp.arange(leaf.shape[0])[:, None]
        src = jnp.clip(start[:, None] + path, 0, leaf.shape[1] - 1)  # [b, D + 1]
        dst = start[:, None] + jnp.arange(path.shape[1])
        return leaf.at[rows, dst].set(leaf[rows, src], mode="drop")

    return jax.tree_util.tree_map(move, cache)


def ranked_logits(candidates: Array, valid: Array, vocab: int, branches: int) -> Array:
    """Logits ranking up to `branches` distinct candidate tokens: 0, -1, -2, ... in order, the
    rest `sampling.NEG_INF`; all 0 (uniform) where no candidate is valid.

    A candidate equal to an earlier valid one is dropped (it takes no rank), so a tree's top-k
    children are the first k distinct candidates.

    Args:
      candidates: int32 [..., C] token ids in preference order; valid: bool [..., C].
      vocab: V; branches: most candidates kept (>= 1).

    Returns:
      float32 [..., V].
    """
    num = candidates.shape[-1]
    keep = []
    for c in range(num):
        dup = jnp.zeros(valid.shape[:-1], bool)
        for e in range(c):
            dup |= keep[e] & (candidates[..., e] == candidates[..., c])
        keep.append(valid[..., c] & ~dup)
    keep = jnp.stack(keep, axis=-1)  # [..., C]
    rank = jnp.cumsum(keep, axis=-1) - 1
    keep &= rank < branches
    lead = candidates.shape[:-1]
    base = jnp.where(jnp.any(keep, axis=-1), sampling.NEG_INF, 0.0).reshape(-1, 1)  # [N, 1]
    logits = jnp.broadcast_to(base, (base.shape[0], vocab)).astype(jnp.float32)  # [N, V]
    ids = jnp.where(keep, candidates, vocab).reshape(-1, num)  # vocab: dropped
    values = (-rank).astype(jnp.float32).reshape(-1, num)
    logits = logits.at[jnp.arange(ids.shape[0])[:, None], ids].set(values, mode="drop")
    return logits.reshape(lead + (vocab,))


class SourceCopyDraft(Draft):
    """Prompt lookup over the encoder input: copy what followed the recent output n-gram.

    At each position the draft takes the last `max_ngram` decoder tokens, finds the source
    position whose preceding tokens match the longest suffix of them (ties: earliest), and
    proposes the source token after the match with q one-hot. With no match it proposes
    uniformly (q uniform), which the acceptance test handles like any other draft.

    Token trees (`tree.TreeStep`): in a tree call each node's suffix is the node's token, then its
    ancestors' tokens, then the committed decoder inputs before the root; the cache holds the
    inputs by slot and `move_slots` moves the accepted path's to their positions.

    With `branches` > 1 the logits rank the continuations of up to `branches` distinct matches:
    the source positions are ordered by matched length (longest first), then position
    (earliest first), and each is taken unless its continuation token is already ranked; ranks
    get logits 0, -1, -2, ..., the rest `sampling.NEG_INF` (so a tree's top-k children are the
    first k). Exactness never depends on q: speculative sampling and every tree rule keep the
    target's distribution for any draft distribution (paper §2.3; `tree_decoding`), and argmax
    mode emits the target's greedy tokens; `branches` changes only which tokens are drafted.

    Args:
      vocab_size: the target's (padded) vocabulary size.
      max_ngram: longest suffix matched (>= 1).
      branches: distinct continuations ranked (>= 1); 1: q one-hot, exactly the chain draft.

    Raises:
      ValueError: max_ngram < 1 or branches < 1.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, branches: int = 1):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1; got {max_ngram}.")
        if not isinstance(branches, int | np.integer) or branches < 1:
            raise ValueError(f"branches must be an int >= 1 (ranked candidates); got {branches!r}.")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.branches = int(branches)
        self.params = {}

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        """{"tokens": int32 [batch, max_decode_len]}: the decoder inputs by slot."""
        return {"tokens": jnp.zeros((encoder_input_tokens.shape[0], max_decode_len), jnp.int32)}

    def make_step(self, params, encoder_input_tokens):
        """The draft's `tree.TreeStep` for one batch of sources.

        Args:
          params: {} (unused).
          encoder_input_tokens: int32 [batch, src_len], zero-padded.

        Returns:
          step(tokens int32 [batch, k], positions int32 [batch], cache, tree=None) -> (logits
          float32 [batch, k, vocab], cache), with `move_slots` and `cache_slots`.
        """
        del params
        src = encoder_input_tokens  # [b, S]
        batch, src_len = src.shape
        vocab, max_ngram, branches = self.vocab_size, self.max_ngram, self.branches
        nxt = jnp.pad(src, ((0, 0), (0, 1)))[:, 1:]  # src[i + 1]

        def lookup_logits(ctx):
            """float32 [b, k, V] from the suffixes ctx int32 [b, k, M] (newest first)."""
            k = ctx.shape[1]
            rows = jnp.arange(batch)[:, None]
            # match[b, k, i] = length of the common suffix of ctx and src[..i].
            match = jnp.zeros((batch, k, src_len), jnp.int32)
            alive = jnp.ones((batch, k, src_len), bool)
            for m in range(max_ngram):
                shifted = jnp.pad(src, ((0, 0), (m, 0)), constant_values=-2)[:, :src_len]
                alive &= (shifted[:, None, :] == ctx[:, :, m : m + 1]) & (shifted[:, None, :] > 0)
                match += alive
            match = jnp.where((nxt > 0)[:, None, :], match, 0)
            if branches == 1:
                best = jnp.argmax(match, axis=-1)  # earliest longest match
                found = jnp.max(match, axis=-1) > 0
                proposal = nxt[rows, best]  # [b, k]
                one_hot = jnp.where(
                    jnp.arange(vocab) == proposal[..., None], 0.0, sampling.NEG_INF
                )  # [b, k, V]
                return jnp.where(found[..., None], one_hot, 0.0)
            # Longest first, then earliest; each pick removes the positions continuing alike.
            score = jnp.where(
                match > 0, match * (src_len + 1) + (src_len - jnp.arange(src_len)), -1
            )
            picks, oks = [], []
            for _ in range(branches):
                best = jnp.argmax(score, axis=-1)  # [b, k]
                picks.append(nxt[rows, best])
                oks.append(jnp.max(score, axis=-1) >= 0)
                score = jnp.where(nxt[:, None, :] == picks[-1][..., None], -1, score)
            candidates, valid = jnp.stack(picks, -1), jnp.stack(oks, -1)  # [b, k, branches]
            return ranked_logits(candidates, valid, vocab, branches)

        def step(tokens, positions, cache, tree=None):
            k = tokens.shape[1]
            nodes, depth, offsets = context_offsets(tree, k, max_ngram)
            slots = positions[:, None] + jnp.asarray(nodes)  # [b, k]
            rows = jnp.arange(batch)[:, None]
            history = cache["tokens"].at[rows, slots].set(tokens, mode="drop")
            ctx = suffix_context(history, positions, depth, offsets)  # [b, k, M]
            return lookup_logits(ctx), {"tokens": history}

        step.move_slots = move_position_slots
        step.cache_slots = lambda cache: cache["tokens"].shape[1]
        return step
