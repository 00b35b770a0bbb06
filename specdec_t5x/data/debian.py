"""Debian's archive index as text: deb822 stanzas, DDTP descriptions, the two corpora's rows.

Pure functions of strings (no network, no files, no apt): `apt.fetch_indexes` fetches the index,
`build.build_corpora` writes what these functions return.

* `Translation-en` / `Translation-de` (Debian Description Translation Project, DDTP): every
  package's English description and its human-written German translation. A German stanza carries
  the `Description-md5` of the English text it translates, so the alignment is exact.
* `Packages`: the binary → source package mapping used for the splits (`corpus.split_of`).
"""

import collections
import hashlib
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence

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


def by_source(en_stanzas, sources):
    """`(stanza, package, source)` of each `Translation-en` stanza in (source, package) order.

    Args:
      en_stanzas: stanzas with `Package`; sources: {binary: source} (a binary not in it is its
        own source).
    """
    order = sorted(
        en_stanzas, key=lambda s: (sources.get(s["Package"], s["Package"]), s["Package"])
    )
    for stanza in order:
        package = stanza["Package"]
        yield stanza, package, sources.get(package, package)


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
    for stanza, package, source in by_source(en_stanzas, sources):
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
