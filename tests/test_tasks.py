"""Tests for specdec_t5x.tasks and specdec_t5x.vocab (imports seqio, hence TensorFlow: ~10 s).

Offline: the Debian tasks read a tiny data directory written here; the TFDS tasks run under
`tfds.testing.mock_data`, with the source's example count patched to None (the mocked split info is
empty, and seqio asks for it).
"""

import importlib

import pytest
import sentencepiece
import seqio
import tensorflow_datasets as tfds
from conftest import DDTP_ROWS, SUMMARY_ROWS

from specdec_t5x import tasks, vocab

LENGTHS = {"inputs": 48, "targets": 24}


def _examples(task_name, split="validation"):
    task = seqio.get_mixture_or_task(task_name)
    dataset = task.get_dataset(sequence_length=LENGTHS, split=split, shuffle=False)
    return list(dataset.as_numpy_iterator()), task.output_features["targets"].vocabulary


def _check_tokenized(examples, vocabulary, prefix):
    for ex in examples:
        inputs_text = ex["inputs_pretokenized"].decode()
        assert inputs_text.startswith(prefix)
        for key in ("inputs", "targets"):
            tokens = ex[key].tolist()
            assert tokens[-1] == vocabulary.eos_id == 1
            assert 1 not in tokens[:-1] and 0 not in tokens
            assert len(tokens) <= LENGTHS[key]
        if len(ex["inputs"]) < LENGTHS["inputs"]:  # Not trimmed: decodes back (spaces normalised).
            assert vocabulary.decode(ex["inputs"][:-1].tolist()) == " ".join(inputs_text.split())


def test_ddtp_task(data_dir):
    examples, vocabulary = _examples(tasks.DDTP_TASK)
    _check_tokenized(examples, vocabulary, "translate English to German: ")
    assert [ex["inputs_pretokenized"].decode() for ex in examples] == [
        "translate English to German: " + row["en"] for row in DDTP_ROWS
    ]
    assert [ex["targets_pretokenized"].decode() for ex in examples] == [r["de"] for r in DDTP_ROWS]
    assert seqio.get_mixture_or_task(tasks.DDTP_TASK).metric_fns[0] is tasks.metrics.bleu


def test_summarize_task_through_feature_converter(data_dir):
    examples, vocabulary = _examples(tasks.SUMMARIZE_TASK, split="test")
    _check_tokenized(examples, vocabulary, "summarize: ")
    assert (
        examples[0]["inputs_pretokenized"].decode() == "summarize: " + SUMMARY_ROWS[0]["document"]
    )
    assert [ex["targets_pretokenized"].decode() for ex in examples] == [
        "word counter",
        "zed library",
    ]

    dataset = seqio.get_dataset(
        tasks.SUMMARIZE_TASK,
        task_feature_lengths=LENGTHS,
        dataset_split="train",
        shuffle=True,
        seed=0,
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
    )
    batch = list(dataset.as_numpy_iterator())
    assert len(batch) == len(SUMMARY_ROWS)
    for ex in batch:
        assert ex["decoder_input_tokens"][0] == 0  # T5's decoder start id is pad.
        assert ex["encoder_input_tokens"].shape == (LENGTHS["inputs"],)


def test_data_dir_is_read_lazily(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "missing"))
    importlib.reload(tasks)  # Registering again is safe and reads no data.
    task = seqio.get_mixture_or_task(tasks.DDTP_TASK)
    with pytest.raises(FileNotFoundError, match="specdec_t5x.data.build"):
        task.get_dataset(sequence_length=LENGTHS, split="train")


def test_unknown_split_names_the_valid_ones():
    task = seqio.get_mixture_or_task(tasks.DDTP_TASK)
    with pytest.raises(
        ValueError, match=r"split must be one of \['train', 'validation', 'test'\].*'tset'"
    ):
        task.get_dataset(sequence_length=LENGTHS, split="tset")


def test_unknown_task_and_zero_examples_are_named():
    from specdec_t5x import inputs as inputs_lib

    with pytest.raises(ValueError, match=r"'ddtp_endee' \(gin: TASK\); did you mean ddtp_ende"):
        inputs_lib.load_examples("ddtp_endee", "test", 1, 8, 8)
    with pytest.raises(ValueError, match=r"NUM_EXAMPLES\) must be an int >= 1; got 0"):
        inputs_lib.load_examples(tasks.DDTP_TASK, "test", 0, 8, 8)


@pytest.fixture
def mocked_tfds(monkeypatch):
    monkeypatch.setattr(seqio.TfdsDataSource, "num_input_examples", lambda self, split: None)
    with tfds.testing.mock_data(num_examples=3):
        yield


@pytest.mark.parametrize(
    "task_name, prefix",
    [(tasks.WMT_TASK, "translate English to German: "), (tasks.CNN_DM_TASK, "summarize: ")],
)
def test_t5_paper_tasks_on_mock_tfds(mocked_tfds, task_name, prefix):
    examples, vocabulary = _examples(task_name)
    assert len(examples) == 3
    _check_tokenized(examples, vocabulary, prefix)
    dataset = seqio.get_dataset(
        task_name,
        task_feature_lengths=LENGTHS,
        dataset_split="validation",
        shuffle=False,
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
    )
    assert len(list(dataset.as_numpy_iterator())) == 3


def test_t5_vocabulary_from_env(monkeypatch):
    monkeypatch.setenv(tasks.T5_VOCAB_ENV, "/somewhere/cc_all.32000/sentencepiece.model")
    vocabulary = tasks.t5_vocabulary()
    assert vocabulary.sentencepiece_model_file == "/somewhere/cc_all.32000/sentencepiece.model"
    assert vocabulary.extra_ids == 100
    monkeypatch.delenv(tasks.T5_VOCAB_ENV)
    assert tasks.t5_vocabulary().sentencepiece_model_file == str(vocab.DEFAULT_VOCAB_PATH)


def _check_special_ids(vocabulary, pieces):
    assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
    assert vocabulary.vocab_size == pieces + 100
    assert vocabulary.encode("<extra_id_0>") == [pieces + 99]  # Sentinels at the top, reversed.
    assert vocabulary.decode([pieces]) == "<extra_id_99>"
    assert vocab.model_vocab_size(vocabulary) % 128 == 0
    assert vocab.model_vocab_size(vocabulary) - vocabulary.vocab_size < 128


def test_train_vocabulary_on_fixture(data_dir, tmp_path):
    path = vocab.train_vocabulary(
        data_dir, tmp_path / "tiny.model", vocab_size=300, hard_vocab_limit=False
    )
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    assert [processor.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert processor.bos_id() == -1
    assert (tmp_path / "tiny.vocab").read_text().startswith("<pad>\t0\n</s>\t0\n<unk>\t0\n")
    vocabulary = vocab.get_vocabulary(path)
    _check_special_ids(vocabulary, processor.get_piece_size())
    text = "Dieses Paket enthält die Dokumentation."
    assert vocabulary.decode(vocabulary.encode(text)) == text
    with pytest.raises(ValueError, match=".model"):
        vocab.train_vocabulary(data_dir, tmp_path / "tiny.spm")


def test_shipped_vocabulary():
    vocabulary = vocab.get_vocabulary()
    _check_special_ids(vocabulary, vocab.VOCAB_SIZE)
    assert vocab.model_vocab_size(vocabulary) == 8192
    for text in ("Größe und Übersetzung: »Zitat«.", "The quick brown fox jumps over the lazy dog."):
        assert vocabulary.decode(vocabulary.encode(text)) == text
    assert vocabulary.unk_id not in vocabulary.encode("Straße, Äpfel, Öl, über 100 €")


def test_summarize_task_metric_is_rouge_1_2_l_on_known_strings():
    (metric_fn,) = seqio.get_mixture_or_task(tasks.SUMMARIZE_TASK).metric_fns
    assert metric_fn is tasks.summary_rouge
    # rouge1: 2 of 3 unigrams match both ways (F = 2/3); rouge2: "the cat" of 2 bigrams (F = 1/2);
    # rougeL: LCS "the cat", 2 of 3 (F = 2/3). Second pair identical: 100 each.
    scores = metric_fn(["the cat sat", "zed library"], ["the cat ran", "zed library"])
    expected = {"rouge1": (200 / 3 + 100) / 2, "rouge2": (50 + 100) / 2}
    expected.update(rougeL=(200 / 3 + 100) / 2, rougeLsum=(200 / 3 + 100) / 2)
    assert scores == pytest.approx(expected)
    # Word order matters to ROUGE-L and ROUGE-2 only.
    swapped = metric_fn(["library for zed"], ["zed library for"])
    assert swapped["rouge1"] == pytest.approx(100.0)
    assert swapped["rougeL"] == pytest.approx(200 / 3) and swapped["rouge2"] == pytest.approx(50.0)
