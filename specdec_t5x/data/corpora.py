"""The Debian corpora: names, splits and where they live (no Debian or apt code here).

`specdec_t5x.data.build` (and `specdec_t5x.data.correction`) write them, `specdec_t5x.tasks` reads
them (without importing the build):

    <data_dir>/ddtp_ende/{train,validation,test}.jsonl         {"en", "de", "kind", "package", "source"}
    <data_dir>/debian_summarize/{train,validation,test}.jsonl  {"document", "synopsis", "package", "source"}
    <data_dir>/ddtp_correct_en/{train,validation,test}.jsonl   {"en", "corrupted", "edits", "package", "source"}

Splits are by a stable hash of the *source* package, so binary families that share text never
straddle two splits.
"""

import hashlib
import os
import pathlib

DDTP = "ddtp_ende"
SUMMARIZE = "debian_summarize"
CORRECT = "ddtp_correct_en"
SPLITS = ("train", "validation", "test")
SPLIT_BOUNDS = (90, 95, 100)  # Cumulative percent of the source-package hash for each split.
SPLIT_RULE = "b = int.from_bytes(sha256(source)[:8], 'big') % 100: train b < 90, validation b < 95"


def split_of(source: str) -> str:
    """Returns the split of a source package from a stable hash of its name (`SPLIT_BOUNDS`).

    The bucket is the first 8 bytes of sha256(UTF-8 name), big-endian, % 100: < 90 train, < 95
    validation, else test.

    Args:
      source: str, the source package name.

    Returns:
      str, one of `SPLITS`; stable across runs, machines and Python versions.
    """
    bucket = int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") % 100
    return next(split for split, bound in zip(SPLITS, SPLIT_BOUNDS, strict=True) if bucket < bound)


def default_data_dir() -> pathlib.Path:
    """Returns `$SPECDEC_DATA_DIR`, or `~/.cache/specdec_t5x/data` when it is unset or empty."""
    return pathlib.Path(
        os.environ.get("SPECDEC_DATA_DIR") or "~/.cache/specdec_t5x/data"
    ).expanduser()
