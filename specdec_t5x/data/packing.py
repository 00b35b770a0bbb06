"""Training data for `specdec_t5x.training.train`: JSONL text pairs, tokenized once, packed T5X-style.

* `read_jsonl_pairs`: `(input, target)` strings from a corpus built by `specdec_t5x.data.build`.
* `tokenize`: token ids with the project vocabulary (plain SentencePiece calls, no TensorFlow).
* `pack_rows` / `make_batch`: several examples share a row, told apart by
  `{encoder,decoder}_segment_ids` and restarting `{encoder,decoder}_positions` (T5X's packing,
  `seqio.utils.trim_and_pack_dataset`), so almost no compute goes to padding and every step has the
  same shapes (one compilation).
* `PackedBatches`: the endless, resumable training stream; `fixed_batches`: validation batches;
  `SourceBatches`: unpacked encoder inputs, one example per row, for generating decoder sequences
  with a model (on-policy distillation, `specdec_t5x.training.distill`).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

Batch = dict[str, np.ndarray]
Example = tuple[np.ndarray, np.ndarray]


def read_jsonl_pairs(
    corpus: str,
    split: str,
    input_field: str,
    target_field: str,
    data_dir: str | os.PathLike | None = None,
    max_examples: int | None = None,
) -> list[tuple[str, str]]:
    """Reads `(input, target)` text pairs from `<data_dir>/<corpus>/<split>.jsonl`.

    Args:
      corpus, split: e.g. `'ddtp_ende'`, `'train'` (layout of `specdec_t5x.data.build`).
      input_field, target_field: JSON keys, e.g. `'en'`, `'de'`.
      data_dir: default `$SPECDEC_DATA_DIR` or `~/.cache/specdec_t5x/data`.
      max_examples: keep the first this many rows (file order), or all when None.
    """
    if data_dir is None:
        data_dir = os.environ.get("SPECDEC_DATA_DIR") or "~/.cache/specdec_t5x/data"
    path = pathlib.Path(data_dir).expanduser() / corpus / f"{split}.jsonl"
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            pairs.append((row[input_field], row[target_field]))
            if max_examples is not None and len(pairs) >= max_examples:
                break
    return pairs


def tokenize(
    pairs: Sequence[tuple[str, str]],
    vocabulary,
    input_prefix: str,
    max_input_len: int,
    max_target_len: int,
    drop_long: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids of each pair, EOS appended (T5 convention: no BOS, EOS ends both sides).

    Args:
      pairs: `(input, target)` strings.
      vocabulary: anything with `encode(str) -> list[int]` and `eos_id` (a seqio vocabulary).
      input_prefix: prepended to every input (T5 task prefix, e.g. "translate English to German: ").
      max_input_len, max_target_len: token limits, EOS included.
      drop_long: drop pairs over a limit (training); otherwise truncate them, keeping EOS last.

    Returns:
      `(inputs int32 [n_in], targets int32 [n_tgt])` per kept pair.
    """
    eos = int(vocabulary.eos_id)
    out = []
    for source, target in pairs:
        x = list(vocabulary.encode(input_prefix + source)) + [eos]
        y = list(vocabulary.encode(target)) + [eos]
        if len(x) > max_input_len or len(y) > max_target_len:
            if drop_long:
                continue
            x, y = x[: max_input_len - 1] + [eos], y[: max_target_len - 1] + [eos]
        out.append((np.asarray(x, np.int32), np.asarray(y, np.int32)))
    return out


def pack_rows(
    lengths: np.ndarray, order: Sequence[int], input_len: int, target_len: int, open_rows: int = 8
) -> list[list[int]]:
    """Greedy first-fit packing of examples into rows of `input_len` / `target_len` tokens.

    Examples are taken in `order` and placed into the first of the last `open_rows` rows with room
    on both sides, else into a new row. E.g. lengths (in, tgt) [(3, 2), (4, 4), (2, 3)] with
    input_len = target_len = 6 give rows [[0, 2], [1]].

    Args:
      lengths: int [n, 2] input and target length of each example (each within the row lengths).
      order: example indices in placement order.
      input_len, target_len: row lengths.
      open_rows: how many recent rows stay candidates.

    Returns:
      Rows, each a list of example indices.
    """
    rows: list[list[int]] = []
    room: list[list[int]] = []  # [input room, target room] of each row
    candidates: list[int] = []  # indices of open rows
    for i in order:
        n_in, n_tgt = int(lengths[i, 0]), int(lengths[i, 1])
        for r in candidates:
            if room[r][0] >= n_in and room[r][1] >= n_tgt:
                break
        else:
            r = len(rows)
            rows.append([])
            room.append([input_len, target_len])
            candidates = (candidates + [r])[-open_rows:]
        rows[r].append(int(i))
        room[r][0] -= n_in
        room[r][1] -= n_tgt
    return rows


def make_batch(
    examples: Sequence[Example],
    rows: Sequence[Sequence[int]],
    input_len: int,
    target_len: int,
) -> Batch:
    """T5X packed feature dict for `rows` (from `pack_rows`): int32 [len(rows), len] arrays.

    Segment ids count from 1 within each row (0 = padding); positions restart at 0 in each segment;
    `decoder_input_tokens` are the targets shifted right per segment, starting with 0. A row
    holding examples ([5, 1] -> [7, 8, 1]) and ([6, 1] -> [9, 1]) gives
    `encoder_input_tokens` [5 1 6 1 0 ..], `encoder_segment_ids` [1 1 2 2 0 ..],
    `decoder_target_tokens` [7 8 1 9 1 0 ..], `decoder_input_tokens` [0 7 8 0 9 0 ..],
    `decoder_positions` [0 1 2 0 1 0 ..].
    """
    shape_in, shape_tgt = (len(rows), input_len), (len(rows), target_len)
    b = {
        "encoder_input_tokens": np.zeros(shape_in, np.int32),
        "encoder_segment_ids": np.zeros(shape_in, np.int32),
        "encoder_positions": np.zeros(shape_in, np.int32),
        "decoder_input_tokens": np.zeros(shape_tgt, np.int32),
        "decoder_target_tokens": np.zeros(shape_tgt, np.int32),
        "decoder_segment_ids": np.zeros(shape_tgt, np.int32),
        "decoder_positions": np.zeros(shape_tgt, np.int32),
    }
    for r, row in enumerate(rows):
        p_in = p_tgt = 0
        for segment, i in enumerate(row, start=1):
            x, y = examples[i]
            s_in, s_tgt = slice(p_in, p_in + len(x)), slice(p_tgt, p_tgt + len(y))
            b["encoder_input_tokens"][r, s_in] = x
            b["encoder_segment_ids"][r, s_in] = segment
            b["encoder_positions"][r, s_in] = np.arange(len(x))
            b["decoder_target_tokens"][r, s_tgt] = y
            b["decoder_input_tokens"][r, p_tgt + 1 : p_tgt + len(y)] = y[:-1]
            b["decoder_segment_ids"][r, s_tgt] = segment
            b["decoder_positions"][r, s_tgt] = np.arange(len(y))
            p_in, p_tgt = p_in + len(x), p_tgt + len(y)
    b["decoder_loss_weights"] = (b["decoder_target_tokens"] > 0).astype(np.float32)
    return b


class PackedBatches:
    """Endless, resumable stream of packed training batches (reshuffled and repacked per epoch).

    The order of epoch e is a permutation drawn from `(seed, e)`, so the position `(epoch, index)`
    alone reproduces the stream after a restart.

    Args:
      examples: tokenized pairs (`tokenize`).
      batch_size: rows per batch (a partial last batch of an epoch is dropped).
      input_len, target_len: row lengths.
      seed: shuffling seed.
    """

    def __init__(self, examples, batch_size: int, input_len: int, target_len: int, seed: int):
        self.examples, self.batch_size = examples, batch_size
        self.input_len, self.target_len, self.seed = input_len, target_len, seed
        self.lengths = np.asarray([(len(x), len(y)) for x, y in examples], np.int32)
        self.epoch, self.index = 0, 0
        self._rows: list[list[int]] | None = None

    def _epoch_rows(self) -> list[list[int]]:
        if self._rows is None:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.examples))
            self._rows = pack_rows(self.lengths, order, self.input_len, self.target_len)
            if len(self._rows) < self.batch_size:
                raise ValueError(
                    f"{len(self.examples)} examples pack into {len(self._rows)} rows, fewer than "
                    f"batch_size={self.batch_size}."
                )
        return self._rows

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.index, self._rows = int(state["epoch"]), int(state["index"]), None

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        rows = self._epoch_rows()
        if (self.index + 1) * self.batch_size > len(rows):
            self.epoch, self.index, self._rows = self.epoch + 1, 0, None
            rows = self._epoch_rows()
        batch_rows = rows[self.index * self.batch_size : (self.index + 1) * self.batch_size]
        self.index += 1
        return make_batch(self.examples, batch_rows, self.input_len, self.target_len)


def fixed_batches(examples, batch_size: int, input_len: int, target_len: int) -> list[Batch]:
    """Packed batches of `examples` in file order (validation loss); the last one may be short."""
    lengths = np.asarray([(len(x), len(y)) for x, y in examples], np.int32)
    rows = pack_rows(lengths, range(len(examples)), input_len, target_len)
    return [
        make_batch(examples, rows[i : i + batch_size], input_len, target_len)
        for i in range(0, len(rows), batch_size)
    ]


def padded_batches(
    examples: Sequence[Example], batch_size: int, input_len: int, target_len: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(encoder, decoder) int32 arrays of `examples` in file order, one zero-padded example per row."""
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        enc = np.zeros((len(chunk), input_len), np.int32)
        dec = np.zeros((len(chunk), target_len), np.int32)
        for r, (x, y) in enumerate(chunk):
            enc[r, : len(x)], dec[r, : len(y)] = x, y
        yield enc, dec


class SourceBatches:
    """Endless, resumable stream of encoder inputs, one example per row (for generation).

    Yields int32 [batch_size, input_len] `encoder_input_tokens` (each row one example's input,
    zero-padded; inputs longer than `input_len` are an error: tokenize with `drop_long=True`).
    Epoch e visits the examples in a permutation drawn from `(seed, e)`, so `(epoch, index)`
    reproduces the stream after a restart, as `PackedBatches`.

    Raises:
      ValueError: fewer examples than `batch_size`, or an input longer than `input_len`.
    """

    def __init__(self, examples: Sequence[Example], batch_size: int, input_len: int, seed: int):
        if len(examples) < batch_size:
            raise ValueError(f"{len(examples)} examples, fewer than batch_size={batch_size}.")
        too_long = [i for i, (x, _) in enumerate(examples) if len(x) > input_len]
        if too_long:
            raise ValueError(f"examples {too_long[:5]} have inputs over input_len={input_len}.")
        self.examples, self.batch_size, self.input_len = examples, batch_size, input_len
        self.seed, self.epoch, self.index = seed, 0, 0

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        if (self.index + 1) * self.batch_size > len(self.examples):
            self.epoch, self.index = self.epoch + 1, 0
        order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.examples))
        rows = order[self.index * self.batch_size : (self.index + 1) * self.batch_size]
        self.index += 1
        out = np.zeros((self.batch_size, self.input_len), np.int32)
        for r, i in enumerate(rows):
            x = self.examples[i][0]
            out[r, : len(x)] = x
        return out
