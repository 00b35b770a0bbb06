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
min(1, p(x) / q(x)) = p(x), else the residual norm(max(0, p - q)) is p without x). Where the
cursor has no source token (an empty source) q is uniform.

Worked example (source "A B X D E </s>", target "A B C D E </s>", one substitution X -> C)::

  fed:      <start>  A      B      C            D      E
  cursor:   0        1      2      3 (rule 3)   4      5
  proposes: A        B      X      D            E      </s>

Several alignments (`branches` > 1, for token trees): after each position the draft ranks up to
`branches` distinct source tokens, logits 0, -1, -2, ... (the rest `sampling.NEG_INF`), so a tree's
top-k children are the first k. With cursor c after the token and c' before it:

* the token was in sync (it copied src[c']): src[c], then src[c + 1], src[c + 2], ... (source
  tokens the output skips: a doubled word, an added comma, a dropped word);
* it was not (rule 2 or 3 moved the cursor): src[c], then src[c'] (the token was inserted text,
  so the source goes on where it was: a word or a comma the source lost, the second word of a
  swap), then src[c + 1], src[c + 2], ...

A candidate equal to an earlier one takes no rank; positions outside the source are skipped. The
order was measured on 1,500 sentences of ddtp_correct_en's test split, the clean target fed after
the corrupted source: after a token that broke sync the next target token was src[c] 1,971
times, else src[c'] 446 times and src[c + 1] only 153 (none of the three 576), so src[c'] ranks
second there; after an in-sync token src[c + 1] was right 407 times, src[c + 2] 42 (src[c]
32,698). With `branches=1` q is the one-hot above, so chains and every committed result are
unchanged.
Exactness never depends on q: the chain's acceptance test and every tree rule (`tree_decoding`)
keep the target's distribution for any draft distribution, and argmax mode emits the target's
greedy tokens; `branches` changes only which tokens are drafted.

The draft is a `drafts.Draft` whose step is a `tree.TreeStep`: jittable, fixed shapes, no host
sync, one cursor per row. Its cache holds, by slot, the decoder inputs and the cursor after each
(slot = absolute position outside a tree), so a rejected draft rolls back for free: the next call
overwrites the stale slots and reads only the cursor at the position before. In a tree call node
i (slot positions + i) reads its n-gram suffix from itself, its ancestors' slots and then the
committed inputs before the root, and its cursor before it at its parent's slot (the root's at
positions - 1); `move_slots` moves the accepted path's inputs and cursors to their positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

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
      branches: distinct candidate tokens ranked after each position (>= 1; module docstring,
        "Several alignments"); 1: q one-hot on src[cursor] (the chain draft).

    Raises:
      ValueError: max_ngram < 1, window < 0, a negative prefix id, word_initial of another
        length than vocab_size, or branches < 1.
    """

    def __init__(
        self,
        vocab_size: int,
        max_ngram: int = 3,
        window: int = 8,
        prefix_ids: Sequence[int] = (),
        word_initial=None,
        branches: int = 1,
    ):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1; got {max_ngram}.")
        if window < 0:
            raise ValueError(f"window must be >= 0 source tokens; got {window}.")
        prefix_ids = tuple(int(t) for t in prefix_ids)
        if any(t < 0 for t in prefix_ids):
            raise ValueError(f"prefix_ids must be token ids >= 0; got {prefix_ids}.")
        if not isinstance(branches, int | np.integer) or branches < 1:
            raise ValueError(f"branches must be an int >= 1 (ranked candidates); got {branches!r}.")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.window = window
        self.branches = int(branches)
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
        """The draft's `tree.TreeStep` for one batch of sources.

        Args:
          params: `self.params` ({} or {"word_initial": bool [vocab]}).
          encoder_input_tokens: int32 [batch, src_len], zero-padded (EOS last).

        Returns:
          step(tokens int32 [batch, k], positions int32 [batch], cache, tree=None) -> (logits
          float32 [batch, k, vocab], cache), with `move_slots` and `cache_slots`. Logits: with
          branches=1, 0 at the proposal and `sampling.NEG_INF` elsewhere, or all 0 where there
          is none; with more, the ranked candidates (module docstring). A block call (tree=None)
          reads the cursor before the block at position positions - 1 (the source start at
          position 0) and runs its k cursor updates in order (`lax.scan`); a tree call reads each
          node's cursor before it at its parent's slot (the root's as a block call's) and updates
          the call's nodes level by level (parents before children when both are in the call).
        """
        src = encoder_input_tokens  # [b, S]
        batch, src_len = src.shape
        vocab, max_ngram, window = self.vocab_size, self.max_ngram, self.window
        branches = self.branches
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
            jnp.pad(marked, ((0, 0), (m, 0)), constant_values=-2)[:, :src_len, None]
            for m in range(max_ngram)
        ]  # [b, S, 1] each
        big = 2 * src_len + 2  # one more matched token outweighs any distance term

        def at(table, i):
            """table[b, i[b, n]] for a [b, S] table and int32 [b, n] indices (clipped)."""
            return jnp.take_along_axis(table, jnp.clip(i, 0, src_len - 1), axis=1)

        def advance(cursor, token, position, ctx):
            """The cursor after decoder input `token` at `position` (int32 [b, n] each), given its
            last M inputs ctx int32 [b, n, M] (newest first, -1 before position 1), and whether
            the token was in sync (bool [b, n])."""
            in_sync = (cursor >= start[:, None]) & (cursor <= last[:, None])
            in_sync &= at(marked, cursor) == token
            match = jnp.zeros((batch, src_len, cursor.shape[1]), jnp.int32)  # [b, S, n]
            alive = jnp.ones((batch, src_len, cursor.shape[1]), bool)
            for m in range(max_ngram):
                alive &= shifted[m] == ctx[:, None, :, m]
                match += alive
            distance = jnp.abs(index[None, :, None] - cursor[:, None, :])  # [b, S, n]
            allowed = (match >= 2) | ((match == 1) & (distance <= window))
            score = match * big - 2 * distance - (index[None, :, None] < cursor[:, None, :])
            score = jnp.where(allowed, score, -1)
            best = jnp.argmax(score, axis=1)  # [b, n]
            found = jnp.max(score, axis=1) >= 0
            # t replaced src[cursor]: a word-initial t the rest of that source word too.
            c = jnp.maximum(cursor, start[:, None])
            guess = jnp.minimum(c + 1, last[:, None])
            if word_initial is not None:
                t_initial = word_initial[jnp.clip(token, 0, vocab - 1)]
                guess = jnp.where(t_initial, at(next_word, c), guess)
            new = jnp.where(in_sync, cursor + 1, jnp.where(found, best + 1, guess))
            return jnp.where(position == 0, start[:, None], new).astype(jnp.int32), in_sync

        def proposal_logits(cursors, before, in_sync):
            """float32 [b, k, V] after nodes with cursors, cursors before them and sync flags
            (int32, int32, bool [b, k])."""
            if branches == 1:
                proposal = at(src, cursors)  # [b, k]
                found = (cursors >= start[:, None]) & (cursors <= last[:, None]) & (proposal > 0)
                one_hot = jnp.where(jnp.arange(vocab) == proposal[..., None], 0.0, sampling.NEG_INF)
                return jnp.where(found[..., None], one_hot, 0.0)  # [b, k, V]; uniform if none
            # src[c]; in sync: src[c + 1], src[c + 2], ...; else src[before], src[c + 1], ...
            ahead = [cursors + j for j in range(branches)]
            if branches >= 2:
                second = jnp.where(in_sync, ahead[1], before)
                ahead = [ahead[0], second, jnp.where(in_sync, -1, ahead[1]), *ahead[2:]]
            where = jnp.stack(ahead, axis=-1)  # [b, k, C]
            flat = where.reshape(batch, -1)
            candidates = at(src, flat).reshape(where.shape)
            valid = (where >= start[:, None, None]) & (where <= last[:, None, None])
            valid &= candidates > 0
            return drafts.ranked_logits(candidates, valid, vocab, branches)

        def step(tokens, positions, cache, tree=None):
            k, max_len = tokens.shape[1], cache["tokens"].shape[1]
            nodes, depth, offsets = drafts.context_offsets(tree, k, max_ngram)
            slots = positions[:, None] + jnp.asarray(nodes)  # [b, k]
            pos = positions[:, None] + jnp.asarray(depth)  # [b, k]
            history = cache["tokens"].at[rows[:, None], slots].set(tokens, mode="drop")
            ctx = drafts.suffix_context(history, positions, depth, offsets)  # [b, k, M]
            prev = cache["cursor"][rows, jnp.clip(positions - 1, 0, max_len - 1)]
            cursor0 = jnp.where(positions >= 1, prev, start)  # [b] cursor before the root
            if tree is None:

                def one(cursor, column):
                    token, position, context = column
                    new, sync = advance(
                        cursor[:, None], token[:, None], position[:, None], context[:, None]
                    )
                    return new[:, 0], (new[:, 0], sync[:, 0], cursor)

                columns = (tokens.T, pos.T, jnp.moveaxis(ctx, 1, 0))
                _, (cursors, in_sync, before) = jax.lax.scan(one, cursor0, columns)  # [k, b]
                cursors, in_sync, before = cursors.T, in_sync.T, before.T  # [k, b] -> [b, k]
            else:
                cursors, in_sync, before = _tree_cursors(
                    advance, tree, nodes, tokens, pos, ctx, cache["cursor"], positions, cursor0
                )
            cursor_cache = cache["cursor"].at[rows[:, None], slots].set(cursors, mode="drop")
            logits = proposal_logits(cursors, before, in_sync)
            return logits, {"tokens": history, "cursor": cursor_cache}

        step.move_slots = drafts.move_position_slots
        step.cache_slots = lambda cache: cache["tokens"].shape[1]
        return step


def _tree_cursors(advance, query, nodes, tokens, pos, ctx, cursor_cache, positions, cursor0):
    """Cursors after the nodes of a tree call, level by level.

    A node's cursor before it is its parent's: from this call (a node earlier in the level order)
    or from the cache (slot positions + parent, written by an earlier call of the iteration); the
    root's is `cursor0`. Nodes whose parents are all known run as one vectorised `advance`.

    Args:
      advance: the step's cursor update; query: the `tree.TreeQuery`; nodes: int32 [m] (static).
      tokens, pos: int32 [b, m]; ctx: int32 [b, m, M]; cursor_cache: int32 [b, L];
      positions, cursor0: int32 [b].

    Returns:
      cursors, in_sync, before: int32, bool, int32 [b, m] (after, in sync, before each node).
    """
    parent = query.shape.parent[nodes]  # static
    where_in_call = {int(node): j for j, node in enumerate(nodes)}
    level = np.zeros(len(nodes), int)  # ancestors inside this call
    for j in np.argsort(nodes, kind="stable"):  # breadth first: parents first
        p = int(parent[j])
        level[j] = level[where_in_call[p]] + 1 if p in where_in_call else 0
    batch, max_len = cursor_cache.shape
    rows = jnp.arange(batch)[:, None]
    outside = jnp.clip(positions[:, None] + jnp.asarray(np.maximum(parent, 0)), 0, max_len - 1)
    before = jnp.where(
        jnp.asarray(parent >= 0)[None], cursor_cache[rows, outside], cursor0[:, None]
    )  # [b, m] from the cache or the root's
    cursors = jnp.zeros_like(tokens)
    in_sync = jnp.zeros(tokens.shape, bool)
    for lv in range(int(level.max()) + 1):
        group = np.flatnonzero(level == lv)
        if lv > 0:
            from_call = np.asarray([where_in_call[int(parent[j])] for j in group])
            before = before.at[:, group].set(cursors[:, from_call])
        new, sync = advance(before[:, group], tokens[:, group], pos[:, group], ctx[:, group])
        cursors = cursors.at[:, group].set(new)
        in_sync = in_sync.at[:, group].set(sync)
    return cursors, in_sync, before


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
