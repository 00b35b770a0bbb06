"""The aligned source-copy draft: hand-made alignments, a reference of its rules under block calls
and rollback, greedy identity on a tiny random T5, and the exact distribution at T > 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs
from test_speculative import chi_square_pvalue, exact_sequence_probs, toy_cache, toy_step

from specdec_t5x import copy_drafts, drafts, models, speculative

VOCAB = 32
EOS = 1
# Word-like token ids for the hand-made cases.
A, B, C, D, E, X, THE, CAT, SAW, DOG, AND, BIRD, Z = range(3, 16)


def proposals(draft, source, output, block=1):
    """The draft's proposal after each decoder input: start token, then `output` (None where q is
    uniform), feeding `block` tokens per call."""
    enc = jnp.asarray([list(source)], jnp.int32)
    fed = [0, *output]
    cache, step = draft.prepare(draft.params, enc, len(fed) + block)
    step = jax.jit(step)
    out = []
    for start in range(0, len(fed), block):
        chunk = fed[start : start + block]
        logits, cache = step(jnp.asarray([chunk], jnp.int32), jnp.asarray([start]), cache)
        for row in np.asarray(logits[0]):
            out.append(int(np.argmax(row)) if np.any(row != 0) else None)
    return out


def aligned(**kwargs):
    return copy_drafts.AlignedCopyDraft(VOCAB, **kwargs)


def test_in_sync_copy_and_substitution():
    source, target = [A, B, X, D, E, EOS], [A, B, C, D, E, EOS]
    got = proposals(aligned(), source, target)
    # After <start>, A, B, C, D, E: the module docstring's worked example.
    assert got[:6] == [A, B, X, D, E, EOS]
    assert got[:6] == proposals(aligned(), source, target, block=3)[:6]  # blocks change nothing


def test_insertion_and_deletion_realign():
    # Insertion (the output adds C): the draft guesses a substitution, then finds D one back.
    assert proposals(aligned(), [A, B, D, E, EOS], [A, B, C, D, E])[:6] == [A, B, D, E, E, EOS]
    # Deletion of a doubled word (source "A B B C D"): C is found after B B (a 2-token match).
    assert proposals(aligned(), [A, B, B, C, D, EOS], [A, B, C, D])[:5] == [A, B, B, D, EOS]
    # Deletion of a word (source "A B X C D"): C is one ahead of the cursor.
    assert proposals(aligned(), [A, B, X, C, D, EOS], [A, B, C, D])[:5] == [A, B, X, D, EOS]
    # A one-token match beyond the window is not taken; a two-token one is.
    far = [A, B, X, X, X, X, C, D, EOS]
    assert proposals(aligned(window=2), far, [A, B, C])[3] == X  # guess: one step on
    assert proposals(aligned(window=8), far, [A, B, C])[3] == D
    # window=0: "A | D" (one token, 6 away) is refused, "D E" (two tokens) is taken.
    far = [A, B, C, X, X, X, X, D, E, EOS]
    assert proposals(aligned(window=0), far, [A, D, E]) == [A, B, C, EOS]


def test_new_word_skips_the_rest_of_the_replaced_source_word():
    # Source "A Bb1 b2 C </s>" (B misspelt into two tokens, b2 continues a word), target "A Z C":
    # after Z (new, word-initial) the draft skips to C, the next word-starting source token.
    word_initial = np.ones(VOCAB, bool)
    word_initial[D] = False  # D plays b2
    source, target = [A, B, D, C, EOS], [A, Z, C, EOS]
    assert proposals(aligned(word_initial=word_initial), source, target)[:4] == [A, B, C, EOS]
    assert proposals(aligned(), source, target)[:3] == [A, B, D]  # one token on without it
    # A new token that continues a word moves one token on, as without the mask.
    word_initial[Z] = False
    assert proposals(aligned(word_initial=word_initial), source, target)[2] == D


def test_repeated_words_follow_the_alignment_not_the_first_match():
    source = [THE, CAT, SAW, THE, DOG, AND, THE, BIRD, EOS]
    got = proposals(aligned(), source, source)
    assert got[:9] == [*source]  # every proposal right: α would be 1
    # Prompt lookup on one token sends every "the" back to the first one ("cat").
    lookup = proposals(drafts.SourceCopyDraft(VOCAB, max_ngram=1), source, source)
    assert lookup[4] == CAT and lookup[7] == CAT
    # An insertion next to a repeat: "the dog" -> "the X dog". After X (new text) the draft
    # guesses a substitution (AND, wrong), finds DOG one back, and the later "the" still
    # continues with "bird", not "cat".
    edited = [THE, CAT, SAW, THE, X, DOG, AND, THE, BIRD, EOS]
    got = proposals(aligned(), source, edited)
    assert got[:10] == [THE, CAT, SAW, THE, DOG, AND, AND, THE, BIRD, EOS]


def test_prefix_is_skipped_and_rows_align_independently():
    prefix = (20, 21)
    rows = [[20, 21, A, B, C, EOS, 0, 0], [A, B, A, C, EOS, 0, 0, 0]]
    draft = aligned(prefix_ids=prefix)
    np.testing.assert_array_equal(draft.source_start(jnp.asarray(rows)), [2, 0])
    enc = jnp.asarray(rows, jnp.int32)
    cache, step = draft.prepare(draft.params, enc, 8)
    step = jax.jit(step)
    fed = jnp.asarray([[0, A, B, C], [0, A, B, A]], jnp.int32)
    logits, cache = step(fed, jnp.zeros((2,), jnp.int32), cache)
    np.testing.assert_array_equal(np.argmax(logits, -1), [[A, B, C, EOS], [A, B, A, C]])
    assert proposals(aligned(), rows[0], [A])[0] == 20  # without prefix_ids: the prefix is copied
    # Rollback: rewrite position 3 of row 1 with C (not in sync: B A -> C is the guess)
    logits, _ = step(jnp.asarray([[C], [C]]), jnp.asarray([3, 3]), cache)
    assert int(np.argmax(logits[0, 0])) == EOS  # row 0: C at its place, then EOS
    assert int(np.argmax(logits[1, 0])) == EOS  # row 1: C found at index 3 -> EOS


def test_uniform_without_a_source_and_bad_arguments():
    assert proposals(aligned(), [0, 0, 0], [A, B]) == [None, None, None]
    with pytest.raises(ValueError, match="max_ngram"):
        aligned(max_ngram=0)
    with pytest.raises(ValueError, match="window"):
        aligned(window=-1)
    with pytest.raises(ValueError, match="prefix_ids"):
        aligned(prefix_ids=(-1,))
    with pytest.raises(ValueError, match="prefix"):
        copy_drafts.prefix_token_ids("  ")
    with pytest.raises(ValueError, match=r"word_initial must be bool \[vocab_size=32\]"):
        aligned(word_initial=np.ones(31, bool))


def test_vocabulary_helpers_prefix_ids_and_word_initial_mask():
    from specdec_t5x import tasks, vocab

    vocabulary = vocab.get_vocabulary()
    ids = copy_drafts.prefix_token_ids(tasks.CORRECT_PREFIX)
    assert ids and list(ids) == vocabulary.encode(tasks.CORRECT_PREFIX + "The cat sat.")[: len(ids)]
    size = vocab.model_vocab_size(vocabulary)
    mask = copy_drafts.word_initial_mask(size)
    assert mask.shape == (size,) and mask.dtype == bool
    tokens = vocabulary.encode("frobnicates widgets")
    pieces = [vocabulary.tokenizer.id_to_piece(t) for t in tokens]
    assert [bool(mask[t]) for t in tokens] == [p.startswith("\u2581") for p in pieces]
    assert mask[tokens[0]] and not mask[vocabulary.eos_id] and not mask[size - 1]
    with pytest.raises(ValueError, match="below"):
        copy_drafts.word_initial_mask(100)


# ---------------------------------------------------------------------------------------------
# The rules, written plainly, against the jitted step under per-row block calls and rollback.


def reference_cursors(source, fed, start, max_ngram, window, word_initial=None):
    """Cursor after each decoder input in `fed` (fed[0] = start token), by the docstring's rules."""
    copyable = [i >= start and t > 0 for i, t in enumerate(source)]
    last = max([i for i in range(len(source)) if copyable[i]], default=start)
    last = max(last, start)
    cursors, c = [], start
    for p, t in enumerate(fed):
        if p == 0:
            c = start
        elif start <= c < len(source) and copyable[c] and source[c] == t:
            c += 1
        else:
            ctx = [fed[p - m] if p - m >= 1 else None for m in range(max_ngram)]
            best = None
            for i in range(len(source)):
                m = 0
                while m < max_ngram and i - m >= 0 and copyable[i - m] and source[i - m] == ctx[m]:
                    m += 1
                if m == 0 or (m == 1 and abs(i - c) > window):
                    continue
                key = (m, -abs(i - c), i >= c)
                if best is None or key > best[0]:
                    best = (key, i)
            if best:
                c = best[1] + 1
            elif word_initial is not None and word_initial[t]:  # next word start after c
                after = [
                    j
                    for j in range(max(c, start) + 1, last + 1)
                    if j == last or (copyable[j] and word_initial[source[j]])
                ]
                c = min(after[0] if after else last, last)
            else:
                c = min(max(c, start) + 1, last)
        cursors.append(c)
    return cursors


def reference_proposal(source, cursor, start):
    ok = start <= cursor < len(source) and source[cursor] > 0
    return source[cursor] if ok else None


def test_step_matches_the_rules_under_blocks_and_rollback():
    rng = np.random.RandomState(0)
    batch, src_len, out_len, prefix = 6, 12, 14, (30, 31)
    word_initial = rng.rand(VOCAB) < 0.6
    draft = aligned(max_ngram=3, window=3, prefix_ids=prefix, word_initial=word_initial)
    sources, outputs = [], []
    for b in range(batch):
        n = rng.randint(2, src_len - 2)
        words = list(rng.randint(3, 8, n))  # few distinct ids: many repeats
        source = ([*prefix] if b % 2 == 0 else []) + words + [EOS]
        source = (source + [0] * src_len)[:src_len]
        output = [w for w in words if rng.rand() > 0.15]  # drops
        output = [w if rng.rand() > 0.15 else int(rng.randint(3, 10)) for w in output]  # edits
        for _ in range(rng.randint(0, 3)):  # insertions
            output.insert(rng.randint(0, len(output) + 1), int(rng.randint(3, 10)))
        sources.append(source)
        outputs.append(([0] + output + [EOS] + [0] * out_len)[: out_len + 1])
    enc = jnp.asarray(sources, jnp.int32)
    cache, step = draft.prepare(draft.params, enc, out_len + 8)
    step = jax.jit(step)
    starts = np.asarray(draft.source_start(enc))
    got = np.full((batch, out_len + 1), -1)
    n = np.zeros(batch, int)
    while np.any(n < out_len):
        k = int(rng.randint(1, 4))
        tokens = np.zeros((batch, k), int)
        accept = rng.randint(1, k + 1, batch)
        for b in range(batch):
            for j in range(k):
                p = n[b] + j
                true = outputs[b][p] if p <= out_len else 0
                tokens[b, j] = true if j < accept[b] else rng.randint(3, 10)  # garbage: rejected
        logits, cache = step(jnp.asarray(tokens, jnp.int32), jnp.asarray(n, jnp.int32), cache)
        logits = np.asarray(logits)
        for b in range(batch):
            for j in range(min(accept[b], out_len + 1 - n[b])):
                row = logits[b, j]
                got[b, n[b] + j] = np.argmax(row) if np.any(row != 0) else -2
            n[b] = min(n[b] + accept[b], out_len)
    for b in range(batch):
        cursors = reference_cursors(sources[b], outputs[b][:out_len], starts[b], 3, 3, word_initial)
        want = [reference_proposal(sources[b], c, starts[b]) for c in cursors]
        want = [-2 if w is None else w for w in want]
        np.testing.assert_array_equal(got[b, :out_len], want, err_msg=f"row {b}")


# ---------------------------------------------------------------------------------------------
# In the speculative loop: greedy identity on a tiny random T5, exact sampling on a toy target.

BATCH, ENC_LEN, MAX_LEN = 4, 9, 16


@pytest.fixture(scope="module")
def t5_greedy(tiny_target):
    module, params = tiny_target
    enc = encoder_inputs(BATCH, ENC_LEN, [9, 5, 7, 3])
    baseline = models.EncoderDecoderModel(module)
    batch = {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": jnp.zeros((BATCH, MAX_LEN), jnp.int32),
    }
    greedy = jax.jit(
        lambda p, b: baseline.predict_batch_with_aux(
            p, b, decoder_params={"temperature": 0.0, "topk": 0}
        )[0]
    )(params, batch)
    return module, params, batch, np.asarray(greedy)


@pytest.mark.parametrize("gamma", [1, 4])
def test_argmax_identity_in_the_model(t5_greedy, gamma):
    module, params, batch, expected = t5_greedy
    word_initial = np.random.RandomState(gamma).rand(VOCAB) < 0.5
    model = models.SpeculativeEncoderDecoderModel(module, aligned(word_initial=word_initial))
    decodes, aux = jax.jit(
        lambda p, b: model.predict_batch_with_aux(
            p, b, decoder_params={"gamma": gamma, "temperature": 0.0}
        )
    )(params, batch)
    np.testing.assert_array_equal(decodes, expected)


def _edited_copies(expected):
    """Sources that are the greedy outputs with a substitution, a drop and a doubled token."""
    rows = []
    for r, out in enumerate(expected):
        out = [int(t) for t in out]
        out = out[: out.index(EOS) + 1] if EOS in out else out
        if len(out) > 4:
            out[1] = 3 + (out[1] + r) % 29
            out = out[:3] + out[4:]
            out = out[:2] + [out[2]] + out[2:]
        rows.append((out + [0] * 24)[:24])
    return jnp.asarray(rows, jnp.int32)


@pytest.mark.parametrize("gamma", [16])  # copy drafts can afford long blocks
def test_argmax_identity_when_the_source_is_an_edited_output(t5_greedy, gamma):
    """The draft reads a source that is the target's own greedy output with edits (what a
    correction model sees): long accepted runs, rejections and re-alignment inside the loop."""
    module, params, batch, expected = t5_greedy
    model = models.SpeculativeEncoderDecoderModel(module, aligned())
    draft = aligned()
    source = _edited_copies(expected)

    @jax.jit
    def decode(params):
        target_cache, target_step = model.decoder_state(
            params, batch["encoder_input_tokens"], MAX_LEN
        )
        draft_cache, draft_step = draft.prepare(draft.params, source, MAX_LEN)
        return speculative.speculative_sample(
            jnp.zeros((BATCH, MAX_LEN), jnp.int32),
            target_cache,
            target_step,
            draft_cache,
            draft_step,
            EOS,
            gamma=gamma,
            temperature=0.0,
        )

    decodes, st = decode(params)
    np.testing.assert_array_equal(decodes, expected)
    alpha = float(st.num_accepted.sum() / st.num_draft_tokens.sum())
    assert 0.5 < alpha < 1.0, alpha  # mostly copied, some rejections
    assert int(np.asarray(st.accept_histogram)[:, 2:].sum()) > 0  # runs of accepted copies


def _copying_table(source, vocab, max_len, bonus, seed):
    """A toy target (test_speculative.toy_step) that likes to copy `source` position by position."""
    rng = np.random.RandomState(seed)
    table = rng.randn(max_len, vocab, vocab, vocab).astype(np.float32)
    for t in range(max_len):
        table[t, ..., source[t]] += bonus
    return table


@pytest.mark.parametrize("temperature, gamma", [(1.0, 4)])
def test_sampling_distribution_with_the_copy_draft_is_the_targets(temperature, gamma):
    vocab, max_len, n = 5, 3, 20000
    sources = [[2, 3, 4, EOS], [4, 4, 2, EOS]]  # the second row repeats a token
    table = _copying_table([3, 4, 2], vocab, max_len, bonus=2.0, seed=1)
    enc = jnp.asarray([sources[i % 2] for i in range(n)], jnp.int32)
    draft = copy_drafts.AlignedCopyDraft(vocab)

    @jax.jit
    def run(rng):
        draft_cache, draft_step = draft.prepare(draft.params, enc, max_len)
        return speculative.speculative_sample(
            jnp.zeros((n, max_len), jnp.int32),
            toy_cache(n, max_len),
            toy_step(table),
            draft_cache,
            draft_step,
            EOS,
            gamma=gamma,
            decode_rng=rng,
            temperature=temperature,
        )

    decodes, st = run(jax.random.PRNGKey(7))
    expected = exact_sequence_probs(table, max_len, temperature, 0, 0.0)
    decodes = np.asarray(decodes)
    for parity in (0, 1):  # each source's rows follow the target's distribution
        assert chi_square_pvalue(decodes[parity::2], expected) > 1e-3
    alpha = float(st.num_accepted.sum() / st.num_draft_tokens.sum())
    assert 0.1 < alpha < 0.9, alpha  # both acceptance and rejection exercised
