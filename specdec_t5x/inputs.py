"""The eval job's inputs: examples of a seqio task, zero-padded int32 matrices, decoder batches.

`load_examples` tokenises a task split with T5's preprocessing (seqio, imported when called). The
eval job, the γ-control table, the Hugging Face comparison and the token export all feed the
decoders the same way (T5X's `predict_batch` contract): `encoder_input_tokens` int32
[batch, input_len], zero-padded, and `decoder_input_tokens` int32 [batch, max_decode_len], all zeros
for plain decoding (whose width sets the decode length). Importing this module loads NumPy and JAX
only (no seqio, TensorFlow).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger(__name__)


def pad_rows(
    rows: Sequence[Sequence[int]], length: int, *, truncate: bool = False, name: str = "row"
) -> np.ndarray:
    """int32 [len(rows), length]: each row's tokens, then zeros.

    Args:
      rows: token sequences (lists or int arrays), any lengths.
      length: width of the matrix.
      truncate: cut rows longer than `length` (their EOS too), with a warning that counts them;
        False (default) raises instead.
      name: what a row is called in the messages (e.g. 'inputs').

    Raises:
      ValueError: with truncate=False, a row longer than `length` (naming its index and length).
    """
    out = np.zeros((len(rows), length), np.int32)
    cut = []
    for i, row in enumerate(rows):
        if len(row) > length:
            if not truncate:
                raise ValueError(
                    f"{name}[{i}] has {len(row)} tokens > {name}_len={length}; pass a larger "
                    "length, or truncate=True to cut such rows (their EOS included)."
                )
            cut.append(len(row))
        out[i, : min(len(row), length)] = np.asarray(row[:length], np.int32)
    if cut:
        logger.warning(
            "pad_rows: cut %d of %d %ss longer than %d tokens (the longest had %d).",
            len(cut),
            len(rows),
            name,
            length,
            max(cut),
        )
    return out


def input_width(num_tokens: int, input_len: int) -> int:
    """The encoder width a text of `num_tokens` tokens (EOS included) is padded to: `input_len`,
    or `input_len` times the smallest power of two that holds it (64 -> 64, 65 -> 128, 200 -> 256
    for input_len 64), so the compiled programs are one per doubling, not one per length (the
    encoder runs at the length bucket that holds the text, `steps.bucketed`)."""
    width = input_len
    while width < num_tokens:
        width *= 2
    return width


def decode_batch(
    encoder_rows: Sequence[Sequence[int]], input_len: int, max_decode_len: int
) -> dict[str, jax.Array]:
    """{'encoder_input_tokens': int32 [n, input_len] (rows padded / truncated), 'decoder_input_tokens':
    int32 [n, max_decode_len] zeros} for `predict_batch_with_aux` of the n rows."""
    return {
        "encoder_input_tokens": jnp.asarray(pad_rows(encoder_rows, input_len, truncate=True)),
        "decoder_input_tokens": jnp.zeros((len(encoder_rows), max_decode_len), jnp.int32),
    }


def load_examples(
    task_name: str,
    split: str,
    num_examples: int,
    input_len: int,
    target_len: int,
    vocabulary=None,
):
    """Tokenised examples of a registered seqio task (T5's preprocessing, EOS appended).

    T5's paper tasks (`wmt_t2t_ende_v003`, `cnn_dailymail_v002`) are re-registered with
    `vocabulary` (the model's, from gin) when given, so tokeniser and model always agree.

    Returns:
      (examples, the seqio task, a report). Examples: dicts with `inputs` / `targets` int32
      NumPy arrays (unpadded, <= the lengths) and their `*_pretokenized` strings. The report
      (`input_report`, each finding also logged as a warning): {'requested', 'available',
      'truncated', 'truncated_max_tokens', 'empty'}.

    Raises:
      ValueError: num_examples < 1, an unknown task name (with close matches), or the task yields
        no examples for `split`.
    """
    import seqio

    from specdec_t5x import tasks  # registers the tasks

    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(
            f"num_examples (gin: NUM_EXAMPLES) must be an int >= 1; got {num_examples!r}."
        )
    if vocabulary is not None and task_name in (tasks.WMT_TASK, tasks.CNN_DM_TASK):
        tasks.register_t5_paper_tasks(vocabulary)
    known = sorted({*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()})
    if task_name not in known:
        close = difflib.get_close_matches(str(task_name), known, n=3)
        raise ValueError(
            f"no seqio task or mixture named {task_name!r} (gin: TASK)"
            + (f"; did you mean {', '.join(close)}?" if close else "")
            + f" This project registers {', '.join(tasks.TASK_NAMES)}."
        )
    task = seqio.get_mixture_or_task(task_name)
    check_tfds_prepared(task, split)
    ds = task.get_dataset(
        {"inputs": input_len, "targets": target_len},
        split=split,
        shuffle=False,
        num_epochs=1,
        use_cached=False,
    )
    examples = []
    for ex in ds.take(num_examples).as_numpy_iterator():
        examples.append(
            {
                "inputs": np.asarray(ex["inputs"], np.int32),
                "targets": np.asarray(ex["targets"], np.int32),
                "inputs_pretokenized": ex.get("inputs_pretokenized", b"").decode(),
                "targets_pretokenized": ex.get("targets_pretokenized", b"").decode(),
            }
        )
    if not examples:
        raise ValueError(f"task {task_name!r} has no examples in split {split!r}.")
    return examples, task, input_report(examples, num_examples, input_len, task)


def check_tfds_prepared(task, split: str) -> None:
    """Refuses a TFDS-backed task whose data is not prepared, before anything downloads it.

    seqio would start "Downloading and preparing dataset ..." inside the eval; this machine may
    have no network, and an eval should never download implicitly.

    Raises:
      FileNotFoundError: naming the dataset, where it looked (TFDS_DATA_DIR) and the command
        that prepares it.
    """
    loader = getattr(getattr(task, "source", None), "tfds_dataset", None)
    name = getattr(loader, "name", None)
    if name is None:
        return  # not a TFDS source (the Debian tasks read local JSONL)
    import tensorflow_datasets as tfds

    data_dir = getattr(loader, "data_dir", None) or os.environ.get("TFDS_DATA_DIR") or None
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        where = data_dir or f"{builder.data_dir} (TFDS_DATA_DIR unset)"
        raise FileNotFoundError(
            f"TFDS dataset {name!r} (split {split!r}, task {task.name!r}) is not prepared under "
            f"{where}. Prepare it where the data is reachable, e.g. `tfds build {name.split(':')[0]}"
            f" --data_dir=DIR`, copy DIR here and set TFDS_DATA_DIR=DIR; the eval never "
            "downloads."
        )


def input_report(examples, requested: int, input_len: int, task=None) -> dict[str, Any]:
    """What the inputs lost or lack, each finding logged as a warning.

    Args:
      examples: `load_examples` dicts; requested: the examples asked for; input_len: the
        encoder length they were cut to; task: the seqio task (its input vocabulary measures
        each untruncated input from its `inputs_pretokenized` text; None: not measured).

    Returns:
      {'requested', 'available' (examples in the split, up to `requested`), 'truncated'
      (inputs longer than input_len, EOS counted, cut to it), 'truncated_max_tokens' (the
      longest such input's tokens, or None), 'empty' (inputs with no token but EOS)}.
    """
    report = {"requested": requested, "available": len(examples)}
    if len(examples) < requested:
        logger.warning(
            "the split has %d examples, fewer than the %d asked for (NUM_EXAMPLES): running on %d.",
            len(examples),
            requested,
            len(examples),
        )
    lengths = []
    if task is not None and "inputs" in getattr(task, "output_features", {}):
        vocab = task.output_features["inputs"].vocabulary
        lengths = [len(vocab.encode(e["inputs_pretokenized"])) + 1 for e in examples]  # + EOS
    cut = [n for n in lengths if n > input_len]
    report.update(truncated=len(cut), truncated_max_tokens=max(cut, default=None))
    if cut:
        logger.warning(
            "%d of %d inputs are longer than INPUT_LEN=%d tokens and were cut to it (EOS "
            "included; the longest had %d tokens).",
            len(cut),
            len(examples),
            input_len,
            max(cut),
        )
    report["empty"] = sum(1 for e in examples if np.count_nonzero(e["inputs"]) <= 1)
    if report["empty"]:
        logger.warning(
            "%d inputs are empty (EOS only): their outputs are the model's guesses.",
            report["empty"],
        )
    return report


def example_batches(
    examples: Sequence[dict[str, Any]], batch_size: int, input_len: int, max_decode_len: int
) -> list[tuple[int, dict[str, jax.Array]]]:
    """`(n, decode_batch)` per `batch_size` consecutive examples (`load_examples` dicts); n is the
    number of real examples: the last batch is filled up by repeating its last example."""
    batches = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        rows = chunk + [chunk[-1]] * (batch_size - len(chunk))
        batches.append(
            (len(chunk), decode_batch([e["inputs"] for e in rows], input_len, max_decode_len))
        )
    return batches
