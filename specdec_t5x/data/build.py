"""Builds the two Debian corpora: DDTP En→De pairs and description→synopsis pairs.

Both come from Debian's own archive index for **bookworm** `main`, fetched by `apt-get update`
with a private configuration (the system's apt state is not touched):

* `i18n/Translation-en` and `i18n/Translation-de` (Debian Description Translation Project, DDTP):
  every package's English description and its human-written German translation. A German stanza
  carries the `Description-md5` of the English text it translates, so the alignment is exact.
* `binary-amd64/Packages`: the binary → source package mapping used for the splits.

Corpora written under the data directory (`$SPECDEC_DATA_DIR`, default `~/.cache/specdec_t5x/data`):

    ddtp_ende/{train,validation,test}.jsonl         {"en", "de", "kind", "package", "source"}
    debian_summarize/{train,validation,test}.jsonl  {"document", "synopsis", "package", "source"}
    index/{Packages,Translation-en,Translation-de,InRelease}   the fetched index files
    manifest.json                                   checksums, row counts, length statistics, date

Splits are by a stable hash of the *source* package (first 8 bytes of `sha256(source)` as a
big-endian integer, % 100: < 90 train, < 95 validation, else test), so binary families that share
text never straddle two splits. A second run with `manifest.json` present is a no-op.

Usage:

    python -m specdec_t5x.data.build [--data_dir DIR] [--force]

Environment: `SPECDEC_DATA_DIR` (output), `SPECDEC_APT_GET` (path to apt-get when not on `PATH`),
`SPECDEC_DEBIAN_MIRROR` (default http://deb.debian.org/debian), `SPECDEC_DEBIAN_KEYRING` (default
/usr/share/keyrings/debian-archive-keyring.gpg). Each description is under its package's licence:
rows keep the package names for attribution; never commit the corpus text.
"""

import argparse
import collections
import datetime
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SUITE = "bookworm"
COMPONENT = "main"
ARCHITECTURE = "amd64"  # Pinned: the Packages file decides the source mapping, hence the splits.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Index files fetched, by the suffix of apt's file name in its lists folder.
INDEX_FILES = {
    "Packages": f"_dists_{SUITE}_{COMPONENT}_binary-{ARCHITECTURE}_Packages",
    "Translation-en": f"_dists_{SUITE}_{COMPONENT}_i18n_Translation-en",
    "Translation-de": f"_dists_{SUITE}_{COMPONENT}_i18n_Translation-de",
    "InRelease": f"_dists_{SUITE}_InRelease",
}
# Seen for bookworm main (Debian 12); a point release may change them (warn, don't fail).
REFERENCE_SHA256 = {
    "Translation-de": "adac331fc51f9a00c1b4120b4ac87423be2b1f1615d4f288c7cbc2d5258c0650",
    "Translation-en": "62f59c3cdca9786e4f7adf9002f9f5729a684adcb4667e58e448dec9b5a46c7f",
}

DDTP = "ddtp_ende"
SUMMARIZE = "debian_summarize"
SPLITS = ("train", "validation", "test")
SPLIT_BOUNDS = (90, 95, 100)  # Cumulative percent of the source-package hash for each split.
SPLIT_RULE = "b = int.from_bytes(sha256(source)[:8], 'big') % 100: train b < 90, validation b < 95"
# A prose block whose EN and DE sentence counts differ is kept whole up to this many EN words.
MAX_UNSPLIT_WORDS = 60
MAX_LENGTH_RATIO = 2.5  # Pairs whose character lengths differ more are misaligned (if >= 20 chars).
MIN_DOCUMENT_WORDS = 40
MAX_DOCUMENT_WORDS = 400
MAX_DOCUMENTS_PER_SOURCE = 10  # Caps families (texlive-*, lib*-dev, ...) that repeat boilerplate.

# A list item: optional indent, a bullet ("*", "-", "+", "o", "1.", "2)"), a space, then text.
_BULLET = re.compile(r"^\s*(?:[*+\-o•]|\d{1,2}[.)])\s+(?=\S)")
# A candidate sentence end: terminal punctuation, closing quotes/brackets, space, capital or digit.
_SENTENCE_END = re.compile(r"[.!?][\"'»«“”)\]]*\s+(?=[\"'„“«(\[]?[A-ZÄÖÜ0-9])")
# Words before "." that do not end a sentence (English and German, lower-cased, without the dot).
_ABBREVIATIONS = frozenset(
    "e.g i.e eg ie cf vs approx incl resp esp fig no nr vol dr mr mrs ms prof st jr sr inc ltd co "
    "corp dept ca bzw bspw ggf evtl inkl sog vgl z.b d.h u.a u.u z.t o.g o.ä s.u s.o ff ggü zb dh "
    "usf al".split()
)


def parse_stanzas(text: str) -> list[dict[str, str]]:
    r"""Parses Debian control-format (deb822) stanzas.

    A continuation line (one starting with a space or tab) is appended to its field's value after a
    "\n", unchanged, so `Description` values keep Debian's markup (" ." paragraph breaks, two-space
    verbatim lines).

    Args:
      text: str, the whole file, stanzas separated by blank lines.

    Returns:
      One dict per stanza, field name → value (first line stripped of surrounding space).

    Raises:
      ValueError: on a continuation line before any field, or a line that is not "Field: value".
    """
    stanzas: list[dict[str, str]] = []
    stanza: dict[str, str] = {}
    field = None
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            if stanza:
                stanzas.append(stanza)
            stanza, field = {}, None
        elif line[0] in " \t":
            if field is None:
                raise ValueError(f"line {number}: continuation line outside a field: {line!r}")
            stanza[field] += "\n" + line
        elif not line.startswith("#"):
            field, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"line {number}: expected 'Field: value', got {line!r}")
            stanza[field] = value.strip()
    if stanza:
        stanzas.append(stanza)
    return stanzas


def description_md5(description: str) -> str:
    """Returns Debian's `Description-md5` of a description (synopsis line plus long text).

    Args:
      description: str, the `Description-en` value as stored by `parse_stanzas`.

    Returns:
      str, 32 hex digits: md5 of the UTF-8 text plus a trailing newline.
    """
    return hashlib.md5((description + "\n").encode("utf-8")).hexdigest()


def split_description(description: str) -> tuple[str, list[list[str]]]:
    """Splits a description value into its synopsis and its paragraphs.

    Args:
      description: str, a `Description-xx` value: synopsis on the first line, then continuation
        lines that start with one space; " ." separates paragraphs.

    Returns:
      (synopsis, paragraphs): the synopsis stripped, and each paragraph as its lines with the one
      leading space removed (so a verbatim line still starts with a space).
    """
    first, *rest = description.split("\n")
    paragraphs: list[list[str]] = [[]]
    for line in rest:
        body = line[1:].rstrip()
        if body.strip() == ".":
            paragraphs.append([])
        elif body.strip():
            paragraphs[-1].append(body)
    return first.strip(), [p for p in paragraphs if p]


def is_verbatim(line: str) -> bool:
    """Whether a paragraph line (one leading space already removed) is verbatim (code, tables)."""
    return line[:1].isspace()


def paragraph_units(lines: Sequence[str]) -> list[tuple[str, str]]:
    """Groups a paragraph's lines into prose blocks and list items; drops other verbatim lines.

    A line starting with a bullet (at any indent) opens an item; deeper-indented lines continue it.
    Unindented lines are prose. Other verbatim lines (code, tables, URLs) are dropped and break the
    surrounding prose into separate blocks.

    Args:
      lines: the paragraph's lines as returned by `split_description`.

    Returns:
      [(kind, text)] with kind "text" or "item", text whitespace-normalised (bullet removed).
    """
    units: list[tuple[str, str]] = []
    kind, item_indent, parts = None, 0, []

    def flush() -> None:
        if parts:
            units.append((kind, " ".join(parts)))
            parts.clear()

    for line in lines:
        indent = len(line) - len(line.lstrip())
        bullet = _BULLET.match(line)
        if bullet:
            flush()
            kind, item_indent = "item", indent
            parts.append(line[bullet.end() :].strip())
        elif kind == "item" and indent > item_indent and parts:
            parts.append(line.strip())
        elif not is_verbatim(line):
            if kind != "text":
                flush()
                kind = "text"
            parts.append(line.strip())
        else:
            flush()
            kind = None
    flush()
    return [(k, " ".join(t.split())) for k, t in units]


def split_sentences(text: str) -> list[str]:
    """Splits prose into sentences at ".", "!" or "?" followed by a capital or digit.

    Abbreviations ("e.g.", "z. B.", "bzw.", single letters) do not end a sentence. The rule is
    conservative: an error on one side only makes the EN/DE sentence counts differ.

    Args:
      text: str, one prose block.

    Returns:
      The sentences, stripped, in order (one element if there is no break).
    """
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if text[match.start()] == ".":
            words = text[start : match.start()].split()
            word = words[-1].lower().strip("\"'(„“«") if words else ""
            if len(word) <= 1 or word in _ABBREVIATIONS:
                continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def align_descriptions(en: str, de: str) -> list[tuple[str, str, str]]:
    """Aligns an English description with its German translation into segment pairs.

    The synopses always pair. Paragraphs pair only if both sides have as many; inside a paragraph
    pair, prose blocks and list items pair if their kinds match one to one; a prose pair is split
    into sentence pairs when the sentence counts match, else kept whole if the English side has at
    most `MAX_UNSPLIT_WORDS` words.

    Args:
      en: str, the `Description-en` value.
      de: str, the `Description-de` value whose `Description-md5` names `en`.

    Returns:
      [(en_text, de_text, kind)] with kind in {"synopsis", "sentence", "paragraph", "item"}.
    """
    en_synopsis, en_paragraphs = split_description(en)
    de_synopsis, de_paragraphs = split_description(de)
    pairs = [(en_synopsis, de_synopsis, "synopsis")]
    if len(en_paragraphs) != len(de_paragraphs):
        return pairs
    for en_lines, de_lines in zip(en_paragraphs, de_paragraphs, strict=True):
        en_units, de_units = paragraph_units(en_lines), paragraph_units(de_lines)
        if [k for k, _ in en_units] != [k for k, _ in de_units]:
            continue
        for (kind, en_text), (_, de_text) in zip(en_units, de_units, strict=True):
            if kind == "item":
                pairs.append((en_text, de_text, "item"))
                continue
            en_sentences, de_sentences = split_sentences(en_text), split_sentences(de_text)
            if len(en_sentences) == len(de_sentences):
                pairs.extend(
                    (e, d, "sentence") for e, d in zip(en_sentences, de_sentences, strict=True)
                )
            elif len(en_text.split()) <= MAX_UNSPLIT_WORDS:
                pairs.append((en_text, de_text, "paragraph"))
    return pairs


def summarization_pair(description: str) -> tuple[str, str] | None:
    """Turns an English description into a (document, synopsis) pair, or None if out of range.

    Args:
      description: str, a `Description-en` value.

    Returns:
      (document, synopsis): the long description's prose and list items joined by spaces (verbatim
      blocks dropped) and the synopsis line; None unless the document has `MIN_DOCUMENT_WORDS` to
      `MAX_DOCUMENT_WORDS` words and the synopsis is not empty.
    """
    synopsis, paragraphs = split_description(description)
    document = " ".join(text for lines in paragraphs for _, text in paragraph_units(lines))
    if synopsis and MIN_DOCUMENT_WORDS <= len(document.split()) <= MAX_DOCUMENT_WORDS:
        return document, synopsis
    return None


def source_packages(packages: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Maps binary package names to source package names from `Packages` stanzas.

    Args:
      packages: stanzas of a `Packages` index; `Source` may carry a version ("foo (1.2-3)") and is
        absent when the source is named like the binary.

    Returns:
      {binary: source}.
    """
    return {s["Package"]: s.get("Source", s["Package"]).split()[0] for s in packages}


def split_of(source: str) -> str:
    """Returns the split of a source package from a stable hash of its name (`SPLIT_BOUNDS`).

    The bucket is the first 8 bytes of sha256(UTF-8 name), big-endian, % 100: < 90 train, < 95
    validation, else test.

    Args:
      source: str, the source package name.

    Returns:
      str, one of `SPLITS`; stable across runs, machines and Python versions.
    """
    bucket = int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") % 100
    return next(split for split, bound in zip(SPLITS, SPLIT_BOUNDS, strict=True) if bucket < bound)


def ddtp_rows(
    en_stanzas: Sequence[Mapping[str, str]],
    de_stanzas: Sequence[Mapping[str, str]],
    sources: Mapping[str, str],
) -> tuple[list[dict[str, str]], collections.Counter]:
    """Builds the deduplicated En→De segment pairs, each with its package and source package.

    German stanzas are matched to English ones by `Description-md5` and visited in (source,
    package) order; a pair is dropped when EN == DE, when one side is over `MAX_LENGTH_RATIO` times
    longer than the other (likely misaligned), or when its English side was already used (the first
    occurrence wins, so no English segment appears twice, nor in two splits).

    Args:
      en_stanzas: `Translation-en` stanzas (`Package`, `Description-md5`, `Description-en`).
      de_stanzas: `Translation-de` stanzas (`Package`, `Description-md5`, `Description-de`).
      sources: {binary: source}; a binary not in it is its own source.

    Returns:
      (rows, counts): rows {"en", "de", "kind", "package", "source"}; counts of what was kept and
      dropped, for the manifest.
    """
    english = {s["Description-md5"]: s["Description-en"] for s in en_stanzas}
    counts: collections.Counter = collections.Counter()
    rows, seen = [], set()
    order = sorted(
        de_stanzas, key=lambda s: (sources.get(s["Package"], s["Package"]), s["Package"])
    )
    for stanza in order:
        package, md5 = stanza["Package"], stanza["Description-md5"]
        if md5 not in english:
            counts["descriptions_md5_unmatched"] += 1
            continue
        counts["descriptions_aligned"] += 1
        for en, de, kind in align_descriptions(english[md5], stanza["Description-de"]):
            counts["segments"] += 1
            if not en or not de or en == de:
                counts["dropped_identical_or_empty"] += 1
            elif _length_ratio(en, de) > MAX_LENGTH_RATIO:
                counts["dropped_length_ratio"] += 1
            elif en in seen:
                counts["dropped_duplicate"] += 1
            else:
                seen.add(en)
                source = sources.get(package, package)
                rows.append(
                    {"en": en, "de": de, "kind": kind, "package": package, "source": source}
                )
    return rows, counts


def _length_ratio(a: str, b: str) -> float:
    """Ratio of the longer to the shorter character length; 1.0 when the longer is < 20 chars."""
    short, long = sorted((len(a), len(b)))
    return long / max(short, 1) if long >= 20 else 1.0


def summarization_rows(
    en_stanzas: Sequence[Mapping[str, str]], sources: Mapping[str, str]
) -> tuple[list[dict[str, str]], collections.Counter]:
    """Builds description → synopsis pairs, deduplicated by document, capped per source package.

    Args:
      en_stanzas: `Translation-en` stanzas.
      sources: {binary: source}; a binary not in it is its own source.

    Returns:
      (rows, counts): rows {"document", "synopsis", "package", "source"} in (source, package) order,
      at most `MAX_DOCUMENTS_PER_SOURCE` per source; counts of what was kept and dropped.
    """
    counts: collections.Counter = collections.Counter()
    rows, seen, per_source = [], set(), collections.Counter()
    order = sorted(
        en_stanzas, key=lambda s: (sources.get(s["Package"], s["Package"]), s["Package"])
    )
    for stanza in order:
        package = stanza["Package"]
        source = sources.get(package, package)
        pair = summarization_pair(stanza["Description-en"])
        if pair is None:
            counts["dropped_length"] += 1
        elif pair[0] in seen:
            counts["dropped_duplicate"] += 1
        elif per_source[source] >= MAX_DOCUMENTS_PER_SOURCE:
            counts["dropped_source_cap"] += 1
        else:
            seen.add(pair[0])
            per_source[source] += 1
            rows.append(
                {"document": pair[0], "synopsis": pair[1], "package": package, "source": source}
            )
    return rows, counts


def length_stats(texts: Sequence[str]) -> dict[str, float]:
    """Word-count statistics (whitespace words) of a list of texts, for the manifest and logs."""
    words = sorted(len(t.split()) for t in texts) or [0]
    return {
        "mean": round(statistics.fmean(words), 2),
        "median": float(statistics.median(words)),
        "p95": words[int(0.95 * (len(words) - 1))],
        "max": words[-1],
        "total": sum(words),
    }


def default_data_dir() -> pathlib.Path:
    """Returns `$SPECDEC_DATA_DIR`, or `~/.cache/specdec_t5x/data` when it is unset or empty."""
    return pathlib.Path(
        os.environ.get("SPECDEC_DATA_DIR") or "~/.cache/specdec_t5x/data"
    ).expanduser()


def _apt_get() -> str:
    """Finds apt-get, or raises a RuntimeError that says what to install or set."""
    apt_get = os.environ.get("SPECDEC_APT_GET") or shutil.which("apt-get")
    if not apt_get or not os.access(apt_get, os.X_OK):
        raise RuntimeError(
            "apt-get not found: the corpora are fetched from Debian's archive index by apt itself. "
            "Run on Debian/Ubuntu (package `apt`), or set SPECDEC_APT_GET=/path/to/apt-get."
        )
    return apt_get


def fetch_indexes(dest_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Fetches bookworm `main` Packages, Translation-en/-de and InRelease with `apt-get update`.

    apt runs with a private configuration (`-c FILE`) and private lists, cache and sources folders
    in a temporary folder under `dest_dir`; the system's apt state and hooks are left alone.
    Signatures are checked against the Debian archive keyring.

    Args:
      dest_dir: folder that receives the files, named as in `INDEX_FILES` (overwritten).

    Returns:
      {name: path} for each of `INDEX_FILES`.

    Raises:
      RuntimeError: apt-get or the keyring is missing, apt-get fails, or a file did not arrive.
    """
    apt_get = _apt_get()
    keyring = os.environ.get("SPECDEC_DEBIAN_KEYRING") or DEFAULT_KEYRING
    if not os.path.exists(keyring):
        raise RuntimeError(
            f"Debian archive keyring {keyring} not found: install the `debian-archive-keyring` "
            "package or set SPECDEC_DEBIAN_KEYRING=/path/to/debian-archive-keyring.gpg."
        )
    mirror = os.environ.get("SPECDEC_DEBIAN_MIRROR") or DEFAULT_MIRROR
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".apt-", dir=dest_dir) as work:
        work = pathlib.Path(work)
        lists, cache, parts = work / "lists", work / "cache", work / "sources.list.d"
        for folder in (lists / "partial", cache / "archives" / "partial", parts):
            folder.mkdir(parents=True)
        (parts / "debian.sources").write_text(
            f"Types: deb\nURIs: {mirror}\nSuites: {SUITE}\nComponents: {COMPONENT}\n"
            f"Architectures: {ARCHITECTURE}\nTargets: Packages Translations\nSigned-By: {keyring}\n"
        )
        config = work / "apt.conf"
        config.write_text(
            f'Dir::State::Lists "{lists}";\nDir::Cache "{cache}";\n'
            'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
            f'Dir::Etc::SourceList "/dev/null";\nDir::Etc::SourceParts "{parts}";\n'
            '#clear Acquire::Languages;\nAcquire::Languages { "en"; "de"; };\n'
            'Acquire::GzipIndexes "false";\n'
            "#clear APT::Update::Pre-Invoke;\n#clear APT::Update::Post-Invoke;\n"
            "#clear APT::Update::Post-Invoke-Success;\n"
            + ('APT::Sandbox::User "root";\n' if os.geteuid() == 0 else "")
        )
        logger.info(
            "Fetching Debian %s/%s index from %s with %s", SUITE, COMPONENT, mirror, apt_get
        )
        env = {**os.environ, "LC_ALL": "C"}
        proc = subprocess.run(
            [apt_get, "-c", str(config), "update"], capture_output=True, text=True, env=env
        )
        paths = {}
        for name, suffix in INDEX_FILES.items():
            found = sorted(lists.glob("*" + suffix))
            if proc.returncode != 0 or not found:
                raise RuntimeError(
                    f"apt-get update (exit {proc.returncode}) did not deliver {name}:\n"
                    f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
                )
            paths[name] = dest_dir / name
            shutil.move(found[0], paths[name])
    return paths


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_jsonl(path: pathlib.Path, rows: Iterable[Mapping[str, str]]) -> None:
    """Writes rows as UTF-8 JSON lines, atomically (temporary file, then rename)."""
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _write_corpus(
    data_dir: pathlib.Path, name: str, rows: Sequence[Mapping[str, str]], fields: Sequence[str]
) -> dict:
    """Splits rows by source package, writes `name/{split}.jsonl`, returns the manifest entry."""
    by_split = {split: [] for split in SPLITS}
    for row in rows:
        by_split[split_of(row["source"])].append(row)
    (data_dir / name).mkdir(parents=True, exist_ok=True)
    entry = {"splits": {}}
    for split, split_rows in by_split.items():
        path = data_dir / name / f"{split}.jsonl"
        _write_jsonl(path, split_rows)
        entry["splits"][split] = {
            "file": str(path.relative_to(data_dir)),
            "rows": len(split_rows),
            "source_packages": len({r["source"] for r in split_rows}),
            "words": {field: length_stats([r[field] for r in split_rows]) for field in fields},
        }
        logger.info(
            "%s/%s: %d rows, %d source packages, words %s",
            name,
            split,
            len(split_rows),
            entry["splits"][split]["source_packages"],
            entry["splits"][split]["words"],
        )
    entry["rows"] = len(rows)
    return entry


def _is_complete(manifest: Mapping, data_dir: pathlib.Path) -> bool:
    """Whether a manifest was written by this format version and all its corpus files exist."""
    if manifest.get("format_version") != FORMAT_VERSION:
        return False
    corpora = manifest.get("corpora", {})
    files = [s["file"] for c in corpora.values() for s in c["splits"].values()]
    return set(corpora) == {DDTP, SUMMARIZE} and all((data_dir / f).is_file() for f in files)


def _release_info(in_release: str) -> dict[str, str]:
    """Reads Codename, Version and Date from an InRelease file (clear-signed text)."""
    fields = {}
    for key in ("Codename", "Version", "Date"):
        match = re.search(rf"^{key}: (.*)$", in_release, flags=re.MULTILINE)
        fields[key.lower()] = match.group(1).strip() if match else ""
    return fields


def build_corpora(data_dir: str | os.PathLike | None = None, force: bool = False) -> dict:
    """Fetches the Debian index and writes both corpora and `manifest.json` (no-op when built).

    Args:
      data_dir: output folder; `default_data_dir()` when None.
      force: rebuild (and refetch) even if a complete manifest is present.

    Returns:
      The manifest: index checksums, release, row counts and word statistics per corpus and split,
      drop counts, build parameters and date.

    Raises:
      RuntimeError: the index could not be fetched (see `fetch_indexes`).
    """
    data_dir = pathlib.Path(data_dir).expanduser() if data_dir else default_data_dir()
    manifest_path = data_dir / "manifest.json"
    if manifest_path.exists() and not force:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if _is_complete(manifest, data_dir):
            logger.info("Corpora already built in %s (use --force to rebuild).", data_dir)
            return manifest
        logger.info("Manifest in %s is outdated or incomplete: rebuilding.", data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)  # A crash below must not leave a stale manifest.

    paths = fetch_indexes(data_dir / "index")
    checksums = {
        name: {
            "file": str(p.relative_to(data_dir)),
            "sha256": _sha256(p),
            "bytes": p.stat().st_size,
        }
        for name, p in paths.items()
    }
    for name, reference in REFERENCE_SHA256.items():
        if checksums[name]["sha256"] != reference:
            logger.warning(
                "%s sha256 %s differs from the reference bookworm one %s (a point release?): "
                "row counts will differ from the documented ones.",
                name,
                checksums[name]["sha256"],
                reference,
            )
    text = {name: path.read_text(encoding="utf-8") for name, path in paths.items()}
    sources = source_packages(parse_stanzas(text["Packages"]))
    en_stanzas = parse_stanzas(text["Translation-en"])
    de_stanzas = parse_stanzas(text["Translation-de"])
    ddtp, ddtp_counts = ddtp_rows(en_stanzas, de_stanzas, sources)
    summaries, summary_counts = summarization_rows(en_stanzas, sources)
    logger.info("%s: %s", DDTP, dict(ddtp_counts))
    logger.info("%s: %s", SUMMARIZE, dict(summary_counts))

    manifest = {
        "format_version": FORMAT_VERSION,
        "build_date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m specdec_t5x.data.build" + (" --force" if force else ""),
        "archive": {
            "mirror": os.environ.get("SPECDEC_DEBIAN_MIRROR") or DEFAULT_MIRROR,
            "suite": SUITE,
            "component": COMPONENT,
            "architecture": ARCHITECTURE,
            "release": _release_info(text["InRelease"]),
        },
        "index_files": checksums,
        "matches_reference_sha256": all(
            checksums[n]["sha256"] == ref for n, ref in REFERENCE_SHA256.items()
        ),
        "split_rule": SPLIT_RULE + ", else test",
        "binaries_without_source_entry": sum(s["Package"] not in sources for s in en_stanzas),
        "parameters": {
            "max_unsplit_words": MAX_UNSPLIT_WORDS,
            "max_length_ratio": MAX_LENGTH_RATIO,
            "min_document_words": MIN_DOCUMENT_WORDS,
            "max_document_words": MAX_DOCUMENT_WORDS,
            "max_documents_per_source": MAX_DOCUMENTS_PER_SOURCE,
        },
        "corpora": {
            DDTP: _write_corpus(data_dir, DDTP, ddtp, ("en", "de")),
            SUMMARIZE: _write_corpus(data_dir, SUMMARIZE, summaries, ("document", "synopsis")),
        },
    }
    manifest["corpora"][DDTP]["counts"] = dict(sorted(ddtp_counts.items()))
    manifest["corpora"][DDTP]["kinds"] = dict(collections.Counter(r["kind"] for r in ddtp))
    manifest["corpora"][SUMMARIZE]["counts"] = dict(sorted(summary_counts.items()))
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(manifest_path)
    logger.info("Wrote %s", manifest_path)
    return manifest


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: `python -m specdec_t5x.data.build [--data_dir DIR] [--force]`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=None, help="default: $SPECDEC_DATA_DIR or ~/.cache/…")
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    build_corpora(args.data_dir, force=args.force)


if __name__ == "__main__":
    main()
