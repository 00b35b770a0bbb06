"""The text-correction corpus: English sentences of Debian's descriptions, corrupted by `noise`.

A grammatical-error-correction analogue built like Google's synthetic C4_200M data: the target is
a clean English sentence, the input a copy corrupted by the seeded noise model
(`specdec_t5x.data.noise`). Sentences come from the prose of every package's `Description-en` in
bookworm `main`'s `Translation-en` (all packages, not only those with a German translation), read
from the index that `specdec_t5x.data.build` fetched (`<data_dir>/index/`), so building this corpus
needs no network. It writes

    <data_dir>/ddtp_correct_en/{train,validation,test}.jsonl
        {"en", "corrupted", "edits", "package", "source"}   (edits: the noise kinds, comma-joined)
    <data_dir>/ddtp_correct_en/manifest.json  index checksum, noise version and configuration,
        row counts, edit-kind counts, touched-word and clean-sentence fractions per split

split by source package (`corpora.split_of`) like the other corpora. `build.build_corpora` calls
`build_correction_corpus` after its own corpora; a second run with the same index, noise version
and parameters is a no-op. Each description is under its package's licence: never commit the text.

Usage:

    python -m specdec_t5x.data.build [--data_dir DIR] [--force]   # builds it with the others
"""

import collections
import json
import logging
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence

from specdec_t5x import provenance
from specdec_t5x.data import build, corpora, debian, noise

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MIN_SENTENCE_WORDS = 5
MAX_SENTENCE_WORDS = 50
MAX_SENTENCES_PER_SOURCE = 20  # Caps families (texlive-*, lib*-dev, ...) that repeat boilerplate.
_ENDINGS = (".", "!", "?")


def description_sentences(description: str) -> list[str]:
    """The prose sentences of a `Description-en` value (synopsis, list items and verbatim lines
    left out), whitespace-normalised.

    Args:
      description: str, a `Description-en` value as stored by `debian.parse_stanzas`.

    Returns:
      The sentences in order (`debian.split_sentences` over each prose block).
    """
    _, paragraphs = debian.split_description(description)
    return [
        sentence
        for lines in paragraphs
        for kind, text in debian.paragraph_units(lines)
        if kind == "text"
        for sentence in debian.split_sentences(text)
    ]


def is_sentence(text: str) -> bool:
    """Whether a segment looks like a full English sentence worth correcting: `MIN_SENTENCE_WORDS`
    to `MAX_SENTENCE_WORDS` words, a capital letter or digit first, ".", "!" or "?" last."""
    words = len(text.split())
    return (
        MIN_SENTENCE_WORDS <= words <= MAX_SENTENCE_WORDS
        and (text[:1].isupper() or text[:1].isdigit())
        and text.endswith(_ENDINGS)
    )


def sentence_rows(
    en_stanzas: Sequence[Mapping[str, str]], sources: Mapping[str, str]
) -> tuple[list[dict[str, str]], collections.Counter]:
    """The deduplicated English sentences of all descriptions, each with package and source.

    Stanzas are visited in (source, package) order; a sentence is kept if `is_sentence`, unseen
    before (the first occurrence wins, so no sentence is in two splits), and its source package
    has fewer than `MAX_SENTENCES_PER_SOURCE` kept sentences.

    Args:
      en_stanzas: `Translation-en` stanzas (`Package`, `Description-en`).
      sources: {binary: source}; a binary not in it is its own source.

    Returns:
      (rows, counts): rows {"en", "package", "source"}; counts of what was kept and dropped.
    """
    counts: collections.Counter = collections.Counter()
    rows, seen, per_source = [], set(), collections.Counter()
    for stanza, package, source in debian.by_source(en_stanzas, sources):
        for sentence in description_sentences(stanza["Description-en"]):
            counts["sentences"] += 1
            if not is_sentence(sentence):
                counts["dropped_not_a_sentence"] += 1
            elif sentence in seen:
                counts["dropped_duplicate"] += 1
            elif per_source[source] >= MAX_SENTENCES_PER_SOURCE:
                counts["dropped_source_cap"] += 1
            else:
                seen.add(sentence)
                per_source[source] += 1
                rows.append({"en": sentence, "package": package, "source": source})
    counts["kept"] = len(rows)
    return rows, counts


def corrupted_rows(
    rows: Iterable[Mapping[str, str]], config: noise.NoiseConfig | None = None
) -> tuple[list[dict[str, str]], list[noise.Corruption]]:
    """Adds each row's corrupted input (`noise.corrupt` of its "en", deterministic per text).

    Args:
      rows: {"en", ...} rows (e.g. from `sentence_rows`).
      config: `noise.NoiseConfig` (default: `noise.NoiseConfig()`).

    Returns:
      (new_rows, corruptions): rows {"en", "corrupted", "edits", ...the other fields}, where
      "edits" is the comma-joined list of noise kinds applied ("" for a sentence left clean), and
      the `noise.Corruption` of each row.
    """
    rows = list(rows)
    corruptions = [noise.corrupt(row["en"], config) for row in rows]
    out = [
        {**row, "corrupted": c.text, "edits": ",".join(c.kinds)}
        for row, c in zip(rows, corruptions, strict=True)
    ]
    return out, corruptions


def _parameters(config: noise.NoiseConfig) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "noise_version": noise.NOISE_VERSION,
        "noise": config.as_dict(),
        "min_sentence_words": MIN_SENTENCE_WORDS,
        "max_sentence_words": MAX_SENTENCE_WORDS,
        "max_sentences_per_source": MAX_SENTENCES_PER_SOURCE,
    }


def build_correction_corpus(
    data_dir: str | os.PathLike | None = None,
    force: bool = False,
    config: noise.NoiseConfig | None = None,
) -> dict:
    """Writes `ddtp_correct_en` from the fetched index (no-op when built the same way).

    Args:
      data_dir: the data directory holding `index/Translation-en` and `index/Packages`;
        `corpora.default_data_dir()` when None.
      force: rebuild even when the manifest matches.
      config: `noise.NoiseConfig` (default: `noise.NoiseConfig()`).

    Returns:
      The corpus manifest (also written to `ddtp_correct_en/manifest.json`).

    Raises:
      FileNotFoundError: the index is not fetched yet (run `python -m specdec_t5x.data.build`).
    """
    config = config or noise.NoiseConfig()
    data_dir = pathlib.Path(data_dir).expanduser() if data_dir else corpora.default_data_dir()
    index = {name: data_dir / "index" / name for name in ("Translation-en", "Packages")}
    missing = [str(p) for p in index.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{missing} not found: fetch Debian's index with `python -m specdec_t5x.data.build` "
            "(or point SPECDEC_DATA_DIR at a built data directory)."
        )
    checksum = build.sha256(index["Translation-en"])
    corpus_dir = data_dir / corpora.CORRECT
    manifest_path = corpus_dir / "manifest.json"
    if manifest_path.exists() and not force:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = [s["file"] for s in manifest.get("splits", {}).values()]
        if (
            manifest.get("parameters") == _parameters(config)
            and manifest.get("translation_en_sha256") == checksum
            and files
            and all((data_dir / f).is_file() for f in files)
        ):
            logger.info(
                "%s already built in %s (use --force to rebuild).", corpora.CORRECT, data_dir
            )
            return manifest
    corpus_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)  # A crash below must not leave a stale manifest.

    sources = debian.source_packages(
        debian.parse_stanzas(index["Packages"].read_text(encoding="utf-8"))
    )
    en_stanzas = debian.parse_stanzas(index["Translation-en"].read_text(encoding="utf-8"))
    rows, counts = sentence_rows(en_stanzas, sources)
    rows, corruptions = corrupted_rows(rows, config)
    logger.info("%s: %s", corpora.CORRECT, dict(counts))
    manifest = {
        "build_date": provenance.utc_date(),
        "commit": provenance.git_commit(),
        "command": "python -m specdec_t5x.data.build" + (" --force" if force else ""),
        "translation_en_sha256": checksum,
        "split_rule": corpora.SPLIT_RULE + ", else test",
        "parameters": _parameters(config),
        "counts": dict(sorted(counts.items())),
        **build.write_corpus(data_dir, corpora.CORRECT, rows, ("en", "corrupted")),
    }
    for split, entry in manifest["splits"].items():
        entry["noise"] = noise.summarize(
            [
                c
                for r, c in zip(rows, corruptions, strict=True)
                if corpora.split_of(r["source"]) == split
            ]
        )
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(manifest_path)
    logger.info("Wrote %s", manifest_path)
    return manifest
