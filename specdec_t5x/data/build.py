"""Builds the Debian corpora: DDTP En→De pairs, description→synopsis pairs, correction pairs.

Both come from Debian's own archive index for **bookworm** `main` (`apt.fetch_indexes`, with the
machine's apt and its configured mirror); `debian` turns the index text into rows; this module
splits them (`corpora.split_of`) and writes, under the data directory (`$SPECDEC_DATA_DIR`, default
`~/.cache/specdec_t5x/data`):

    ddtp_ende/{train,validation,test}.jsonl         {"en", "de", "kind", "package", "source"}
    debian_summarize/{train,validation,test}.jsonl  {"document", "synopsis", "package", "source"}
    index/{Packages,Translation-en,Translation-de,InRelease}   the fetched index files
    manifest.json                                   checksums, row counts, length statistics, date
    ddtp_correct_en/...                             the text-correction corpus and its own
                                                    manifest (`specdec_t5x.data.correction`)

A second run with `manifest.json` present is a no-op.

Usage:

    python -m specdec_t5x.data.build [--data_dir DIR] [--force]

Environment: `SPECDEC_DATA_DIR` (output) and those of `specdec_t5x.data.apt`. Each description is
under its package's licence: rows keep the package names for attribution; never commit the corpus
text.
"""

import argparse
import collections
import hashlib
import json
import logging
import os
import pathlib
import re
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence

from specdec_t5x import provenance
from specdec_t5x.data import apt, corpora, debian

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Seen for bookworm main (Debian 12); a point release may change them (warn, don't fail).
REFERENCE_SHA256 = {
    "Translation-de": "adac331fc51f9a00c1b4120b4ac87423be2b1f1615d4f288c7cbc2d5258c0650",
    "Translation-en": "62f59c3cdca9786e4f7adf9002f9f5729a684adcb4667e58e448dec9b5a46c7f",
}


def sha256(path: pathlib.Path) -> str:
    """Hex SHA-256 of the file at `path` (read in 1 MiB blocks)."""
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


def write_corpus(
    data_dir: pathlib.Path, name: str, rows: Sequence[Mapping[str, str]], fields: Sequence[str]
) -> dict:
    """Splits rows by source package, writes `name/{split}.jsonl`, returns the manifest entry."""
    by_split = {split: [] for split in corpora.SPLITS}
    for row in rows:
        by_split[corpora.split_of(row["source"])].append(row)
    (data_dir / name).mkdir(parents=True, exist_ok=True)
    entry = {"splits": {}}
    for split, split_rows in by_split.items():
        path = data_dir / name / f"{split}.jsonl"
        _write_jsonl(path, split_rows)
        entry["splits"][split] = {
            "file": str(path.relative_to(data_dir)),
            "rows": len(split_rows),
            "source_packages": len({r["source"] for r in split_rows}),
            "words": {
                field: debian.length_stats([r[field] for r in split_rows]) for field in fields
            },
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
    built = manifest.get("corpora", {})
    files = [s["file"] for c in built.values() for s in c["splits"].values()]
    return set(built) == {corpora.DDTP, corpora.SUMMARIZE} and all(
        (data_dir / f).is_file() for f in files
    )


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
      data_dir: output folder; `corpora.default_data_dir()` when None.
      force: rebuild (and refetch) even if a complete manifest is present.

    Returns:
      The manifest: index checksums, release, row counts and word statistics per corpus and split,
      drop counts, build parameters and date.

    Raises:
      RuntimeError: the index could not be fetched (see `apt.fetch_indexes`).
    """
    data_dir = pathlib.Path(data_dir).expanduser() if data_dir else corpora.default_data_dir()
    manifest_path = data_dir / "manifest.json"
    if manifest_path.exists() and not force:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if _is_complete(manifest, data_dir):
            logger.info("Corpora already built in %s (use --force to rebuild).", data_dir)
            _build_correction(data_dir, force=False)
            return manifest
        logger.info("Manifest in %s is outdated or incomplete: rebuilding.", data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)  # A crash below must not leave a stale manifest.

    mirror = apt.debian_mirror()
    paths = apt.fetch_indexes(data_dir / "index", mirror)
    checksums = {
        name: {
            "file": str(p.relative_to(data_dir)),
            "sha256": sha256(p),
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
    sources = debian.source_packages(debian.parse_stanzas(text["Packages"]))
    en_stanzas = debian.parse_stanzas(text["Translation-en"])
    de_stanzas = debian.parse_stanzas(text["Translation-de"])
    ddtp, ddtp_counts = debian.ddtp_rows(en_stanzas, de_stanzas, sources)
    summaries, summary_counts = debian.summarization_rows(en_stanzas, sources)
    logger.info("%s: %s", corpora.DDTP, dict(ddtp_counts))
    logger.info("%s: %s", corpora.SUMMARIZE, dict(summary_counts))

    manifest = {
        "format_version": FORMAT_VERSION,
        "build_date": provenance.utc_date(),
        "commit": provenance.git_commit(),
        "command": "python -m specdec_t5x.data.build" + (" --force" if force else ""),
        "archive": {
            "mirror": mirror,
            "suite": apt.SUITE,
            "component": apt.COMPONENT,
            "architecture": apt.ARCHITECTURE,
            "release": _release_info(text["InRelease"]),
        },
        "index_files": checksums,
        "matches_reference_sha256": all(
            checksums[n]["sha256"] == ref for n, ref in REFERENCE_SHA256.items()
        ),
        "split_rule": corpora.SPLIT_RULE + ", else test",
        "binaries_without_source_entry": sum(s["Package"] not in sources for s in en_stanzas),
        "parameters": {
            "max_unsplit_words": debian.MAX_UNSPLIT_WORDS,
            "max_length_ratio": debian.MAX_LENGTH_RATIO,
            "min_document_words": debian.MIN_DOCUMENT_WORDS,
            "max_document_words": debian.MAX_DOCUMENT_WORDS,
            "max_documents_per_source": debian.MAX_DOCUMENTS_PER_SOURCE,
        },
        "corpora": {
            corpora.DDTP: write_corpus(data_dir, corpora.DDTP, ddtp, ("en", "de")),
            corpora.SUMMARIZE: write_corpus(
                data_dir, corpora.SUMMARIZE, summaries, ("document", "synopsis")
            ),
        },
    }
    manifest["corpora"][corpora.DDTP]["counts"] = dict(sorted(ddtp_counts.items()))
    manifest["corpora"][corpora.DDTP]["kinds"] = dict(collections.Counter(r["kind"] for r in ddtp))
    manifest["corpora"][corpora.SUMMARIZE]["counts"] = dict(sorted(summary_counts.items()))
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(manifest_path)
    logger.info("Wrote %s", manifest_path)
    _build_correction(data_dir, force=True)  # a new index: its sentences again
    return manifest


def _build_correction(data_dir: pathlib.Path, force: bool) -> None:
    """Builds the text-correction corpus from the fetched index (`correction`; imported here:
    it imports this module)."""
    from specdec_t5x.data import correction

    correction.build_correction_corpus(data_dir, force=force)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: `python -m specdec_t5x.data.build [--data_dir DIR] [--force]`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=None, help="default: $SPECDEC_DATA_DIR or ~/.cache/…")
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    parser.add_argument("--verbose", action="store_true", help="on an error, the traceback too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        build_corpora(args.data_dir, force=args.force)
    except (RuntimeError, ValueError, OSError) as err:  # a missing resource: one line
        if args.verbose:
            traceback.print_exc()
        print(error_line(err), file=sys.stderr, flush=True)
        sys.exit(1)


def error_line(err: BaseException) -> str:
    """`error: <first line of the message>`, with apt's own `E:` line (which names the mirror
    and what it lacks) appended when the message carries apt-get's output; `--verbose` for
    the traceback."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return f"error: {type(err).__name__} (--verbose prints the traceback)"
    apt_errors = [line for line in lines[1:] if line.startswith("E:")]
    return "error: " + " ".join([lines[0], *apt_errors[-1:]]) + " (--verbose: the traceback)"


if __name__ == "__main__":
    main()
