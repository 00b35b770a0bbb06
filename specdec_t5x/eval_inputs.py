"""Decoder inputs from token rows: zero-padded int32 matrices and the batches the decoders take.

The eval job, the γ-control table, the Hugging Face comparison and the token export all feed the
decoders the same way (T5X's `predict_batch` contract): `encoder_input_tokens` int32
[batch, input_len], zero-padded, and `decoder_input_tokens` int32 [batch, max_decode_len], all zeros
for plain decoding (whose width sets the decode length). NumPy and JAX only (no seqio, TensorFlow).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def pad_rows(
    rows: Sequence[Sequence[int]], length: int, *, truncate: bool = True, name: str = "row"
) -> np.ndarray:
    """int32 [len(rows), length]: each row's tokens, then zeros.

    Args:
      rows: token sequences (lists or int arrays), any lengths.
      length: width of the matrix.
      truncate: cut rows longer than `length`; False raises instead.
      name: what a row is called in the error message (e.g. 'inputs').

    Raises:
      ValueError: with truncate=False, a row longer than `length` (naming its index and length).
    """
    out = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        if len(row) > length and not truncate:
            raise ValueError(f"{name}[{i}] has {len(row)} tokens > {name}_len={length}.")
        out[i, : min(len(row), length)] = np.asarray(row[:length], np.int32)
    return out


def decode_batch(
    encoder_rows: Sequence[Sequence[int]], input_len: int, max_decode_len: int
) -> dict[str, jax.Array]:
    """{'encoder_input_tokens': int32 [n, input_len] (rows padded / truncated), 'decoder_input_tokens':
    int32 [n, max_decode_len] zeros} for `predict_batch_with_aux` of the n rows."""
    return {
        "encoder_input_tokens": jnp.asarray(pad_rows(encoder_rows, input_len)),
        "decoder_input_tokens": jnp.zeros((len(encoder_rows), max_decode_len), jnp.int32),
    }
