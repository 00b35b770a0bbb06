"""A seeded noise model that corrupts English sentences, for the text-correction task.

In the spirit of the synthetic data behind Google's C4_200M (Stahlberg and Kumar, 2021; Rothe et
al., 2021, "A Simple Recipe for Multilingual Grammatical Error Correction"): a clean sentence is the
target, a corrupted copy of it the input, so a model learns to undo the edits. The corruption is a
pure function of the sentence text (`corrupt`): its random stream is seeded by a stable hash of the
text (sha256, never Python's salted `hash`), so a split corrupts the same way in any order, on any
machine, and a rebuild reproduces it.

What one sentence gets (`NoiseConfig`):

* with probability `clean_fraction` nothing (the model must also learn to leave text alone);
* else a touch rate r ~ U[`min_rate`, `max_rate`] and max(1, round(r * words)) edits (stochastic
  rounding), each on words no earlier edit touched. An edit's kind is drawn by `weights` among
  the kinds that apply to some untouched word, then its word uniformly among those:

  ========================  ==============================================================
  kind                      edit (words touched)
  ========================  ==============================================================
  ``typo``                  one letter (never the first) of an all-letter word of >= 3 letters
                            substituted by a QWERTY neighbour, struck twice, or deleted (1)
  ``transposition``         two adjacent letters of such a word exchanged (1)
  ``drop_word``             a word removed (1)
  ``double_word``           a word written twice (1)
  ``swap_words``            two adjacent, different words exchanged (2)
  ``casing``                a Capitalised word lower-cased or a lower-case word capitalised (1)
  ``punctuation``           a trailing , ; : or the final . removed, or a comma added (1)
  ``confusion``             its/it's, a/an, there/their/they're, your/you're, then/than, ... (1)
  ``agreement``             verb agreement: is/are, was/were, has/have, provides/provide, ... (1)
  ========================  ==============================================================

Words are the sentence's whitespace-separated tokens; leading and trailing punctuation stays with
its word. Only `random.Random.random()` is drawn (the one stream Python guarantees across
versions for an integer seed); integers and choices are derived from it here.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import random
import re
from collections.abc import Mapping, Sequence

NOISE_VERSION = 1  # Bump when an edit changes: built corpora record it and are rebuilt.
KINDS = (
    "typo",
    "transposition",
    "drop_word",
    "double_word",
    "swap_words",
    "casing",
    "punctuation",
    "confusion",
    "agreement",
)
DEFAULT_WEIGHTS = {
    "typo": 3.0,
    "transposition": 1.5,
    "drop_word": 1.5,
    "double_word": 0.75,
    "swap_words": 1.0,
    "casing": 1.0,
    "punctuation": 1.5,
    "confusion": 2.0,
    "agreement": 2.0,
}

# Lower-case confusion sets: a word in one is replaced by another member of it.
CONFUSIONS = (
    ("its", "it's"),
    ("a", "an"),
    ("there", "their", "they're"),
    ("your", "you're"),
    ("then", "than"),
    ("to", "too"),
    ("affect", "effect"),
    ("lose", "loose"),
    ("whose", "who's"),
    ("which", "that"),
    ("fewer", "less"),
)
# Verb agreement pairs (singular, plural): the third person -s and the common irregulars.
_REGULAR_VERBS = (
    "provide contain include allow support use make require help run read write let need offer "
    "come give work enable implement add create display handle generate manage build install "
    "check convert show print store keep find depend produce describe perform consist extend"
).split()
AGREEMENT = (
    ("is", "are"),
    ("was", "were"),
    ("has", "have"),
    ("does", "do"),
    ("doesn't", "don't"),
    *((verb + "s", verb) for verb in _REGULAR_VERBS),
)
# Letters next to each other on a QWERTY keyboard (substitution typos pick one of these).
_KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_TRAILING_PUNCTUATION = ",;:"
_WORD = re.compile(r"^(\W*)(.*?)(\W*)$", flags=re.UNICODE)


@dataclasses.dataclass(frozen=True)
class NoiseConfig:
    """How much and which noise `corrupt` applies.

    Attributes:
      clean_fraction: probability that a sentence is left unchanged, in [0, 1].
      min_rate, max_rate: bounds of the per-sentence touch rate (fraction of words edited), with
        0 < min_rate <= max_rate <= 1.
      weights: {kind: weight >= 0} for the kinds in `KINDS` (missing kinds weigh 0).
      salt: mixed into the per-sentence seed (another salt, another corruption of the same text).
    """

    clean_fraction: float = 0.2
    min_rate: float = 0.05
    max_rate: float = 0.15
    weights: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    salt: str = ""

    def __post_init__(self):
        if not 0.0 <= self.clean_fraction <= 1.0:
            raise ValueError(f"clean_fraction must be in [0, 1]; got {self.clean_fraction}.")
        if not 0.0 < self.min_rate <= self.max_rate <= 1.0:
            raise ValueError(
                "need 0 < min_rate <= max_rate <= 1; got "
                f"min_rate={self.min_rate}, max_rate={self.max_rate}."
            )
        unknown = sorted(set(self.weights) - set(KINDS))
        if unknown or any(w < 0 for w in self.weights.values()):
            raise ValueError(
                f"weights must map kinds in {KINDS} to numbers >= 0; got {dict(self.weights)}."
            )
        if sum(self.weights.values()) <= 0:
            raise ValueError(f"at least one weight must be > 0; got {dict(self.weights)}.")

    def as_dict(self) -> dict:
        """The configuration as JSON-ready values (for a corpus manifest)."""
        return {**dataclasses.asdict(self), "weights": dict(self.weights)}


@dataclasses.dataclass(frozen=True)
class Corruption:
    """The result of `corrupt`.

    Attributes:
      text: str, the corrupted sentence (equal to the input when `kinds` is empty).
      kinds: the kinds applied, in order (one entry per edit).
      touched: number of input words the edits touched (`swap_words` touches two).
      words: number of words in the input.
    """

    text: str
    kinds: tuple[str, ...]
    touched: int
    words: int


def seed_of(text: str, salt: str = "") -> int:
    """The per-sentence seed: the first 8 bytes of sha256 of version, salt and text, big-endian.

    Args:
      text: str, the clean sentence.
      salt: str, `NoiseConfig.salt`.

    Returns:
      int in [0, 2**64), stable across runs, machines and Python versions.
    """
    key = f"noise-v{NOISE_VERSION}\0{salt}\0{text}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def _below(rng: random.Random, n: int) -> int:
    """An int in [0, n) from `rng.random()` alone (n >= 1)."""
    return min(int(rng.random() * n), n - 1)


def _split(word: str) -> tuple[str, str, str]:
    """(leading punctuation, core, trailing punctuation) of a whitespace word."""
    lead, core, trail = _WORD.match(word).groups()
    return lead, core, trail


def _match_case(new: str, old: str) -> str:
    """`new` with `old`'s casing: Capitalised or UPPER carried over, else unchanged."""
    if old.isupper() and len(old) > 1:
        return new.upper()
    if old[:1].isupper():
        return new[:1].upper() + new[1:]
    return new


def _lookup(table: Sequence[Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """{member: the other members of its set} over a table of lower-case sets."""
    return {w: tuple(o for o in group if o != w) for group in table for w in group}


_CONFUSION_OF = _lookup(CONFUSIONS)
_AGREEMENT_OF = _lookup(AGREEMENT)


def _neighbours(letter: str) -> str:
    lower = letter.lower()
    for row in _KEYBOARD_ROWS:
        i = row.find(lower)
        if i >= 0:
            near = row[max(i - 1, 0) : i] + row[i + 1 : i + 2]
            return near.upper() if letter.isupper() else near
    return ""


def _applies(kind: str, words: Sequence[str], i: int) -> bool:
    """Whether edit `kind` can change word i (for `swap_words`: words i and i + 1)."""
    _, core, trail = _split(words[i])
    lower = core.lower()
    if kind in ("typo", "transposition"):
        if not (core.isalpha() and len(core) >= 3):
            return False
        return kind == "typo" or any(a != b for a, b in zip(core, core[1:], strict=False))
    if kind == "drop_word":
        return len(words) >= 3
    if kind == "double_word":
        return bool(core)
    if kind == "swap_words":
        return i + 1 < len(words) and words[i] != words[i + 1]
    if kind == "casing":
        return core.isalpha() and (core.islower() or (core[0].isupper() and core[1:].islower()))
    if kind == "punctuation":
        last = i == len(words) - 1
        return bool(core) and (
            bool(trail)
            and trail[-1] in _TRAILING_PUNCTUATION
            or (last and trail == ".")
            or not last
        )
    if kind == "confusion":
        return lower in _CONFUSION_OF
    if kind == "agreement":
        return lower in _AGREEMENT_OF
    raise ValueError(f"unknown noise kind {kind!r}; expected one of {KINDS}.")


def _edit_word(kind: str, word: str, last: bool, rng: random.Random) -> str:
    """One word after a single-word edit of `kind` (not drop/double/swap)."""
    lead, core, trail = _split(word)
    if kind == "typo":
        j = 1 + _below(rng, len(core) - 1)  # never the first letter: stays readable
        op = _below(rng, 3)
        if op == 0 and _neighbours(core[j]):
            near = _neighbours(core[j])
            core = core[:j] + near[_below(rng, len(near))] + core[j + 1 :]
        elif op == 1:
            core = core[:j] + core[j - 1] + core[j:]  # a letter struck twice
        else:
            core = core[:j] + core[j + 1 :]
    elif kind == "transposition":
        pairs = [j for j in range(len(core) - 1) if core[j] != core[j + 1]]
        j = pairs[_below(rng, len(pairs))]
        core = core[:j] + core[j + 1] + core[j] + core[j + 2 :]
    elif kind == "casing":
        core = core[0].swapcase() + core[1:]
    elif kind == "punctuation":
        if trail and trail[-1] in _TRAILING_PUNCTUATION or (last and trail == "."):
            trail = trail[:-1]
        else:
            trail += ","
    elif kind in ("confusion", "agreement"):
        table = _CONFUSION_OF if kind == "confusion" else _AGREEMENT_OF
        options = table[core.lower()]
        core = _match_case(options[_below(rng, len(options))], core)
    return lead + core + trail


def corrupt(text: str, config: NoiseConfig | None = None) -> Corruption:
    """Corrupts one sentence, deterministically (seeded by `seed_of(text, config.salt)`).

    Args:
      text: str, a clean sentence (whitespace-separated words).
      config: `NoiseConfig` (default: `NoiseConfig()`).

    Returns:
      `Corruption`: the corrupted text (single spaces between words), the kinds applied, the
      words touched and the word count. An empty text comes back unchanged.
    """
    config = config or NoiseConfig()
    words = text.split()
    rng = random.Random(seed_of(text, config.salt))
    if not words or rng.random() < config.clean_fraction:
        return Corruption(" ".join(words), (), 0, len(words))
    rate = config.min_rate + (config.max_rate - config.min_rate) * rng.random()
    wanted = max(1, int(rate * len(words) + rng.random()))  # stochastic rounding
    slots: list[list[str]] = [[w] for w in words]  # what each input word becomes
    touched: set[int] = set()
    kinds: list[str] = []
    weights = {k: float(config.weights.get(k, 0.0)) for k in KINDS}
    while len(touched) < wanted:
        candidates = {}
        for kind in KINDS:
            if weights[kind] <= 0:
                continue
            free = [
                i
                for i in range(len(words))
                if i not in touched
                and (kind != "swap_words" or i + 1 not in touched)
                and _applies(kind, words, i)
            ]
            if free:
                candidates[kind] = free
        if not candidates:
            break
        total = sum(weights[k] for k in candidates)
        point, kind = rng.random() * total, None
        for kind in candidates:  # KINDS order: the draw is stable
            point -= weights[kind]
            if point < 0:
                break
        free = candidates[kind]
        i = free[_below(rng, len(free))]
        if kind == "drop_word":
            slots[i] = []
        elif kind == "double_word":
            slots[i] = [words[i], words[i]]
        elif kind == "swap_words":
            slots[i], slots[i + 1] = [words[i + 1]], [words[i]]
            touched.add(i + 1)
        else:
            slots[i] = [_edit_word(kind, words[i], i == len(words) - 1, rng)]
        touched.add(i)
        kinds.append(kind)
    corrupted = " ".join(w for slot in slots for w in slot)
    return Corruption(corrupted, tuple(kinds), len(touched), len(words))


def summarize(corruptions: Sequence[Corruption]) -> dict:
    """Statistics of many corruptions (for a corpus manifest and the tests).

    Args:
      corruptions: `Corruption`s, e.g. of one split.

    Returns:
      {"sentences": count, "clean_fraction": sentences left clean / sentences,
      "touched_fraction": words touched / words of the corrupted sentences, "kinds": {kind: edits}}.
    """
    kinds = collections.Counter(k for c in corruptions for k in c.kinds)
    dirty = [c for c in corruptions if c.kinds]
    return {
        "sentences": len(corruptions),
        "clean_fraction": round(1 - len(dirty) / max(len(corruptions), 1), 4),
        "touched_fraction": round(
            sum(c.touched for c in dirty) / max(sum(c.words for c in dirty), 1), 4
        ),
        "kinds": dict(sorted(kinds.items())),
    }
