"""seqio tasks for the Debian corpora and T5's paper tasks (the only import-time side effects).

Importing this module registers

* `ddtp_ende`: DDTP English → German sentence pairs (`specdec_t5x.data.build`); inputs
  "translate English to German: " + en, targets de; metric BLEU.
* `debian_summarize`: Debian long description → synopsis; inputs "summarize: " + document,
  targets synopsis; metrics ROUGE-1/2/L/Lsum (`summary_rouge`).
* `ddtp_correct_en`: text correction (a grammatical-error-correction analogue in the spirit of
  C4_200M): inputs "correct: " + an English description sentence corrupted by the seeded noise
  model (`specdec_t5x.data.noise`, applied when the corpus is built by
  `specdec_t5x.data.correction`), targets the clean sentence; metrics exact match, chrF and BLEU
  (`metrics.correction_scores`).
* `wmt_t2t_ende_v003` and `cnn_dailymail_v002`: T5's WMT En→De and CNN/DailyMail tasks, as in
  `t5/data/tasks.py`, over TFDS (`wmt_t2t_translate/de-en:1.0.0`, `cnn_dailymail:3.4.0`; neither is
  downloadable from this project's machines, but the tasks work wherever TFDS has the data).

All follow T5: preprocess, tokenize, `CacheDatasetPlaceholder`, `append_eos_after_trim`; `inputs`
and `targets` with `add_eos=True` (`inputs` not required). The Debian tasks use the project
vocabulary (`vocab.get_vocabulary()`), and read `$SPECDEC_DATA_DIR` (default
`~/.cache/specdec_t5x/data`) when a dataset is created, not at import. T5's tasks use
`$SPECDEC_T5_VOCAB` when set (e.g. a local copy of gs://t5-data/vocabs/cc_all.32000/
sentencepiece.model, with T5's 100 extra ids), else the project vocabulary; or call
`register_t5_paper_tasks(vocabulary)`. Registering again (re-import, `importlib.reload`) replaces
the earlier definitions, including any made under the same names by `t5.data.tasks`.
"""

import functools
import json
import os
import pathlib

import seqio
import tensorflow as tf

from specdec_t5x import metrics, vocab
from specdec_t5x.data import corpora

DDTP_TASK = corpora.DDTP
SUMMARIZE_TASK = corpora.SUMMARIZE
CORRECT_TASK = corpora.CORRECT
CORRECT_PREFIX = "correct: "
WMT_TASK = "wmt_t2t_ende_v003"
CNN_DM_TASK = "cnn_dailymail_v002"
TASK_NAMES = (
    DDTP_TASK,
    SUMMARIZE_TASK,
    CORRECT_TASK,
    WMT_TASK,
    CNN_DM_TASK,
)  # what this project registers
T5_VOCAB_ENV = "SPECDEC_T5_VOCAB"
T5_PUBLIC_VOCAB = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
# The string fields of each corpus' JSONL rows (see `specdec_t5x.data.corpora`).
CORPUS_FIELDS = {
    corpora.DDTP: ("en", "de", "kind", "package", "source"),
    corpora.SUMMARIZE: ("document", "synopsis", "package", "source"),
    corpora.CORRECT: ("en", "corrupted", "edits", "package", "source"),
}
# English names of languages, as T5 takes them from babel.
_LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """T5's output features: `inputs` (optional) and `targets`, both with EOS appended."""
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
    }


@seqio.map_over_dataset
def translate(x: dict, source_language: str, target_language: str) -> dict:
    """T5's `translate`: "translate English to German: " + x[source] → x[target].

    Args:
      x: an example with string features named by language code ("en", "de").
      source_language: code of the input language.
      target_language: code of the output language.

    Returns:
      {"inputs": tf.string scalar, "targets": tf.string scalar}.
    """
    prefix = f"translate {_LANGUAGE_NAMES[source_language]} to {_LANGUAGE_NAMES[target_language]}: "
    return {
        "inputs": tf.strings.join([prefix, x[source_language]]),
        "targets": x[target_language],
    }


@seqio.map_over_dataset
def summarize(x: dict, article_key: str, summary_key: str) -> dict:
    """T5's `summarize`: "summarize: " + x[article_key] → x[summary_key].

    Args:
      x: an example with string features `article_key` and `summary_key`.
      article_key: feature holding the text to summarize.
      summary_key: feature holding the reference summary.

    Returns:
      {"inputs": tf.string scalar, "targets": tf.string scalar}.
    """
    return {
        "inputs": tf.strings.join(["summarize:", x[article_key]], separator=" "),
        "targets": x[summary_key],
    }


@seqio.map_over_dataset
def correct(x: dict, input_key: str = "corrupted", target_key: str = "en") -> dict:
    """Text correction: `CORRECT_PREFIX` + x[input_key] → x[target_key].

    Args:
      x: an example with string features `input_key` (the corrupted sentence) and `target_key`
        (the clean one).

    Returns:
      {"inputs": tf.string scalar, "targets": tf.string scalar}.
    """
    return {
        "inputs": tf.strings.join([CORRECT_PREFIX, x[input_key]]),
        "targets": x[target_key],
    }


def read_corpus(
    corpus: str, split: str, shuffle_files: bool, seed: int | None = None
) -> tf.data.Dataset:
    """Reads one split of a built corpus from the data directory into a `tf.data.Dataset`.

    The data directory is looked up now (`$SPECDEC_DATA_DIR` or its default), not at import. With
    `shuffle_files` the whole split is shuffled (it fits in memory), not only a window of it.

    Args:
      corpus: `corpora.DDTP`, `corpora.SUMMARIZE` or `corpora.CORRECT`.
      split: "train", "validation" or "test".
      shuffle_files: whether to shuffle the rows (reshuffled every epoch).
      seed: shuffle seed; None for a random one.

    Returns:
      Dataset of {field: tf.string scalar} for the fields in `CORPUS_FIELDS[corpus]`.

    Raises:
      ValueError: `split` not one of "train", "validation", "test".
      FileNotFoundError: the corpora are not built.
    """
    if split not in corpora.SPLITS:
        raise ValueError(
            f"split must be one of {list(corpora.SPLITS)} (gin: SPLIT); got {split!r}."
        )
    path = pathlib.Path(corpora.default_data_dir()) / corpus / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: build the corpora with `python -m specdec_t5x.data.build` "
            "(or point SPECDEC_DATA_DIR at a built data directory)."
        )
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    columns = {
        field: tf.constant([row[field] for row in rows], dtype=tf.string)
        for field in CORPUS_FIELDS[corpus]
    }
    dataset = tf.data.Dataset.from_tensor_slices(columns)
    if shuffle_files:
        dataset = dataset.shuffle(max(len(rows), 1), seed=seed, reshuffle_each_iteration=True)
    return dataset


SUMMARY_ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def summary_rouge(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """`debian_summarize`'s metric: ROUGE-1, ROUGE-2, ROUGE-L and T5's ROUGE-Lsum (rouge-score),
    each the mean F-measure x 100 over examples (`metrics.rouge_mean`: deterministic, no bootstrap,
    so eval reruns agree).

    Raises:
      ValueError: targets and predictions differ in length.
    """
    return metrics.rouge_mean(targets, predictions, score_keys=SUMMARY_ROUGE_KEYS)


def _add_task(name: str, source, preprocess, output_features, metric_fn) -> seqio.Task:
    """Registers (or re-registers, on re-import or reload) a text-to-text task: `preprocess` maps
    raw examples to {'inputs', 'targets'} text, then tokenization and EOS as in T5's tasks."""
    seqio.TaskRegistry.remove(name)
    preprocessors = [
        preprocess,
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=preprocessors,
        output_features=output_features,
        metric_fns=[metric_fn],
    )


_EN_DE = functools.partial(translate, source_language="en", target_language="de")


def _corpus_source(corpus: str) -> seqio.FunctionDataSource:
    return seqio.FunctionDataSource(functools.partial(read_corpus, corpus), splits=corpora.SPLITS)


def register_debian_tasks(vocabulary: seqio.Vocabulary | None = None) -> None:
    """Registers `ddtp_ende`, `debian_summarize` and `ddtp_correct_en` (project vocabulary when
    None)."""
    features = output_features(vocabulary or vocab.get_vocabulary())
    _add_task(DDTP_TASK, _corpus_source(corpora.DDTP), _EN_DE, features, metrics.bleu)
    synopsis = functools.partial(summarize, article_key="document", summary_key="synopsis")
    _add_task(SUMMARIZE_TASK, _corpus_source(corpora.SUMMARIZE), synopsis, features, summary_rouge)
    _add_task(
        CORRECT_TASK, _corpus_source(corpora.CORRECT), correct, features, metrics.correction_scores
    )


def t5_vocabulary() -> seqio.Vocabulary:
    """`$SPECDEC_T5_VOCAB` with T5's 100 extra ids when set, else the project vocabulary."""
    path = os.environ.get(T5_VOCAB_ENV)
    return vocab.get_vocabulary(path, check=False) if path else vocab.get_vocabulary()


def register_t5_paper_tasks(vocabulary: seqio.Vocabulary | None = None) -> None:
    """Registers T5's `wmt_t2t_ende_v003` and `cnn_dailymail_v002` (`t5_vocabulary()` when None).

    Args:
      vocabulary: e.g. `seqio.SentencePieceVocabulary(T5_PUBLIC_VOCAB, extra_ids=100)` where
        gs://t5-data is reachable, to evaluate T5's released checkpoints.
    """
    features = output_features(vocabulary or t5_vocabulary())
    wmt = seqio.TfdsDataSource(tfds_name="wmt_t2t_translate/de-en:1.0.0")
    _add_task(WMT_TASK, wmt, _EN_DE, features, metrics.bleu)
    cnn_dm = seqio.TfdsDataSource(tfds_name="cnn_dailymail:3.4.0")
    highlights = functools.partial(summarize, article_key="article", summary_key="highlights")
    _add_task(CNN_DM_TASK, cnn_dm, highlights, features, metrics.rouge)


register_debian_tasks()
register_t5_paper_tasks()
