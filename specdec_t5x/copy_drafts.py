"""An aligned source-copy draft (M_q) for tasks whose output mostly repeats the input.

Text correction, simplification and post-editing copy most of the source; the draft that pays
there copies it too. `drafts.SourceCopyDraft` does prompt lookup: at each position it proposes
what followed the *earliest* longest match of the recent output n-gram in the source, so a common
token ("the", ",") sends it back to the start of the source. `AlignedCopyDraft` instead keeps an
alignment: a cursor into the source, the index of the source token it expects next (the
"aggressive decoding" of Ge et al., 2022, arXiv 2205.10350, as a draft for the paper's Algorithm 1).
After each decoder input token t at position p, with cursor c before it:

1. in sync: t == src[c] -> c + 1 (the copy goes on; repeated words never confuse it);
2. else re-align on the last `max_ngram` output tokens (t included): among source positions i
   whose preceding tokens end with them, the longest match wins, then the nearest to c, then the
   one ahead of c; a one-token match must lie within `window` of c, a longer one anywhere.
   Found -> i + 1;
3. else (t is new text, e.g. a substituted word) the draft assumes t replaced src[c]: -> c + 1,
   or, given which tokens start a word (`word_initial`, SentencePiece's "▁" pieces) and t starts
   one, the next source token that starts a word (a misspelt word is often several tokens); at
   most the source's last token (EOS).

The proposal after position p is src[cursor_p]: a point mass (q one-hot), so speculative sampling
stays exact at any temperature (paper §2.3: the proposal x is accepted with probability
min(1, p(x) / q(x)) = p(x), else the residual norm(max(0, p - q)) is p without x). Where the cursor has no source token (an empty source) q is uniform.

Worked example (source "A B X D E </s>", target "A B C D E </s>", one substitution X -> C)::

  fed:      <start>  A      B      C            D      E
  cursor:   0        1      2      3 (rule 3)   4      5
  proposes: A        B      X      D            E      </s>

The draft is a `drafts.Draft` with the same block-step contract as every draft (`steps.BlockStep`):
jittable, fixed shapes, no host sync, one cursor per row. Its cache holds, by absolute decoder
position, the input tokens and the cursor after each, so a rejected draft rolls back for free:
the next call overwrites the stale slots and reads only the cursor at the position before.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from specdec_t5x import drafts, sampling

Array = jax.Array


class AlignedCopyDraft(drafts.Draft):
    """Proposes the source token at an alignment cursor that follows the output (module docstring).

    Args:
      vocab_size: the target's (padded) vocabulary size.
      max_ngram: longest output suffix matched when re-aligning (>= 1).
      window: how far (source tokens) from the cursor a one-token re-alignment may jump (>= 0);
        matches of two or more tokens may jump anywhere.
      prefix_ids: token ids of a task prefix (e.g. `prefix_token_ids('correct:')`): a row whose
        source starts with them starts copying after them, and they are never matched. Empty:
        copy from the first source token.
      word_initial: None, or bool [vocab_size]: which tokens start a word
        (`word_initial_mask`); then rule 3 skips the rest of the replaced source word. Held in
        `params` (an array argument of the jitted loop).

    Raises:
      ValueError: max_ngram < 1, window < 0, a negative prefix id, or word_initial of another
        length than vocab_size.
    """

    def __init__(
        self,
        vocab_size: int,
        max_ngram: int = 3,
        window: int = 8,
        prefix_ids: Sequence[int] = (),
        word_initial=None,
    ):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1; got {max_ngram}.")
        if window < 0:
            raise ValueError(f"window must be >= 0 source tokens; got {window}.")
        prefix_ids = tuple(int(t) for t in prefix_ids)
        if any(t < 0 for t in prefix_ids):
            raise ValueError(f"prefix_ids must be token ids >= 0; got {prefix_ids}.")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.window = window
        self.prefix_ids = prefix_ids
        if word_initial is None:
            self.params = {}
        else:
            word_initial = jnp.asarray(word_initial, bool).reshape(-1)
            if word_initial.shape[0] != vocab_size:
                raise ValueError(
                    f"word_initial must be bool [vocab_size={vocab_size}]; got shape "
                    f"{word_initial.shape}."
                )
            self.params = {"word_initial": word_initial}

    def init_cache(self, params, encoder_input_tokens, max_decode_len, encoded=None):
        """{"tokens", "cursor"}: int32 [batch, max_decode_len] each (decoder inputs and the cursor
        after each, by absolute position)."""
        shape = (encoder_input_tokens.shape[0], max_decode_len)
        return {"tokens": jnp.zeros(shape, jnp.int32), "cursor": jnp.zeros(shape, jnp.int32)}

    def source_start(self, encoder_input_tokens: Array) -> Array:
        """int32 [batch]: where copying starts in each row (after `prefix_ids` when it begins so).

        Args:
          encoder_input_tokens: int32 [batch, src_len], zero-padded.
        """
        n = len(self.prefix_ids)
        batch, src_len = encoder_input_tokens.shape
        if n == 0 or n > src_len:
            return jnp.zeros((batch,), jnp.int32)
        has = jnp.all(encoder_input_tokens[:, :n] == jnp.asarray(self.prefix_ids), axis=1)
        return jnp.where(has, n, 0).astype(jnp.int32)

    def make_step(self, params, encoder_input_tokens):
        """The draft's `steps.BlockStep` for one batch of sources.

        Args:
          params: `self.params` ({} or {"word_initial": bool [vocab]}).
          encoder_input_tokens: int32 [batch, src_len], zero-padded (EOS last).

        Returns:
          step(tokens int32 [batch, k], positions int32 [batch], cache) -> (logits float32
          [batch, k, vocab]: 0 at the proposal and `sampling.NEG_INF` elsewhere, or all 0 where
          there is none, cache). The cursor before the block is read at position positions - 1
          (the source start at position 0); k cursor updates then run in order (`lax.scan`).
        """
        src = encoder_input_tokens  # [b, S]
        batch, src_len = src.shape
        vocab, max_ngram, window = self.vocab_size, self.max_ngram, self.window
        rows = jnp.arange(batch)
        index = jnp.arange(src_len)
        start = self.source_start(src)  # [b]
        copyable = (index >= start[:, None]) & (src > 0)  # [b, S]
        last = jnp.maximum(jnp.max(jnp.where(copyable, index, -1), axis=1), start)  # [b] (EOS)
        word_initial = params.get("word_initial")
        if word_initial is not None:  # the next source token that starts a word (or the last)
            starts = (word_initial[src] & copyable) | (index == last[:, None])
            first = jax.lax.cummin(jnp.where(starts, index, src_len)[:, ::-1], axis=1)[:, ::-1]
            next_word = jnp.pad(first[:, 1:], ((0, 0), (0, 1)), constant_values=src_len)
            next_word = jnp.minimum(next_word, last[:, None])
        # Copyable tokens; others are -3, which no decoder token (>= 0) nor context (-1) equals.
        marked = jnp.where(copyable, src, -3)
        # shifted[m][b, i] = marked[b, i - m] (-2 before the start): the m-th token back from i.
        shifted = [
            jnp.pad(marked, ((0, 0), (m, 0)), constant_values=-2)[:, :src_len]
            for m in range(max_ngram)
        ]
        big = 2 * src_len + 2  # one more matched token outweighs any distance term

        def advance(cursor, token, position, history):
            """The cursor after decoder input `token` at `position` (int32 [b] each)."""
            back = position[:, None] - jnp.arange(max_ngram)  # [b, M]
            ctx = jnp.where(
                back >= 1, history[rows[:, None], jnp.clip(back, 0, history.shape[1] - 1)], -1
            )  # the last M output tokens, newest first; the start slot (0) never matches
            in_sync = (
                (cursor >= start)
                & (cursor <= last)
                & (marked[rows, jnp.clip(cursor, 0, src_len - 1)] == token)
            )
            match = jnp.zeros((batch, src_len), jnp.int32)
            alive = jnp.ones((batch, src_len), bool)
            for m in range(max_ngram):
                alive &= shifted[m] == ctx[:, m : m + 1]
                match += alive
            distance = jnp.abs(index - cursor[:, None])  # [b, S]
            allowed = (match >= 2) | ((match == 1) & (distance <= window))
            score = match * big - 2 * distance - (index < cursor[:, None])
            score = jnp.where(allowed, score, -1)
            best = jnp.argmax(score, axis=1)
            found = jnp.max(score, axis=1) >= 0
            # t replaced src[cursor]: a word-initial t the rest of that source word too.
            c = jnp.clip(jnp.maximum(cursor, start), 0, src_len - 1)
            guess = jnp.minimum(jnp.maximum(cursor, start) + 1, last)
            if word_initial is not None:
                t_initial = word_initial[jnp.clip(token, 0, vocab - 1)]
                guess = jnp.where(t_initial, next_word[rows, c], guess)
            new = jnp.where(in_sync, cursor + 1, jnp.where(found, best + 1, guess))
            return jnp.where(position == 0, start, new).astype(jnp.int32)

        def step(tokens, positions, cache):
            k, max_len = tokens.shape[1], cache["tokens"].shape[1]
            pos = positions[:, None] + jnp.arange(k)  # [b, k]
            history = cache["tokens"].at[rows[:, None], pos].set(tokens, mode="drop")
            prev = cache["cursor"][rows, jnp.clip(positions - 1, 0, max_len - 1)]
            cursor0 = jnp.where(positions >= 1, prev, start)  # [b] cursor before the block

            def one(cursor, column):
                token, position = column
                cursor = advance(cursor, token, position, history)
                return cursor, cursor

            _, cursors = jax.lax.scan(one, cursor0, (tokens.T, pos.T))  # [k, b]
            cursors = cursors.T  # [k, b] -> [b, k]
            cursor_cache = cache["cursor"].at[rows[:, None], pos].set(cursors, mode="drop")
            proposal = src[rows[:, None], jnp.clip(cursors, 0, src_len - 1)]  # [b, k]
            found = (cursors >= start[:, None]) & (cursors <= last[:, None]) & (proposal > 0)
            one_hot = jnp.where(jnp.arange(vocab) == proposal[..., None], 0.0, sampling.NEG_INF)
            logits = jnp.where(found[..., None], one_hot, 0.0)  # [b, k, V]; uniform if none
            return logits, {"tokens": history, "cursor": cursor_cache}

        return step


def prefix_token_ids(prefix: str, vocabulary=None) -> tuple[int, ...]:
    """The token ids of a task prefix as it begins every source (for `AlignedCopyDraft`).

    Args:
      prefix: str, e.g. 'correct:' (surrounding spaces are stripped; SentencePiece splits at
        whitespace first, so the prefix tokenizes alike alone and before the text).
      vocabulary: a `seqio.Vocabulary`; None: the project's (`vocab.get_vocabulary()`).

    Returns:
      tuple of int token ids.

    Raises:
      ValueError: an empty prefix.
    """
    if not prefix.strip():
        raise ValueError(f"prefix must contain a non-space character; got {prefix!r}.")
    if vocabulary is None:
        from specdec_t5x import vocab  # seqio, hence TensorFlow: only when asked

        vocabulary = vocab.get_vocabulary()
    return tuple(int(t) for t in vocabulary.encode(prefix.strip()))


def word_initial_mask(vocab_size: int, vocabulary=None):
    """Which token ids start a word: SentencePiece pieces beginning with "▁" (U+2581).

    Args:
      vocab_size: the model's (padded) vocabulary size; ids beyond the SentencePiece model (extra
        ids, padding) are False.
      vocabulary: a `seqio.SentencePieceVocabulary`; None: the project's.

    Returns:
      numpy bool [vocab_size].

    Raises:
      ValueError: vocab_size smaller than the SentencePiece model.
    """
    import numpy as np

    if vocabulary is None:
        from specdec_t5x import vocab

        vocabulary = vocab.get_vocabulary()
    processor = vocabulary.tokenizer
    pieces = processor.get_piece_size()
    if vocab_size < pieces:
        raise ValueError(f"vocab_size={vocab_size} is below the {pieces} SentencePiece pieces.")
    mask = np.zeros((vocab_size,), bool)
    mask[:pieces] = [processor.id_to_piece(i).startswith("\u2581") for i in range(pieces)]
    return mask
