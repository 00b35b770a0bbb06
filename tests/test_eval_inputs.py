"""eval_inputs: zero-padded token matrices and decoder batches."""

import numpy as np
import pytest

from specdec_t5x import inputs as inputs_lib


def test_pad_rows_pads_truncates_or_names_the_long_row():
    rows = [[5, 6, 7], [8], []]
    np.testing.assert_array_equal(
        inputs_lib.pad_rows(rows, 2), np.array([[5, 6], [8, 0], [0, 0]], np.int32)
    )
    assert inputs_lib.pad_rows(rows, 4).dtype == np.int32
    with pytest.raises(ValueError, match=r"inputs\[0\] has 3 tokens > inputs_len=2"):
        inputs_lib.pad_rows(rows, 2, truncate=False, name="inputs")


def test_decode_batch_shapes_and_zero_decoder_inputs():
    batch = inputs_lib.decode_batch([np.array([3, 4, 1]), [9, 1]], 4, 6)
    np.testing.assert_array_equal(batch["encoder_input_tokens"], [[3, 4, 1, 0], [9, 1, 0, 0]])
    assert batch["decoder_input_tokens"].shape == (2, 6) and not batch["decoder_input_tokens"].any()


def test_unknown_shipped_model_lists_the_shipped_names():
    from specdec_t5x import embedded

    with pytest.raises(FileNotFoundError, match=r"Shipped names: .*embedded_ende_target"):
        embedded.load_params("embedded_ende_targt")
