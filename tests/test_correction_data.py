"""The text-correction corpus and its seqio task, on a tiny synthetic Debian index (no network).

The index below is in Debian's stanza format; its source packages fill all three splits
(acmetools: test, zedtools: validation, bar: train; pinned in test_data_build).
"""

import json

import pytest
import seqio

from specdec_t5x import metrics, tasks
from specdec_t5x.data import apt, build, corpora, correction, noise

TRANSLATION_EN = """\
Package: acme
Description-md5: 00000000000000000000000000000001
Description-en: frobnicate widgets quickly
 Acme frobnicates widgets in place. It is fast, e.g. on large inputs of many files.
 .
 Features:
  * colour output for the terminal and the web
 .
 Example:
   acme --frob widget.txt
 .
 This package contains the command-line tool and its manual page.

Package: acme-doc
Description-md5: 00000000000000000000000000000002
Description-en: frobnicate widgets quickly - documentation
 Acme frobnicates widgets in place. There are examples for each of their options.
 .
 This package contains the documentation.

Package: libzed1
Description-md5: 00000000000000000000000000000003
Description-en: Zed
 Zed is a small library that parses zed files. It has no dependencies
 .
 The library provides an interface to read and write zed files from C.

Package: bar
Description-md5: 00000000000000000000000000000004
Description-en: bar utility
 Bar does things. Bar is a utility that does a great many things for your shell scripts!
"""

PACKAGES = """\
Package: acme
Source: acmetools (1.0-1)

Package: acme-doc
Source: acmetools

Package: libzed1
Source: zedtools

Package: bar
"""

EXPECTED = {
    "test": [
        ("Acme frobnicates widgets in place.", "acme"),
        ("It is fast, e.g. on large inputs of many files.", "acme"),
        ("This package contains the command-line tool and its manual page.", "acme"),
        ("There are examples for each of their options.", "acme-doc"),
        ("This package contains the documentation.", "acme-doc"),
    ],
    "validation": [
        ("Zed is a small library that parses zed files.", "libzed1"),
        ("The library provides an interface to read and write zed files from C.", "libzed1"),
    ],
    "train": [("Bar is a utility that does a great many things for your shell scripts!", "bar")],
}


def _write_index(data_dir):
    (data_dir / "index").mkdir(parents=True, exist_ok=True)
    (data_dir / "index" / "Translation-en").write_text(TRANSLATION_EN, encoding="utf-8")
    (data_dir / "index" / "Packages").write_text(PACKAGES, encoding="utf-8")


def _rows(data_dir, split):
    path = data_dir / corpora.CORRECT / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_sentences_are_prose_deduplicated_and_split_by_source(tmp_path):
    _write_index(tmp_path)
    manifest = correction.build_correction_corpus(tmp_path)
    for split, expected in EXPECTED.items():
        rows = _rows(tmp_path, split)
        assert [(r["en"], r["package"]) for r in rows] == expected
        for row in rows:
            corruption = noise.corrupt(row["en"])
            assert row["corrupted"] == corruption.text
            assert row["edits"] == ",".join(corruption.kinds)
            assert row["source"] == {"acme": "acmetools", "acme-doc": "acmetools"}.get(
                row["package"], {"libzed1": "zedtools"}.get(row["package"], row["package"])
            )
    # Dropped: too short ("Features:", "Example:", "Bar does things.") or unterminated ("It has no
    # dependencies"); acme-doc's repeated first sentence. List items, synopses and verbatim lines
    # never enter.
    assert manifest["counts"]["dropped_duplicate"] == 1
    assert manifest["counts"]["dropped_not_a_sentence"] == 4
    assert manifest["counts"]["kept"] == manifest["rows"] == 8
    assert manifest["parameters"]["noise_version"] == noise.NOISE_VERSION
    assert manifest["splits"]["test"]["noise"]["sentences"] == 5
    on_disk = json.loads((tmp_path / corpora.CORRECT / "manifest.json").read_text())
    assert on_disk == manifest


def test_build_is_reproducible_and_idempotent(tmp_path, monkeypatch):
    _write_index(tmp_path)
    first = correction.build_correction_corpus(tmp_path)
    files = {s: (tmp_path / corpora.CORRECT / f"{s}.jsonl").read_bytes() for s in corpora.SPLITS}
    calls = []
    monkeypatch.setattr(correction, "sentence_rows", lambda *a: calls.append(a))
    assert correction.build_correction_corpus(tmp_path) == first  # no-op: nothing rebuilt
    assert not calls
    monkeypatch.undo()
    correction.build_correction_corpus(tmp_path, force=True)
    for split in corpora.SPLITS:  # same bytes after a rebuild
        assert (tmp_path / corpora.CORRECT / f"{split}.jsonl").read_bytes() == files[split]
    other = correction.build_correction_corpus(tmp_path, config=noise.NoiseConfig(salt="x"))
    assert other["parameters"]["noise"]["salt"] == "x"  # another configuration rebuilds


def test_cap_per_source_package(monkeypatch):
    stanzas = [
        {"Package": f"p{i}", "Description-en": f"syn\n Sentence number {i} is a long one."}
        for i in range(5)
    ]
    monkeypatch.setattr(correction, "MAX_SENTENCES_PER_SOURCE", 3)
    rows, counts = correction.sentence_rows(stanzas, {f"p{i}": "src" for i in range(5)})
    assert [r["package"] for r in rows] == ["p0", "p1", "p2"]
    assert counts["dropped_source_cap"] == 2


def test_missing_index_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="specdec_t5x.data.build"):
        correction.build_correction_corpus(tmp_path)


def test_build_corpora_also_builds_the_correction_corpus(tmp_path, monkeypatch):
    def fake_fetch(dest_dir, mirror):
        _write_index(dest_dir.parent)
        texts = {"Translation-de": "", "InRelease": "Codename: bookworm\n"}
        for name, text in texts.items():
            (dest_dir / name).write_text(text)
        return {name: dest_dir / name for name in apt.INDEX_FILES}

    monkeypatch.setenv("SPECDEC_DEBIAN_MIRROR", "http://mirror.example/debian")
    monkeypatch.setattr(apt, "fetch_indexes", fake_fetch)
    build.build_corpora(tmp_path)
    assert [r["en"] for r in _rows(tmp_path, "validation")] == [
        e for e, _ in EXPECTED["validation"]
    ]
    (
        tmp_path / corpora.CORRECT / "train.jsonl"
    ).unlink()  # an older data dir: built on the next run
    build.build_corpora(tmp_path)
    assert len(_rows(tmp_path, "train")) == 1


def test_correction_task_yields_corrupted_inputs_and_clean_targets(tmp_path, monkeypatch):
    _write_index(tmp_path)
    correction.build_correction_corpus(tmp_path)
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))
    task = seqio.get_mixture_or_task(tasks.CORRECT_TASK)
    assert tasks.CORRECT_TASK in tasks.TASK_NAMES and task.metric_fns == [metrics.correction_scores]
    dataset = task.get_dataset({"inputs": 64, "targets": 64}, split="test", shuffle=False)
    examples = list(dataset.as_numpy_iterator())
    rows = _rows(tmp_path, "test")
    assert [ex["inputs_pretokenized"].decode() for ex in examples] == [
        "correct: " + r["corrupted"] for r in rows
    ]
    assert [ex["targets_pretokenized"].decode() for ex in examples] == [r["en"] for r in rows]
    vocabulary = task.output_features["targets"].vocabulary
    for ex, row in zip(examples, rows, strict=True):
        assert ex["targets"][-1] == vocabulary.eos_id
        assert vocabulary.decode(ex["targets"][:-1].tolist()) == row["en"]
    assert any(r["corrupted"] != r["en"] for r in rows)  # the fixture's test split has noise


def test_correction_scores_on_known_strings():
    scores = metrics.correction_scores(
        ["It is fast.", "Zed parses files."], ["It is fast.", "Zed."]
    )
    assert scores["exact_match"] == 50.0
    assert 0.0 < scores["chrf"] < 100.0 and 0.0 < scores["bleu"] < 100.0
    perfect = metrics.correction_scores(["It is fast."], ["It is fast."])
    assert perfect["exact_match"] == 100.0 and perfect["chrf"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="1 targets but 2 predictions"):
        metrics.correction_scores(["a"], ["a", "b"])
