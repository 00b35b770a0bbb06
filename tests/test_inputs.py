"""inputs: zero-padded token matrices, decoder batches, and what the inputs lost or lack."""

import numpy as np
import pytest

from specdec_t5x import inputs as inputs_lib


def test_pad_rows_refuses_long_rows_by_default_and_says_when_it_truncates(caplog):
    rows = [[5, 6, 7], [8], []]
    assert inputs_lib.pad_rows(rows, 4).dtype == np.int32
    with pytest.raises(ValueError, match=r"inputs\[0\] has 3 tokens > inputs_len=2.*truncate=True"):
        inputs_lib.pad_rows(rows, 2, name="inputs")
    with caplog.at_level("WARNING"):
        np.testing.assert_array_equal(
            inputs_lib.pad_rows(rows, 2, truncate=True),
            np.array([[5, 6], [8, 0], [0, 0]], np.int32),
        )
    assert "cut 1 of 3 rows longer than 2 tokens (the longest had 3)" in caplog.text


class _Vocab:
    def encode(self, text):
        return [3] * len(text.split())


class _Feature:
    vocabulary = _Vocab()


class _Task:
    output_features = {"inputs": _Feature()}


def test_input_report_counts_shortfall_truncation_and_empty_inputs(caplog):
    examples = [
        {"inputs": np.array([4, 5, 1]), "inputs_pretokenized": "a b c d e"},  # 6 tokens > 4
        {"inputs": np.array([1]), "inputs_pretokenized": ""},  # EOS only
        {"inputs": np.array([4, 1]), "inputs_pretokenized": "a"},
    ]
    with caplog.at_level("WARNING"):
        report = inputs_lib.input_report(examples, 5, 4, _Task())
    assert report == {
        "requested": 5,
        "available": 3,
        "truncated": 1,
        "truncated_max_tokens": 6,
        "empty": 1,
    }
    assert "fewer than the 5 asked for" in caplog.text
    assert "1 of 3 inputs are longer than INPUT_LEN=4" in caplog.text
    assert "1 inputs are empty" in caplog.text


def test_decode_batch_shapes_and_zero_decoder_inputs():
    batch = inputs_lib.decode_batch([np.array([3, 4, 1]), [9, 1]], 4, 6)
    np.testing.assert_array_equal(batch["encoder_input_tokens"], [[3, 4, 1, 0], [9, 1, 0, 0]])
    assert batch["decoder_input_tokens"].shape == (2, 6) and not batch["decoder_input_tokens"].any()


def test_unknown_shipped_model_lists_the_shipped_names():
    from specdec_t5x import embedded

    with pytest.raises(FileNotFoundError, match=r"Shipped names: .*embedded_ende_target"):
        embedded.load_params("embedded_ende_targt")


def test_the_paper_path_without_tfds_data_names_the_dataset_and_never_downloads(
    tmp_path, monkeypatch
):
    from specdec_t5x import tasks

    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"'wmt_t2t_translate/de-en:1.0.0'.*not prepared"):
        inputs_lib.load_examples(tasks.WMT_TASK, "test", 1, 8, 8)
    assert not any(tmp_path.iterdir())  # nothing downloaded or prepared


@pytest.mark.parametrize(
    "path", ["gs://t5-data/vocabs/cc_all.32000/sentencepiece.model", "/no/spm"]
)
def test_an_unreadable_vocabulary_names_the_macro(path):
    from specdec_t5x import vocab

    with pytest.raises(FileNotFoundError, match="VOCAB_PATH"):
        vocab.get_vocabulary(path)
