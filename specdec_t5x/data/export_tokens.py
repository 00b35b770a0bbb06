"""Exports an eval split as token ids only (`.npz`), for machines without seqio/TensorFlow.

`python -m specdec_t5x.data.export_tokens --out FILE.npz [--task ddtp_ende --split test
--num_examples 64 --input_len 64 --target_len 64]` tokenises the first examples of a registered
seqio task exactly as the eval job does (`inputs_lib.load_examples`: T5 preprocessing, EOS
appended) and writes:

* `inputs`  int32 [num_examples, input_len]: encoder input ids, zero-padded;
* `targets` int32 [num_examples, target_len]: reference target ids, zero-padded;
* `meta`    a 0-d unicode array holding JSON (task, split, vocabulary file, eos_id, lengths, date).

`read_tokens` loads it with NumPy alone (no pickle); `benchmarks.accelerator` reads its inputs this way.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from specdec_t5x import inputs as inputs_lib
from specdec_t5x import provenance


def write_tokens(
    path: str | os.PathLike,
    inputs: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    input_len: int,
    target_len: int,
    meta: dict[str, Any],
) -> pathlib.Path:
    """Writes unpadded int token arrays as zero-padded int32 matrices plus JSON `meta`.

    Raises:
      ValueError: an example longer than its length, or inputs/targets of different counts.
    """
    if len(inputs) != len(targets):
        raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets.")

    def pad(rows, length, name):
        return inputs_lib.pad_rows(rows, length, truncate=False, name=name)

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "input_len": int(input_len), "target_len": int(target_len)}
    with open(path, "wb") as f:
        np.savez_compressed(
            f,
            inputs=pad(inputs, input_len, "inputs"),
            targets=pad(targets, target_len, "targets"),
            meta=np.asarray(json.dumps(meta, sort_keys=True)),
        )
    return path


def read_tokens(path: str | os.PathLike) -> dict[str, Any]:
    """`{'inputs': int32 [n, input_len], 'targets': int32 [n, target_len], 'meta': dict}`.

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file lacks `inputs`, `targets` or `meta`.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no token file at {path}; make one with `python -m specdec_t5x.data.export_tokens`."
        )
    with np.load(path, allow_pickle=False) as data:
        missing = {"inputs", "targets", "meta"} - set(data.files)
        if missing:
            raise ValueError(f"{path} lacks {sorted(missing)}; it has {data.files}.")
        return {
            "inputs": data["inputs"].astype(np.int32),
            "targets": data["targets"].astype(np.int32),
            "meta": json.loads(str(data["meta"])),
        }


def main(argv: Sequence[str] | None = None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output .npz file")
    parser.add_argument("--task", default="ddtp_ende")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_examples", type=int, default=64)
    parser.add_argument("--input_len", type=int, default=64)
    parser.add_argument("--target_len", type=int, default=64)
    args = parser.parse_args(argv)

    from specdec_t5x import vocab  # seqio/TF live in load_examples and vocab, not in the reader

    vocabulary = vocab.get_vocabulary()
    examples, _, _ = inputs_lib.load_examples(
        args.task, args.split, args.num_examples, args.input_len, args.target_len, vocabulary
    )
    meta = {
        "task": args.task,
        "split": args.split,
        "num_examples": len(examples),
        "vocabulary": pathlib.Path(vocabulary.sentencepiece_model_file).name,
        "eos_id": int(vocabulary.eos_id),
        "date": provenance.utc_date(),
        "commit": provenance.git_commit(),
        "command": "python -m specdec_t5x.data.export_tokens "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    path = write_tokens(
        args.out,
        [e["inputs"] for e in examples],
        [e["targets"] for e in examples],
        args.input_len,
        args.target_len,
        meta,
    )
    print(f"{len(examples)} examples -> {path}")
    return path


if __name__ == "__main__":
    main()
