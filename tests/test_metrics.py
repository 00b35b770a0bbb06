"""Tests for specdec_t5x.metrics: BLEU and ROUGE with T5's settings on known strings."""

import pytest

from specdec_t5x import metrics

SENTENCES = [
    "The cat sat on the mat .",
    "Dieses Paket enthält die Dokumentation für das Werkzeug.",
]


def test_bleu_identical_is_100_and_disjoint_is_0():
    assert metrics.bleu(SENTENCES, SENTENCES) == {"bleu": pytest.approx(100.0)}
    assert metrics.bleu(SENTENCES, ["xyzzy plugh", "quux corge"])["bleu"] == pytest.approx(0.0)


def test_bleu_matches_sacrebleu_with_t5_settings():
    import sacrebleu

    targets = ["the cat is on the mat", "there is a cat on the mat"]
    predictions = ["the cat the cat on the mat", "a cat is on the mat"]
    expected = sacrebleu.corpus_bleu(
        predictions,
        [targets],
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize="intl",
        use_effective_order=False,
    ).score
    score = metrics.bleu(targets, predictions)["bleu"]
    assert 0.0 < score < 100.0
    assert score == pytest.approx(expected)
    # Case matters (lowercase=False).
    assert metrics.bleu(["The Cat"], ["the cat"])["bleu"] < 100.0


def test_bleu_multiple_references_per_example():
    targets = [["the cat is here", "a cat is here"], ["the dog runs fast", "a dog runs fast"]]
    assert metrics.bleu(targets, ["a cat is here", "the dog runs fast"]) == {
        "bleu": pytest.approx(100.0)
    }
    with pytest.raises(ValueError, match="predictions"):
        metrics.bleu(targets, ["only one"])


def test_rouge_identical_is_100():
    scores = metrics.rouge(SENTENCES[:1] * 3, SENTENCES[:1] * 3)
    assert set(scores) == {"rouge1", "rouge2", "rougeLsum"}
    assert all(v == pytest.approx(100.0) for v in scores.values())


def test_rouge_known_values():
    # rouge1: 2 of 3 unigrams match on both sides, F = 2/3; rouge2: "the cat" matches, F = 1/2.
    scores = metrics.rouge(["the cat sat"], ["the cat ran"], score_keys=("rouge1", "rouge2"))
    assert scores["rouge1"] == pytest.approx(200 / 3)
    assert scores["rouge2"] == pytest.approx(50.0)
    assert metrics.rouge_mean(["the cat sat"], ["the cat ran"]) == pytest.approx(
        {"rouge1": 200 / 3, "rouge2": 50.0, "rougeLsum": 200 / 3}
    )


def test_rougelsum_sees_sentence_breaks():
    # " . " becomes " .\n", so rougeLsum matches sentence by sentence, whatever their order.
    target = "b c d . a x y"
    prediction = "a x y . b c d"
    scores = metrics.rouge_mean([target], [prediction], score_keys=("rougeL", "rougeLsum"))
    assert scores["rougeLsum"] == pytest.approx(100.0)
    assert scores["rougeL"] < 100.0
