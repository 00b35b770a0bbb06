"""Tests for specdec_t5x.data (debian parsing, corpora splits, apt mirror and fetch, build idempotence).

No network: the apt fetch is replaced by a fake apt-get script or by copying the fixture below,
written in Debian's stanza format (multi-paragraph descriptions, list items, a verbatim line, an
outdated translation whose md5 names no English text, a paragraph shared by two packages).
"""

import collections
import json
import logging
import pathlib

import pytest

from specdec_t5x.data import apt, build, corpora, debian

TRANSLATION_EN = """\
Package: acme
Description-md5: 5687670c9b5b74c97a071a6371818db8
Description-en: frobnicate widgets quickly
 Acme frobnicates widgets. It is fast, e.g. on large inputs.
 .
 Features:
  * colour output
  * plugins for bar and
    baz
 .
 Example:
   acme --frob widget.txt
 .
 This package contains the command-line tool.

Package: acme-doc
Description-md5: d46173292046ee3a8f82da3934653e8b
Description-en: frobnicate widgets quickly - documentation
 Acme frobnicates widgets. It is fast, e.g. on large inputs.
 .
 This package contains the documentation.

Package: libzed1
Description-md5: dfe97aef2641dc19cadc0a3dfcb2b075
Description-en: Zed
 Zed is a small library. It parses zed files.

Package: bar
Description-md5: 015c5083673848ed00b638ebed433635
Description-en: bar utility
 Bar does things.

Package: qux
Description-md5: b88b1c595c9ef62f9ffd298ca9c2fc60
Description-en: tool to count words in text files
 Qux reads one or more text files and counts the words, lines and characters
 in each of them. It prints one line per file and a total at the end. Unlike
 wc, it understands Unicode word boundaries and can skip comments in source
 code.
   qux --skip-comments *.c
 .
 This package contains the qux program and its manual page.
"""

TRANSLATION_DE = """\
Package: acme
Description-md5: 5687670c9b5b74c97a071a6371818db8
Description-de: Widgets schnell frobnizieren
 Acme frobniziert Widgets. Es ist schnell, z. B. bei großen Eingaben.
 .
 Funktionen:
  * farbige Ausgabe
  * Erweiterungen für bar und
    baz
 .
 Beispiel:
   acme --frob widget.txt
 .
 Dieses Paket enthält das Befehlszeilenwerkzeug.

Package: acme-doc
Description-md5: d46173292046ee3a8f82da3934653e8b
Description-de: Widgets schnell frobnizieren - Dokumentation
 Acme frobniziert Widgets. Es ist schnell, z. B. bei großen Eingaben.
 .
 Dieses Paket enthält die Dokumentation.

Package: libzed1
Description-md5: dfe97aef2641dc19cadc0a3dfcb2b075
Description-de: Zed
 Zed ist eine kleine Bibliothek. Sie liest Zed-Dateien.

Package: bar
Description-md5: 00000000000000000000000000000000
Description-de: Bar-Werkzeug
 Bar macht Dinge.
"""

# Sources chosen so that the fixture fills all three splits (pinned in test_split_of_is_stable).
PACKAGES = """\
Package: acme
Source: acmetools (1.0-1)
Version: 1.0-1+b1

Package: acme-doc
Source: acmetools
Version: 1.0-1

Package: libzed1
Source: zedtools
Version: 2.1-3

Package: bar
Version: 0.5-1
"""

IN_RELEASE = (
    "Origin: Debian\nCodename: bookworm\nVersion: 12.0\nDate: Sat, 10 Jun 2023 00:00:00 UTC\n"
)

ACME_PAIRS = [
    ("frobnicate widgets quickly", "Widgets schnell frobnizieren", "synopsis"),
    ("Acme frobnicates widgets.", "Acme frobniziert Widgets.", "sentence"),
    ("It is fast, e.g. on large inputs.", "Es ist schnell, z. B. bei großen Eingaben.", "sentence"),
    ("Features:", "Funktionen:", "sentence"),
    ("colour output", "farbige Ausgabe", "item"),
    ("plugins for bar and baz", "Erweiterungen für bar und baz", "item"),
    ("Example:", "Beispiel:", "sentence"),
    (
        "This package contains the command-line tool.",
        "Dieses Paket enthält das Befehlszeilenwerkzeug.",
        "sentence",
    ),
]


def _stanzas():
    sources = debian.source_packages(debian.parse_stanzas(PACKAGES))
    return debian.parse_stanzas(TRANSLATION_EN), debian.parse_stanzas(TRANSLATION_DE), sources


def test_parse_stanzas_keeps_continuation_lines():
    stanzas = debian.parse_stanzas(TRANSLATION_EN)
    assert [s["Package"] for s in stanzas] == ["acme", "acme-doc", "libzed1", "bar", "qux"]
    description = stanzas[0]["Description-en"]
    assert description.startswith("frobnicate widgets quickly\n Acme frobnicates")
    assert "\n .\n Features:\n  * colour output\n" in description
    with pytest.raises(ValueError, match="continuation"):
        debian.parse_stanzas(" orphan continuation\n")
    with pytest.raises(ValueError, match="Field: value"):
        debian.parse_stanzas("no colon here\n")


def test_description_md5_is_debians():
    for stanza in debian.parse_stanzas(TRANSLATION_EN):
        assert debian.description_md5(stanza["Description-en"]) == stanza["Description-md5"]


def test_split_description_and_units():
    synopsis, paragraphs = debian.split_description(
        debian.parse_stanzas(TRANSLATION_EN)[0]["Description-en"]
    )
    assert synopsis == "frobnicate widgets quickly"
    assert len(paragraphs) == 4
    assert paragraphs[2] == ["Example:", "  acme --frob widget.txt"]
    assert debian.is_verbatim(paragraphs[2][1]) and not debian.is_verbatim(paragraphs[2][0])
    assert debian.paragraph_units(paragraphs[1]) == [
        ("text", "Features:"),
        ("item", "colour output"),
        ("item", "plugins for bar and baz"),
    ]
    assert debian.paragraph_units(paragraphs[2]) == [("text", "Example:")]
    # A verbatim block between prose lines splits the prose into two blocks.
    assert debian.paragraph_units(["One.", "  code", "Two."]) == [
        ("text", "One."),
        ("text", "Two."),
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("One. Two! Three? 4 is a number.", ["One.", "Two!", "Three?", "4 is a number."]),
        ("Use it, e.g. With care. Done.", ["Use it, e.g. With care.", "Done."]),
        (
            "Zum Beispiel z. B. Dateien bzw. Ordner. Fertig.",
            ["Zum Beispiel z. B. Dateien bzw. Ordner.", "Fertig."],
        ),
        ("Version 1.2 is out. see also foo.", ["Version 1.2 is out. see also foo."]),
        ('He said "Hi." Then left.', ['He said "Hi."', "Then left."]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert debian.split_sentences(text) == expected


def test_align_descriptions_fallbacks():
    en = "syn\n One. Two.\n .\n Three."
    # Different paragraph counts: only the synopses pair.
    assert debian.align_descriptions(en, "Syn\n Eins. Zwei. Drei.") == [("syn", "Syn", "synopsis")]
    # Different sentence counts: the paragraph pairs whole.
    assert debian.align_descriptions(en, "Syn\n Eins, zwei.\n .\n Drei.") == [
        ("syn", "Syn", "synopsis"),
        ("One. Two.", "Eins, zwei.", "paragraph"),
        ("Three.", "Drei.", "sentence"),
    ]


def test_ddtp_rows_on_fixture():
    en, de, sources = _stanzas()
    rows, counts = debian.ddtp_rows(en, de, sources)
    pairs = [(r["en"], r["de"], r["kind"]) for r in rows]
    assert pairs[: len(ACME_PAIRS)] == ACME_PAIRS
    assert pairs[len(ACME_PAIRS) :] == [
        (
            "frobnicate widgets quickly - documentation",
            "Widgets schnell frobnizieren - Dokumentation",
            "synopsis",
        ),
        (
            "This package contains the documentation.",
            "Dieses Paket enthält die Dokumentation.",
            "sentence",
        ),
        ("Zed is a small library.", "Zed ist eine kleine Bibliothek.", "sentence"),
        ("It parses zed files.", "Sie liest Zed-Dateien.", "sentence"),
    ]
    assert counts["descriptions_md5_unmatched"] == 1  # bar: outdated translation.
    assert counts["dropped_duplicate"] == 2  # acme-doc repeats acme's first paragraph.
    assert counts["dropped_identical_or_empty"] == 1  # libzed1: "Zed" == "Zed".
    by_package = {r["package"]: r["source"] for r in rows}
    assert by_package == {"acme": "acmetools", "acme-doc": "acmetools", "libzed1": "zedtools"}


def test_summarization_rows_bounds_and_cap(monkeypatch):
    en, _, sources = _stanzas()
    rows, counts = debian.summarization_rows(en, sources)
    assert [(r["package"], r["source"], r["synopsis"]) for r in rows] == [
        ("qux", "qux", "tool to count words in text files")
    ]
    document = rows[0]["document"]
    assert document.startswith("Qux reads one or more text files")
    assert "--skip-comments" not in document  # The verbatim line is dropped.
    assert debian.MIN_DOCUMENT_WORDS <= len(document.split()) <= debian.MAX_DOCUMENT_WORDS
    assert counts["dropped_length"] == 4

    twins = [{**en[-1], "Package": f"qux{i}"} for i in range(3)]
    twins = [
        {**t, "Description-en": t["Description-en"] + f" Variant {i}."} for i, t in enumerate(twins)
    ]
    monkeypatch.setattr(debian, "MAX_DOCUMENTS_PER_SOURCE", 2)
    rows, counts = debian.summarization_rows(twins, {t["Package"]: "quxsrc" for t in twins})
    assert len(rows) == 2 and counts["dropped_source_cap"] == 1
    rows, counts = debian.summarization_rows(en[-1:] * 2, {})
    assert len(rows) == 1 and counts["dropped_duplicate"] == 1


def test_split_of_is_stable():
    # Pinned: changing the hash rule would silently reshuffle every split.
    assert corpora.split_of("acmetools") == "test"
    assert corpora.split_of("zedtools") == "validation"
    assert corpora.split_of("bar") == "train"
    assert corpora.split_of("coreutils") == "test"
    fractions = collections.Counter(corpora.split_of(f"src{i}") for i in range(20000))
    assert abs(fractions["train"] / 20000 - 0.90) < 0.01
    assert abs(fractions["validation"] / 20000 - 0.05) < 0.01


def _write_fixture_index(dest_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "Packages": PACKAGES,
        "Translation-en": TRANSLATION_EN,
        "Translation-de": TRANSLATION_DE,
        "InRelease": IN_RELEASE,
    }
    paths = {name: dest_dir / name for name in texts}
    for name, text in texts.items():
        paths[name].write_text(text, encoding="utf-8")
    return paths


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_build_corpora_writes_splits_and_is_idempotent(tmp_path, monkeypatch, caplog):
    calls = []

    def fake_fetch(dest_dir, mirror):
        calls.append(dest_dir)
        assert mirror == MIRROR
        return _write_fixture_index(dest_dir)

    monkeypatch.setenv("SPECDEC_DEBIAN_MIRROR", MIRROR)
    monkeypatch.setattr(apt, "fetch_indexes", fake_fetch)
    with caplog.at_level(logging.WARNING):
        manifest = build.build_corpora(tmp_path)
    assert len(calls) == 1
    assert "differs from the reference" in caplog.text
    assert manifest["matches_reference_sha256"] is False
    assert manifest["archive"]["release"]["version"] == "12.0"
    assert manifest["archive"]["mirror"] == MIRROR
    assert len(manifest["index_files"]["Translation-en"]["sha256"]) == 64

    ddtp = manifest["corpora"][corpora.DDTP]
    assert {s: ddtp["splits"][s]["rows"] for s in corpora.SPLITS} == {
        "train": 0,
        "validation": 2,
        "test": 10,
    }
    assert manifest["corpora"][corpora.SUMMARIZE]["splits"]["train"]["rows"] == 1
    splits_of_source = collections.defaultdict(set)
    for corpus in (corpora.DDTP, corpora.SUMMARIZE):
        for split in corpora.SPLITS:
            for row in _read_jsonl(tmp_path / corpus / f"{split}.jsonl"):
                assert row["package"] and row["source"]
                splits_of_source[row["source"]].add(split)
    assert all(len(splits) == 1 for splits in splits_of_source.values())
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest

    assert build.build_corpora(tmp_path) == manifest  # Second run: no fetch, same manifest.
    assert len(calls) == 1
    (tmp_path / corpora.DDTP / "test.jsonl").unlink()  # An incomplete build is redone.
    build.build_corpora(tmp_path)
    assert len(calls) == 2
    build.build_corpora(tmp_path, force=True)
    assert len(calls) == 3


MIRROR = "http://mirror.example/debian"  # A fake host: no test names a real mirror.

FAKE_APT_GET = """\
#!/bin/sh
# Fake apt-get: checks the private config, then "downloads" the index into its lists folder.
[ "$1" = "-c" ] && [ "$3" = "update" ] || exit 2
grep -q '^#clear Acquire::Languages;' "$2" || exit 3
grep -q '^Dir::Etc::SourceList "/dev/null";' "$2" || exit 4
lists=$(sed -n 's/^Dir::State::Lists "\\(.*\\)";$/\\1/p' "$2")
parts=$(sed -n 's/^Dir::Etc::SourceParts "\\(.*\\)";$/\\1/p' "$2")
grep -q '^Suites: bookworm$' "$parts/debian.sources" || exit 5
grep -q "^URIs: $EXPECTED_MIRROR$" "$parts/debian.sources" || exit 6
prefix="$lists/mirror.example_debian_dists_bookworm"
for name in main_binary-amd64_Packages main_i18n_Translation-en main_i18n_Translation-de InRelease
do echo "Package: $name" > "${prefix}_$name"; done
"""


def _fake_apt(tmp_path, monkeypatch):
    apt_get = tmp_path / "apt-get"
    apt_get.write_text(FAKE_APT_GET)
    apt_get.chmod(0o755)
    keyring = tmp_path / "keyring.gpg"
    keyring.write_bytes(b"")
    monkeypatch.setenv("SPECDEC_APT_GET", str(apt_get))
    monkeypatch.setenv("SPECDEC_DEBIAN_KEYRING", str(keyring))
    monkeypatch.setenv("EXPECTED_MIRROR", MIRROR)


def test_fetch_indexes_with_fake_apt_and_mirror_override(tmp_path, monkeypatch):
    _fake_apt(tmp_path, monkeypatch)
    monkeypatch.setenv("SPECDEC_DEBIAN_MIRROR", MIRROR + "/")
    paths = apt.fetch_indexes(tmp_path / "index")
    assert set(paths) == set(apt.INDEX_FILES)
    assert paths["Translation-de"].read_text() == "Package: main_i18n_Translation-de\n"
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == sorted(apt.INDEX_FILES)


def _apt_etc(tmp_path, sources_list="", parts=()):
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(sources_list)
    for name, text in parts:
        (etc / "sources.list.d" / name).write_text(text)
    return etc


def test_mirror_from_one_line_sources_list(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_DEBIAN_MIRROR", raising=False)
    etc = _apt_etc(
        tmp_path,
        "# a comment\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://other.example/x stable contrib\n"
        f"deb [ arch=amd64 ] {MIRROR}/ bookworm main contrib  # trailing comment\n",
    )
    assert apt.debian_mirror(etc) == MIRROR


def test_mirror_from_deb822_sources_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_DEBIAN_MIRROR", raising=False)
    etc = _apt_etc(
        tmp_path,
        parts=[
            (
                "a.sources",
                f"Types: deb\nURIs: {MIRROR}\nSuites: bookworm\nComponents: main\nEnabled: no\n",
            ),
            ("b.list.disabled", f"deb {MIRROR}-disabled bookworm main\n"),
            (
                "c.sources",
                "# comment\nTypes: deb deb-src\nURIs: http://mirror.example/d2\n"
                "Suites: bookworm bookworm-updates\nComponents: main\n"
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
            ),
        ],
    )
    assert apt.debian_mirror(etc) == "http://mirror.example/d2"


def test_mirror_falls_back_to_a_debian_keyring_source(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_DEBIAN_MIRROR", raising=False)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    etc = _apt_etc(
        tmp_path,
        f"deb [signed-by={keyring}] {MIRROR} trixie main\n",
        [("x.sources", "Types: deb\nURIs: http://other.example/x\nSuites: nodistro\n")],
    )
    assert apt.debian_mirror(etc) == MIRROR


def test_mirror_override_and_missing_mirror_error(tmp_path, monkeypatch):
    etc = _apt_etc(tmp_path, "deb http://other.example/ubuntu jammy main\n")
    monkeypatch.setenv("SPECDEC_DEBIAN_MIRROR", MIRROR)
    assert apt.debian_mirror(etc) == MIRROR
    monkeypatch.delenv("SPECDEC_DEBIAN_MIRROR")
    with pytest.raises(RuntimeError, match="no Debian mirror.*SPECDEC_DEBIAN_MIRROR"):
        apt.debian_mirror(etc)


def test_missing_apt_get_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_APT_GET", str(tmp_path / "no-apt-get"))
    with pytest.raises(RuntimeError, match="SPECDEC_APT_GET"):
        apt.fetch_indexes(tmp_path / "index")


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))
    assert corpora.default_data_dir() == tmp_path
    monkeypatch.delenv("SPECDEC_DATA_DIR")
    assert corpora.default_data_dir() == pathlib.Path.home() / ".cache/specdec_t5x/data"
