"""N-gram drafts (the paper's Table 3 baselines) and the output shortlist of an n-gram asset.

`UnigramDraft` / `BigramDraft` are language models over the task's training targets, fitted by
`fit_ngram_drafts`, saved with `save_ngram_drafts` and shipped under `assets/models/<name>/`
(`load_ngram_draft`); `frequent_tokens` / `ngram_shortlist` pick a T5 draft's output shortlist
from such a unigram (`drafts.shortlist_params`). `drafts` re-exports every public name here.
"""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import tree
from specdec_t5x.draft_base import Draft

Array = jax.Array


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
