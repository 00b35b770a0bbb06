"""The project's SentencePiece vocabulary, with T5's conventions.

T5's public vocabulary (gs://t5-data/vocabs/cc_all.32000) is unreachable here, so the project trains
its own unigram SentencePiece model on the training splits of the Debian corpora
(`specdec_t5x.data.build`): DDTP English and German text plus the description → synopsis
documents and summaries. Conventions follow T5: pad 0 (also the decoder start id), eos 1, unk 2, no
bos, and 100 sentinel ids `<extra_id_0>` … `<extra_id_99>` added at the top by
`seqio.SentencePieceVocabulary` (`<extra_id_0>` is the highest id). The model's embedding table
is rounded up to a multiple of 128: 8000 + 100 → 8192.

The shipped model is `specdec_t5x/assets/vocab/spm_8k.model`, made with

    python -m specdec_t5x.data.build
    python -m specdec_t5x.vocab --out specdec_t5x/assets/vocab/spm_8k.model

seqio (and with it TensorFlow, seconds to import) is imported inside `get_vocabulary` only.
"""

import argparse
import io
import json
import logging
import os
import pathlib
from collections.abc import Iterator, Sequence

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_PATH = pathlib.Path(__file__).parent / "assets" / "vocab" / "spm_8k.model"
VOCAB_SIZE = 8000
EXTRA_IDS = 100
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# The training text: (corpus folder, JSONL fields), training split only.
TRAINING_FIELDS = (("ddtp_ende", ("en", "de")), ("debian_summarize", ("document", "synopsis")))


def training_texts(data_dir: str | os.PathLike) -> Iterator[str]:
    """Yields the vocabulary's training text: every field of `TRAINING_FIELDS` in the train splits.

    Args:
      data_dir: a folder built by `specdec_t5x.data.build`.

    Yields:
      str, one text (sentence, document or synopsis) at a time.

    Raises:
      FileNotFoundError: a train split is missing (build the corpora first).
    """
    for corpus, fields in TRAINING_FIELDS:
        path = pathlib.Path(data_dir) / corpus / "train.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run `python -m specdec_t5x.data.build`.")
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                yield from (row[field] for field in fields)


def train_vocabulary(
    data_dir: str | os.PathLike | None,
    out_path: str | os.PathLike = DEFAULT_VOCAB_PATH,
    vocab_size: int = VOCAB_SIZE,
    **trainer_options,
) -> pathlib.Path:
    """Trains a unigram SentencePiece model with T5's special ids on the training splits.

    Writes `out_path` (the `.model`) and the same name with `.vocab` (pieces and scores, text).

    Args:
      data_dir: folder built by `specdec_t5x.data.build`; its default when None.
      out_path: where to write the model; must end in ".model".
      vocab_size: pieces in the model, special and byte-fallback pieces included (sentinels not).
      **trainer_options: extra `SentencePieceTrainer.train` options (e.g. hard_vocab_limit=False).

    Returns:
      The model's path.

    Raises:
      ValueError: `out_path` does not end in ".model".
      FileNotFoundError: the corpora are not built.
    """
    import sentencepiece  # Lazy: only the vocabulary's author needs the trainer.

    from specdec_t5x.data import corpora

    out_path = pathlib.Path(out_path)
    if out_path.suffix != ".model":
        raise ValueError(f"out_path must end in .model, got {out_path}")
    data_dir = pathlib.Path(data_dir) if data_dir else corpora.default_data_dir()
    texts = (" ".join(text.split()) for text in training_texts(data_dir))  # No newlines inside.
    model = io.BytesIO()
    options = dict(
        sentence_iterator=texts,
        model_writer=model,  # In memory: no machine-specific paths end up in the model's spec.
        model_type="unigram",
        vocab_size=vocab_size,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        byte_fallback=True,
        character_coverage=1.0,  # Only ~256 distinct characters: keep them all (Ü, ß, »)...
        input_sentence_size=0,  # Use every text: no sampling, so the result is reproducible.
        max_sentence_length=16384,  # Bytes; documents run to 400 words.
        num_threads=2,
        minloglevel=1,
    )
    options.update(trainer_options)
    logger.info("Training SentencePiece on %s: %s", data_dir, options)
    sentencepiece.SentencePieceTrainer.train(**options)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    out_path.with_suffix(".vocab").write_text(
        "".join(
            f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
            for i in range(processor.get_piece_size())
        ),
        encoding="utf-8",
    )
    logger.info("Wrote %s", out_path)
    return out_path


def get_vocabulary(path: str | os.PathLike | None = None, check: bool = True):
    """Returns the project vocabulary as `seqio.SentencePieceVocabulary(path, extra_ids=100)`.

    Args:
      path: a SentencePiece `.model`; the shipped `DEFAULT_VOCAB_PATH` when None.
      check: refuse a remote or missing `path` now (False: seqio reads it lazily, at first use,
        as `tasks` does when registering at import).

    Returns:
      seqio.SentencePieceVocabulary with `vocab_size` = pieces + 100 (8100 for the shipped model).

    Raises:
      FileNotFoundError: `path` (gin: VOCAB_PATH) is a remote path (gs://, http...) or no file,
        checked before seqio reads it.
    """
    import seqio  # Lazy: seqio imports TensorFlow.

    path = str(path or DEFAULT_VOCAB_PATH)
    if check and "://" in path:
        raise FileNotFoundError(
            f"VOCAB_PATH {path!r} is remote; this job reads local files only: copy the "
            "SentencePiece .model here and pass --gin.VOCAB_PATH=\"'/path/to/spm.model'\"."
        )
    if check and not os.path.isfile(path):
        raise FileNotFoundError(
            f"VOCAB_PATH {path!r}: no such file (a SentencePiece .model; the shipped one is "
            f"{DEFAULT_VOCAB_PATH})."
        )
    return seqio.SentencePieceVocabulary(path, extra_ids=EXTRA_IDS)


def model_vocab_size(vocab) -> int:
    """The model's embedding/logit width: `vocab.vocab_size` rounded up to a multiple of 128."""
    return -(-vocab.vocab_size // 128) * 128


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: `python -m specdec_t5x.vocab [--data_dir DIR] [--out PATH]`."""
    parser = argparse.ArgumentParser(description="Train the project's SentencePiece vocabulary.")
    parser.add_argument("--data_dir", default=None, help="default: $SPECDEC_DATA_DIR or ~/.cache/…")
    parser.add_argument("--out", default=str(DEFAULT_VOCAB_PATH), help="the .model to write")
    parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    train_vocabulary(args.data_dir, args.out, vocab_size=args.vocab_size)


if __name__ == "__main__":
    main()
