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

Modules: the contract `Draft` is in `draft_base`, the n-gram drafts (and the shortlist drawn from
their unigram) in `ngram_drafts`, prompt lookup and its slot-indexed cache helpers in
`source_copy_draft`; this module holds `T5Draft` with its shortlist and target-encoder trees, and
every public name of the others is importable from here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, network, steps
from specdec_t5x.draft_base import Draft
from specdec_t5x.ngram_drafts import (
    ASSETS,
    BigramDraft,
    UnigramDraft,
    fit_ngram_drafts,
    frequent_tokens,
    load_ngram_draft,
    ngram_shortlist,
    save_ngram_drafts,
)
from specdec_t5x.source_copy_draft import (
    SourceCopyDraft,
    context_offsets,
    move_position_slots,
    ranked_logits,
    suffix_context,
)

__all__ = [  # this module's and, re-exported, `draft_base`'s, `ngram_drafts`' and `source_copy_draft`'s
    "ASSETS",
    "TARGET_ENCODER_SUBTREES",
    "BigramDraft",
    "Draft",
    "SourceCopyDraft",
    "T5Draft",
    "UnigramDraft",
    "context_offsets",
    "draft_subtrees",
    "fit_ngram_drafts",
    "frequent_tokens",
    "load_ngram_draft",
    "move_position_slots",
    "ngram_shortlist",
    "ranked_logits",
    "save_ngram_drafts",
    "shortlist_params",
    "suffix_context",
    "with_target_encoder",
]

Array = jax.Array


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
