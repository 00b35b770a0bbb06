"""Drafts (M_q) behind one block-step contract, so any draft pairs with any target.

Every draft exposes `params` (a pytree, passed to jitted code as an argument) and two separate
halves, so a timer can build the cache once and time only the step:

* `init_cache(params, encoder_input_tokens, max_decode_len, encoded=None) -> cache` (the T5
  draft's encoder pass and cache set-up happen here, once per batch; `encoded` is the target's
  encoder output, read by drafts with `shares_target_encoder`);
* `make_step(params, encoder_input_tokens) -> step`, a `steps.BlockStep`::

    step(tokens int32 [batch, k], positions int32 [batch], cache)
        -> (logits float32 [batch, k, vocab], cache)

`prepare(...) -> (cache, step)` is both at once (what `SpeculativeEncoderDecoderModel` calls). Drafts:

* `T5Draft`: a (smaller) T5 network with its own encoder pass and cache, or, with
  `share_target_encoder=True` and a `network.TargetEncoderTransformer`, a draft decoder over the
  target's encoder output (no encoder pass of its own; `with_target_encoder` builds its tree).
* `UnigramDraft` / `BigramDraft`: n-gram language models over the task's training targets
  (the paper's Table 3 baselines), fitted by `fit_ngram_drafts`.
* `SourceCopyDraft`: prompt lookup over the *source* (the token after the longest match of the
  recent output n-gram in the encoder input; one-hot q, or with `branches` the continuations of
  several distinct matches ranked, for token trees). `copy_drafts` has an aligned one.
Exactness never depends on the draft: speculative sampling only needs the q it sampled from.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, network, sampling, steps, tree

Array = jax.Array


class Draft(Protocol):
    """What `SpeculativeEncoderDecoderModel` needs from a draft (drafts here subclass it)."""

    params: Any
    shares_target_encoder: bool = False  # True: decodes from the target's encoder output

    def init_cache(
        self, params, encoder_input_tokens: Array, max_decode_len: int, encoded=None
    ) -> Any:
        """The draft's fresh cache for int32 [batch, enc_len] inputs and L = max_decode_len
        (`encoded`: the target's encoder output, float32 [batch, enc_len, emb]; read only by
        drafts that share the target's encoder)."""
        ...

    def make_step(self, params, encoder_input_tokens: Array) -> steps.BlockStep:
        """The draft's block step over a cache from `init_cache` (same batch)."""
        ...

    def pack_params(self, params):
        """Parameters prepared for repeated decoding (T5 drafts: packed for the CPU kernel, see
        `steps.pack_params`); the default returns them unchanged."""
        return params

    def prepare(self, params, encoder_input_tokens: Array, max_decode_len: int, encoded=None):
        """Returns `(cache, step)`: `init_cache` and `make_step` for this batch."""
        params = self.pack_params(params)  # once, outside the decode loop
        cache = self.init_cache(params, encoder_input_tokens, max_decode_len, encoded)
        return cache, self.make_step(params, encoder_input_tokens)


class T5Draft(Draft):
    """A T5 network as the draft (the paper's T5-small/base/large drafts).

    Args:
      module: the draft `network.Transformer` (its vocab_size must equal the target's).
      params: its parameters.
      share_target_encoder: decode from the target's encoder output instead of encoding the
        source again (`module` must be a `network.TargetEncoderTransformer` whose encoder is the
        target's). Its cache is then the cross-attention K/V of `encoded` plus the self-attention
        slots, and `params` need only the draft's own subtrees (`token_embedder`, `decoder`).

    Raises:
      ValueError: `share_target_encoder` with another module class.
    """

    def __init__(self, module: network.Transformer, params: Any, share_target_encoder=False):
        if share_target_encoder and not isinstance(module, network.TargetEncoderTransformer):
            raise ValueError(
                "share_target_encoder=True needs a network.TargetEncoderTransformer draft; got "
                f"{type(module).__name__}."
            )
        self.module = module
        self.params = params
        self.shares_target_encoder = bool(share_target_encoder)

    def pack_params(self, params):
        return steps.pack_params(self.module, params)

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        """See `Draft.init_cache`.

        Raises:
          ValueError: a draft sharing the target's encoder called without `encoded`.
        """
        if not self.shares_target_encoder:
            return steps.prepare_cache(self.module, params, encoder_input_tokens, max_decode_len)
        if encoded is None:
            raise ValueError(
                "this draft decodes from the target's encoder output: pass encoded (float32 "
                "[batch, enc_len, target emb]; models.SpeculativeEncoderDecoderModel.draft_state "
                "does)."
            )
        params = self.pack_params(params)
        return steps.init_cache(self.module, params, encoded, encoder_input_tokens, max_decode_len)

    def make_step(self, params, encoder_input_tokens):
        return steps.make_block_step(self.module, params, encoder_input_tokens)


def frequent_tokens(log_probs, size: int, always: Iterable[int] = (1,)) -> np.ndarray:
    """The `size` most probable token ids under a unigram (ties: the smaller id), `always` included.

    Args:
      log_probs: float [vocab] unigram log-probabilities (e.g. `UnigramDraft`'s, fitted on the
        task's training targets by `fit_ngram_drafts`).
      size: S, how many ids to return (1 <= S <= vocab).
      always: ids kept whatever their rank (default: EOS = 1); they replace the least frequent.

    Returns:
      int32 [S], sorted ascending.

    Raises:
      ValueError: size outside [1, vocab], or more `always` ids than `size`.
    """
    log_probs = np.asarray(log_probs, np.float64).reshape(-1)
    always = sorted({int(t) for t in always})
    if not 1 <= size <= log_probs.size or len(always) > size:
        raise ValueError(
            f"size must be in [max(1, {len(always)} always-kept ids), vocab={log_probs.size}]; "
            f"got {size}."
        )
    if always and not 0 <= min(always) <= max(always) < log_probs.size:
        raise ValueError(f"always ids must be in [0, {log_probs.size}); got {always}.")
    ranked = [int(t) for t in np.lexsort((np.arange(log_probs.size), -log_probs))]
    keep = set(always)
    for t in ranked:
        if len(keep) >= size:
            break
        keep.add(t)
    return np.asarray(sorted(keep), np.int32)


def ngram_shortlist(
    size: int | None, name: str = "ngram_ende", eos_id: int = 1, path=None
) -> np.ndarray | None:
    """`frequent_tokens` of a shipped n-gram asset's unigram (the task's training targets).

    Args:
      size: S tokens (None: no shortlist); name / path: as in `load_ngram_draft`; eos_id: kept.

    Returns:
      int32 [S] token ids, sorted (None when size is None).

    Raises:
      FileNotFoundError: no such asset. ValueError: see `frequent_tokens`.
    """
    if size is None:
        return None
    log_probs = np.load(_ngram_path(name, path))["unigram_log_probs"]
    return frequent_tokens(log_probs, size, always=(eos_id,))


def shortlist_params(module: network.Transformer, params, token_ids, cpu_weight_dtype=None):
    """A T5 draft's parameters with its logits layer restricted to an output shortlist.

    The draft then computes logits only for `token_ids` (S columns of `decoder/logits_dense`);
    every other token gets logit -inf, so q is zero there and the draft never proposes it. This is
    the frequency-ranked draft vocabulary of FR-Spec (Zhao et al., 2025): the draft's logits
    layer dominates the bytes a small draft step reads (for the embedded En→De draft, 2 of its
    2.3 MiB of bfloat16 panels). Exactness does not depend on it: speculative sampling keeps the
    target's distribution for any q (paper §2.3), and in argmax mode the output is the target's
    greedy output whatever the draft proposes. Only α changes: a target token outside the
    shortlist is never drafted.

    Args:
      module: the draft's `network.Transformer` (its logits layer must be `logits_dense`, i.e.
        `logits_via_embedding=False`).
      params: its parameter tree, raw or packed (`steps.pack_params`); not modified.
      token_ids: int [S] distinct ids in [0, vocab) (e.g. `ngram_shortlist`); None returns
        `params` unchanged.
      cpu_weight_dtype: None (keep the tree as it was: packed again with its panels' dtype when
        `params` was packed, raw otherwise) or 'float32' / 'bfloat16' (pack for the CPU kernel).

    Returns:
      A new tree: `decoder/logits_dense` holds `kernel_shortlist` float32 [K, S] (or its packed
      panels) and `shortlist_index` int32 [vocab] (each token's column, -1 outside).

    Raises:
      ValueError: no `logits_dense` layer, or ids out of range / repeated / empty.
    """
    if token_ids is None:
        return params
    vocab = module.config.vocab_size
    ids = np.asarray(token_ids).reshape(-1)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= vocab or np.unique(ids).size != ids.size:
        raise ValueError(
            f"token_ids must be distinct ids in [0, {vocab}) (at least one); got {ids.size} ids "
            f"in [{ids.min() if ids.size else None}, {ids.max() if ids.size else None}]."
        )
    packed_dtype = cpu_kernel.packed_weight_dtype(params)
    raw = steps.unpack_params(module, params)
    dense = raw.get("decoder", {}).get("logits_dense", {})
    if cpu_kernel.SHORTLIST_INDEX_NAME in dense:
        old = np.asarray(dense[cpu_kernel.SHORTLIST_INDEX_NAME])
        if np.any(old[ids] < 0):
            raise ValueError("token_ids must lie inside the tree's existing shortlist.")
        kernel = jnp.take(dense[cpu_kernel.SHORTLIST_KERNEL_NAME], jnp.asarray(old[ids]), axis=1)
    elif "kernel" in dense:
        kernel = jnp.take(dense["kernel"], jnp.asarray(ids), axis=1)
    else:
        raise ValueError(
            "shortlist_params needs a draft with a decoder/logits_dense layer (T5 v1.1, "
            "logits_via_embedding=False)."
        )
    index = np.full((vocab,), -1, np.int32)
    index[ids] = np.arange(ids.size, dtype=np.int32)
    decoder = dict(raw["decoder"])
    decoder["logits_dense"] = {
        cpu_kernel.SHORTLIST_KERNEL_NAME: kernel,
        cpu_kernel.SHORTLIST_INDEX_NAME: jnp.asarray(index),
    }
    out = {**raw, "decoder": decoder}
    dtype = cpu_weight_dtype or packed_dtype
    return steps.pack_params(module, out, dtype) if dtype else out


# The subtrees a `network.TargetEncoderTransformer` takes from the target: its name -> target's.
TARGET_ENCODER_SUBTREES = {"encoder_token_embedder": "token_embedder", "encoder": "encoder"}


def with_target_encoder(draft_params, target_params):
    """The full parameter tree of a `network.TargetEncoderTransformer` draft: the draft's own
    subtrees (`token_embedder`, `decoder`) and the target's encoder under the draft's names.

    The target's leaves are shared, not copied. Use for training (the encoder frozen:
    `train.train(frozen_params=tuple(TARGET_ENCODER_SUBTREES))`) and for decoding the draft on
    its own; speculative decoding with `T5Draft(share_target_encoder=True)` needs only the draft's
    subtrees (`draft_subtrees`).

    Args:
      draft_params: the draft's tree; any target-encoder subtrees in it are replaced.
      target_params: the target `network.Transformer`'s tree (raw or packed: the encoder and the
        embedding are never packed).

    Raises:
      KeyError: the target tree lacks `token_embedder` or `encoder`.
    """
    missing = [k for k in TARGET_ENCODER_SUBTREES.values() if k not in target_params]
    if missing:
        raise KeyError(f"target parameters lack {missing}; got keys {sorted(target_params)}.")
    out = {k: v for k, v in draft_params.items() if k not in TARGET_ENCODER_SUBTREES}
    out.update({k: target_params[v] for k, v in TARGET_ENCODER_SUBTREES.items()})
    return out


def draft_subtrees(params):
    """`params` without the target-encoder subtrees (what a target-encoder draft ships)."""
    return {k: v for k, v in params.items() if k not in TARGET_ENCODER_SUBTREES}


def _no_cache(batch: int) -> dict[str, Array]:
    # An empty-but-batched leaf keeps T5X-style cache expansion and while-loop carries happy.
    return {"unused": jnp.zeros((batch,), jnp.int32)}


class UnigramDraft(Draft):
    """Context-free draft: q(x) = unigram frequency of x in the training targets.

    Args:
      log_probs: float32 [vocab] log-probabilities (from `fit_ngram_drafts`).
    """

    def __init__(self, log_probs):
        self.params = {"log_probs": jnp.asarray(log_probs, jnp.float32)}

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        return _no_cache(encoder_input_tokens.shape[0])

    def make_step(self, params, encoder_input_tokens):
        def step(tokens, positions, cache):
            del positions
            shape = tokens.shape + params["log_probs"].shape  # [b, k, V]
            return jnp.broadcast_to(params["log_probs"], shape), cache

        return tree.stateless_step(step)  # also a `tree.TreeStep`: no context, nothing to move


class BigramDraft(Draft):
    """q(x | previous token): interpolated bigram over the training targets, stored sparsely.

    For each previous token the `top` most frequent successors keep their bigram probability
    (scaled by λ(prev) = n(prev) / (n(prev) + smoothing)); all remaining mass follows the unigram.
    That is a proper distribution over the whole vocabulary without a [vocab, vocab] table.

    Args:
      successor_ids: int32 [vocab, top] most frequent successors per previous token.
      successor_log_probs: float32 [vocab, top] log q of those successors.
      backoff_log_probs: float32 [2, vocab]: row 0 the unigram log-probs, row 1 the log backoff
        weight of each previous token (1 - λ plus the mass of successors beyond `top`).
    """

    def __init__(self, successor_ids, successor_log_probs, backoff_log_probs):
        self.params = {
            "successor_ids": jnp.asarray(successor_ids, jnp.int32),
            "successor_log_probs": jnp.asarray(successor_log_probs, jnp.float32),
            "backoff_log_probs": jnp.asarray(backoff_log_probs, jnp.float32),
        }

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        return _no_cache(encoder_input_tokens.shape[0])

    def make_step(self, params, encoder_input_tokens):
        unigram, log_backoff = params["backoff_log_probs"]  # [V], [V]

        def step(tokens, positions, cache):
            del positions
            probs = jnp.exp(log_backoff[tokens][..., None] + unigram)  # [b, k, V] backoff share
            ids = params["successor_ids"][tokens]  # [b, k, top]
            succ = jnp.exp(params["successor_log_probs"][tokens])  # [b, k, top]; unused slots 0
            b, k = tokens.shape
            bi = jnp.arange(b)[:, None, None]
            ki = jnp.arange(k)[None, :, None]
            probs = probs.at[bi, ki, ids].add(succ)  # add (not set): duplicate ids stay correct
            return jnp.log(probs), cache

        return tree.stateless_step(step)  # a `tree.TreeStep`: q depends on the token fed only


def fit_ngram_drafts(
    targets: Iterable[Iterable[int]],
    vocab_size: int,
    top: int = 32,
    smoothing: float = 1.0,
    unigram_floor: float = 1e-3,
) -> tuple[UnigramDraft, BigramDraft]:
    """Fits the unigram and bigram drafts on tokenised training targets (paper Table 3).

    Args:
      targets: token id sequences (each typically ending with EOS); the decoder start token 0 is
        prepended as the first bigram context.
      vocab_size: model vocabulary size (the target's padded size).
      top: successors kept per previous token in the bigram.
      smoothing: bigram interpolation constant (λ(prev) = n(prev) / (n(prev) + smoothing)).
      unigram_floor: pseudo-count added to every token in the unigram (full support).

    Returns:
      (UnigramDraft, BigramDraft).

    Raises:
      ValueError: a token id outside [0, vocab_size), or no targets.
    """
    unigram = np.full(vocab_size, unigram_floor, np.float64)
    bigram: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    count = 0
    for seq in targets:
        seq = [int(t) for t in seq]
        if seq and (min(seq) < 0 or max(seq) >= vocab_size):
            raise ValueError(f"token id outside [0, {vocab_size}) in target {seq[:20]}...")
        count += 1
        for prev, nxt in zip([0] + seq[:-1], seq, strict=True):
            unigram[nxt] += 1
            bigram[prev][nxt] += 1
    if not count:
        raise ValueError("fit_ngram_drafts needs at least one target sequence; got none.")
    unigram /= unigram.sum()
    ids = np.zeros((vocab_size, top), np.int32)
    succ = np.full((vocab_size, top), -np.inf, np.float64)
    log_backoff = np.zeros(vocab_size, np.float64)
    for prev, counter in bigram.items():
        total = sum(counter.values())
        lam = total / (total + smoothing)
        log_backoff[prev] = np.log1p(-lam)
        for i, (tok, c) in enumerate(counter.most_common(top)):
            ids[prev, i] = tok
            succ[prev, i] = np.log(lam * c / total)
        # Mass of successors beyond `top` goes to the backoff share too.
        kept = sum(c for _, c in counter.most_common(top))
        log_backoff[prev] = np.log((1 - lam) + lam * (total - kept) / total)
    # Unused successor slots point at token 0 with no extra mass.
    with np.errstate(divide="ignore"):  # unigram_floor=0 leaves unseen tokens at log 0 = -inf
        log_unigram = np.log(unigram)
    backoff = np.stack([log_unigram, log_backoff]).astype(np.float32)
    succ = np.maximum(succ, -1e30).astype(np.float32)
    return UnigramDraft(log_unigram), BigramDraft(ids, succ, backoff)


ASSETS = pathlib.Path(__file__).resolve().parent / "assets" / "models"


def save_ngram_drafts(path, unigram: UnigramDraft, bigram: BigramDraft) -> None:
    """Writes both n-gram drafts to one compressed `.npz` file."""
    arrays = {"unigram_log_probs": unigram.params["log_probs"]}
    arrays.update({f"bigram_{k}": v for k, v in bigram.params.items()})
    np.savez_compressed(path, **{k: np.asarray(v) for k, v in arrays.items()})


def _ngram_path(name: str, path=None) -> pathlib.Path:
    """The `.npz` of an n-gram asset (`ASSETS/<name>/ngram.npz`, or `path`); raises
    FileNotFoundError when it is missing."""
    path = pathlib.Path(path) if path else ASSETS / name / "ngram.npz"
    if not path.exists():
        raise FileNotFoundError(
            f"n-gram draft file {path} not found (scripts/fit_ngram_drafts.py)."
        )
    return path


def load_ngram_draft(kind: str, name: str = "ngram_ende", path=None):
    """Loads a shipped (or saved) n-gram draft.

    Args:
      kind: 'unigram' or 'bigram'.
      name: asset folder under `specdec_t5x/assets/models/` holding `ngram.npz`.
      path: explicit `.npz` path (overrides `name`).

    Raises:
      ValueError: unknown kind. FileNotFoundError: no such file.
    """
    data = np.load(_ngram_path(name, path))
    if kind == "unigram":
        return UnigramDraft(data["unigram_log_probs"])
    if kind == "bigram":
        return BigramDraft(
            data["bigram_successor_ids"],
            data["bigram_successor_log_probs"],
            data["bigram_backoff_log_probs"],
        )
    raise ValueError(f"kind must be 'unigram' or 'bigram'; got {kind!r}.")


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
