"""The correction task's noise model: deterministic per sentence, each kind does what it says, and
the touched-word and clean-sentence fractions land in the documented ranges."""

import collections
import random

import pytest

from specdec_t5x.data import noise

SENTENCE = (
    "This package contains the documentation for the library, which provides an interface to its "
    "data and there is a tool that reads your files."
)
# A sentence every kind applies to (its, a/an, there, is/has/provides, commas, Capitals).
SENTENCES = [
    SENTENCE,
    "It has a small graphical user interface, and it supports plugins written in Python.",
    "The program reads text files and counts their words, lines and characters.",
    "Zed is an efficient library that parses zed files; it is used by many tools.",
]


def _many_sentences(n=3000, seed=0):
    """Synthetic English-like sentences of 4 to 33 words (the corpus' range and beyond)."""
    words = (
        "the a an its it is are has was this that which there their your to then package "
        "provides contains library tool files program supports data user system uses with for "
        "of and in on"
    ).split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sentence = [
            words[int(rng.random() * len(words))] for _ in range(4 + int(rng.random() * 30))
        ]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        if len(sentence) > 6:
            sentence[3] += ","
        out.append(" ".join(sentence))
    return out


def test_corruption_is_a_function_of_the_text_alone():
    sentences = _many_sentences(300)
    forward = {s: noise.corrupt(s) for s in sentences}
    backward = {s: noise.corrupt(s) for s in reversed(sentences)}  # other order, other history
    assert forward == backward
    assert any(c.kinds for c in forward.values()) and any(not c.kinds for c in forward.values())
    other = {s: noise.corrupt(s, noise.NoiseConfig(salt="b")) for s in sentences}
    assert sum(other[s].text != forward[s].text for s in sentences) > 100  # the salt matters


def test_seed_and_one_corruption_are_pinned():
    # Pinned: a change here silently changes every built corpus (then bump NOISE_VERSION).
    assert noise.seed_of("It is fast.") == 0x0475D18BA1E41F84
    corruption = noise.corrupt(SENTENCE)
    assert corruption == noise.Corruption(
        text="package This contains the documentation for the library, which provides an "
        "interface to its data And there is a that reads your files.",
        kinds=("casing", "drop_word", "swap_words"),
        touched=4,  # a swap touches two words
        words=24,
    )


def _single_kind(kind):
    return noise.NoiseConfig(clean_fraction=0.0, weights={kind: 1.0})


def _edited(kind, n=60):
    """(clean words, corrupted words) over sentences and salts with only `kind` enabled."""
    out = []
    for sentence in SENTENCES:
        for salt in range(n // len(SENTENCES)):
            config = noise.NoiseConfig(clean_fraction=0.0, weights={kind: 1.0}, salt=str(salt))
            corruption = noise.corrupt(sentence, config)
            assert corruption.kinds and set(corruption.kinds) == {kind}
            assert corruption.text != sentence
            out.append((sentence.split(), corruption.text.split(), corruption))
    return out


def _one_edit_distance(a, b):
    """Whether b is a with one character substituted, inserted or deleted."""
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return len(long) == len(short) + 1 and any(
        long[:i] + long[i + 1 :] == short for i in range(len(long))
    )


def _changed_words(clean, noisy):
    assert len(clean) == len(noisy)
    return [(a, b) for a, b in zip(clean, noisy, strict=True) if a != b]


def test_typo_and_transposition_change_letters_of_words():
    for clean, noisy, c in _edited("typo"):
        changed = _changed_words(clean, noisy)
        assert len(changed) == c.touched
        assert all(_one_edit_distance(a, b) for a, b in changed), changed
    for clean, noisy, _ in _edited("transposition"):
        for a, b in _changed_words(clean, noisy):
            assert sorted(a) == sorted(b)
            diff = [i for i in range(len(a)) if a[i] != b[i]]
            assert len(diff) == 2 and diff[1] == diff[0] + 1
            assert a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def test_dropped_doubled_and_swapped_words():
    for clean, noisy, c in _edited("drop_word"):
        assert len(noisy) == len(clean) - c.touched
        assert collections.Counter(noisy) <= collections.Counter(clean)
    for clean, noisy, c in _edited("double_word"):
        assert len(noisy) == len(clean) + c.touched
        assert collections.Counter(clean) <= collections.Counter(noisy)
        assert any(x == y for x, y in zip(noisy, noisy[1:], strict=False))
    for clean, noisy, c in _edited("swap_words"):
        assert sorted(clean) == sorted(noisy)
        diff = [i for i in range(len(clean)) if clean[i] != noisy[i]]
        assert len(diff) == c.touched and c.touched % 2 == 0
        for i in diff[::2]:  # pairs of neighbours exchanged
            assert (noisy[i], noisy[i + 1]) == (clean[i + 1], clean[i])


def test_casing_and_punctuation():
    for clean, noisy, _ in _edited("casing"):
        for a, b in _changed_words(clean, noisy):
            assert a.lower() == b.lower() and a[0] != b[0] and a[1:] == b[1:]
    strip = lambda w: w.rstrip(",;:.")
    for clean, noisy, _ in _edited("punctuation"):
        changed = _changed_words(clean, noisy)
        assert changed and all(strip(a) == strip(b) for a, b in changed)
        assert all(abs(len(a) - len(b)) == 1 for a, b in changed)


def test_confusions_and_verb_agreement_come_from_their_tables():
    for kind, table in (("confusion", noise.CONFUSIONS), ("agreement", noise.AGREEMENT)):
        seen = set()
        for clean, noisy, _ in _edited(kind):
            for a, b in _changed_words(clean, noisy):
                a, b = a.lower().strip(".,"), b.lower().strip(".,")
                assert any(a in group and b in group and a != b for group in table), (a, b)
                seen.add((a, b))
        assert len(seen) >= 3  # several pairs, both ways
    assert noise.corrupt("Its a tool.", _single_kind("confusion")).text in {
        "It's a tool.",
        "Its an tool.",
    }


def test_touched_fraction_and_clean_sentences_over_many_sentences():
    corruptions = [noise.corrupt(s) for s in _many_sentences()]
    stats = noise.summarize(corruptions)
    assert 0.05 <= stats["touched_fraction"] <= 0.15, stats
    assert abs(stats["clean_fraction"] - noise.NoiseConfig().clean_fraction) < 0.03, stats
    assert set(stats["kinds"]) == set(noise.KINDS)  # every kind occurs with the defaults
    # Every corrupted sentence has at least one edit and differs from its source.
    dirty = [c for c in corruptions if c.kinds]
    assert all(1 <= c.touched <= max(2, 0.3 * c.words) + 1 for c in dirty)


def test_no_applicable_edit_leaves_the_text_and_config_errors():
    config = noise.NoiseConfig(clean_fraction=0.0, weights={"confusion": 1.0})
    assert noise.corrupt("Nothing confusable here.", config).kinds == ()
    assert noise.corrupt("").text == ""
    with pytest.raises(ValueError, match="clean_fraction"):
        noise.NoiseConfig(clean_fraction=1.5)
    with pytest.raises(ValueError, match="min_rate"):
        noise.NoiseConfig(min_rate=0.2, max_rate=0.1)
    with pytest.raises(ValueError, match="kinds in"):
        noise.NoiseConfig(weights={"typos": 1.0})
    with pytest.raises(ValueError, match="at least one weight"):
        noise.NoiseConfig(weights={"typo": 0.0})
