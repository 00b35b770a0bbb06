"""Drafts: n-gram probabilities against counts, source-copy proposals, save/load."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import drafts, sampling

VOCAB = 10


def probs_of(draft, tokens, positions=None, enc=None):
    enc = jnp.ones((tokens.shape[0], 4), jnp.int32) if enc is None else enc
    cache, step = draft.prepare(draft.params, enc, 12)
    positions = jnp.zeros((tokens.shape[0],), jnp.int32) if positions is None else positions
    logits, _ = step(jnp.asarray(tokens, jnp.int32), positions, cache)
    return np.exp(np.asarray(logits, np.float64))


def test_ngram_drafts_match_counts():
    targets = [[3, 4, 1], [3, 5, 1], [3, 4, 4, 1]]
    unigram, bigram = drafts.fit_ngram_drafts(targets, VOCAB, top=2, smoothing=1.0, unigram_floor=0)
    uni = probs_of(unigram, np.zeros((1, 1)))[0, 0]
    np.testing.assert_allclose(uni[[1, 3, 4, 5]], np.array([3, 3, 3, 1]) / 10, rtol=1e-6)
    # After 3: counts {4: 2, 5: 1}, lam = 3/4; top=2 keeps both.
    after3 = probs_of(bigram, np.array([[3]]))[0, 0]
    np.testing.assert_allclose(after3.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(after3[4], 0.75 * 2 / 3 + 0.25 * uni[4], rtol=1e-5)
    np.testing.assert_allclose(after3[5], 0.75 * 1 / 3 + 0.25 * uni[5], rtol=1e-5)
    # After 4 (counts {1: 2, 4: 1}) with top=1: token 4's bigram mass moves to the backoff.
    _, top1 = drafts.fit_ngram_drafts(targets, VOCAB, top=1, smoothing=1.0, unigram_floor=0)
    after4 = probs_of(top1, np.array([[4]]))[0, 0]
    np.testing.assert_allclose(after4.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(after4[1], 0.75 * 2 / 3 + (0.25 + 0.75 / 3) * uni[1], rtol=1e-5)


def test_bigram_with_pad_as_a_successor_is_still_a_distribution():
    _, bigram = drafts.fit_ngram_drafts([[0, 0, 2, 1]], VOCAB, top=4)
    probs = probs_of(bigram, np.array([[0, 2]]))
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_fit_rejects_bad_tokens():
    with pytest.raises(ValueError, match="outside"):
        drafts.fit_ngram_drafts([[3, 12]], VOCAB)
    with pytest.raises(ValueError, match="at least one"):
        drafts.fit_ngram_drafts([], VOCAB)


def test_save_and_load_round_trip(tmp_path):
    unigram, bigram = drafts.fit_ngram_drafts([[3, 4, 1], [5, 1]], VOCAB)
    drafts.save_ngram_drafts(tmp_path / "ngram.npz", unigram, bigram)
    for kind, draft in (("unigram", unigram), ("bigram", bigram)):
        loaded = drafts.load_ngram_draft(kind, path=tmp_path / "ngram.npz")
        for key, value in draft.params.items():
            np.testing.assert_array_equal(loaded.params[key], value)
    with pytest.raises(ValueError, match="kind"):
        drafts.load_ngram_draft("trigram", path=tmp_path / "ngram.npz")


def test_source_copy_proposes_what_followed_the_longest_match():
    enc = jnp.asarray([[7, 3, 4, 5, 3, 4, 8, 1, 0]], jnp.int32)
    draft = drafts.SourceCopyDraft(VOCAB, max_ngram=2)
    cache, step = draft.prepare(draft.params, enc, 12)
    # Decoder inputs by position: 0 (start), 9, 3, 4 -> the suffix [3, 4] matches twice; both
    # are followed by 5 (earliest) / 8; the earliest longest match wins -> 5.
    logits, cache = step(jnp.asarray([[0, 9, 3, 4]]), jnp.zeros((1,), jnp.int32), cache)
    proposal = np.argmax(np.asarray(logits[0]), -1)
    assert proposal[3] == 5  # after [3, 4]
    assert proposal[2] == 4  # after [.., 3]: earliest 3 is followed by 4
    q = np.exp(np.asarray(logits[0, 3], np.float64))
    assert q[5] == 1.0 and q.sum() == 1.0  # one-hot q
    assert np.all(np.asarray(logits[0, 1]) == 0.0)  # 9 is not in the source: uniform q
    # Rolling back: rewrite position 3 with 7 -> [9, 3, 7]: suffix [7] matches source[0] -> 3.
    logits, _ = step(jnp.asarray([[7]]), jnp.full((1,), 3, jnp.int32), cache)
    assert int(np.argmax(np.asarray(logits[0, 0]))) == 3


def test_source_copy_one_hot_survives_adjustment():
    draft = drafts.SourceCopyDraft(VOCAB)
    enc = jnp.asarray([[3, 4, 1]], jnp.int32)
    cache, step = draft.prepare(draft.params, enc, 6)
    logits, _ = step(jnp.asarray([[0, 3]]), jnp.zeros((1,), jnp.int32), cache)
    q = sampling.adjusted_probs(logits[0, 1], 0.5, topk=3)
    assert float(q[4]) == 1.0
