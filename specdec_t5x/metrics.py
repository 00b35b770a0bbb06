"""Text-quality metrics with T5's settings (`t5/evaluation/metrics.py`): BLEU and ROUGE.

The paper reports speed and acceptance rates only; these metrics check that speculative decoding
leaves quality unchanged (it must, by construction). sacrebleu and rouge_score (which pulls in
nltk, slow to import) are imported on first use so that importing this module stays cheap.
"""

from collections.abc import Sequence

import numpy as np


def bleu(
    targets: Sequence[str] | Sequence[Sequence[str]],
    predictions: Sequence[str],
    tokenizer: str = "intl",
) -> dict[str, float]:
    """Computes BLEU score.

    Corpus-level sacreBLEU with T5's settings: smooth_method="exp", smooth_value=0.0, force=False,
    lowercase=False, use_effective_order=False.

    Args:
      targets: list of strings, or list of lists of strings (one list per example) if multiple
        references are present.
      predictions: list of strings, one per example.
      tokenizer: tokenizer option for corpus_bleu ("intl", as T5; "13a" is sacreBLEU's default).

    Returns:
      {"bleu": bleu score (0-100) across all targets and predictions}.

    Raises:
      ValueError: targets and predictions differ in length.
    """
    import sacrebleu  # Lazy: see the module docstring.

    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    if targets and not isinstance(targets[0], str):
        references = [list(stream) for stream in zip(*targets, strict=True)]  # [refs, examples]
    else:
        references = [list(targets)]  # corpus_bleu wants one list per reference stream.
    score = sacrebleu.corpus_bleu(
        list(predictions),
        references,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenizer,
        use_effective_order=False,
    )
    return {"bleu": score.score}


def _prepare_summary(summary: str) -> str:
    # Add newlines between sentences so that rougeLsum is computed correctly.
    return summary.replace(" . ", " .\n")


def _pair_scores(targets, predictions, score_keys, **kwargs):
    """RougeScorer scores of each (target, prediction) pair, sentence breaks marked for rougeLsum.

    Raises:
      ValueError: targets and predictions differ in length.
    """
    from rouge_score import rouge_scorer  # Lazy: see the module docstring.

    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys), **kwargs)
    for target, prediction in zip(targets, predictions, strict=True):
        yield scorer.score(target=_prepare_summary(target), prediction=_prepare_summary(prediction))


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **kwargs,
) -> dict[str, float]:
    """Computes rouge score nondeterministically using the bootstrap.

    Args:
      targets: list of strings.
      predictions: list of strings.
      score_keys: list of strings with the keys to compute.
      **kwargs: additional keyword arguments for RougeScorer (e.g. use_stemmer=True).

    Returns:
      dict with score_key: rouge score (mid F-measure of the bootstrap, × 100) across all targets
      and predictions.

    Raises:
      ValueError: targets and predictions differ in length.
    """
    from rouge_score import scoring  # Lazy: see the module docstring.

    aggregator = scoring.BootstrapAggregator()
    for scores in _pair_scores(targets, predictions, score_keys, **kwargs):
        aggregator.add_scores(scores)
    result = aggregator.aggregate()
    return {key: result[key].mid.fmeasure * 100 for key in score_keys}


def rouge_mean(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **kwargs,
) -> dict[str, float]:
    """`rouge` without the bootstrap, so reruns agree: {score_key: mean F-measure × 100 over the
    (target, prediction) pairs}. Same arguments and errors as `rouge`."""
    totals: dict[str, float] = {key: 0.0 for key in score_keys}
    for scores in _pair_scores(targets, predictions, score_keys, **kwargs):
        for key in score_keys:
            totals[key] += scores[key].fmeasure
    return {key: 100 * totals[key] / max(len(targets), 1) for key in score_keys}


def until_eos(tokens: Sequence[int] | np.ndarray, eos_id: int) -> list[int]:
    """Tokens up to and including the first EOS (the padding after it dropped)."""
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def decode_text(vocabulary, tokens: np.ndarray, eos_id: int) -> str:
    """Text of int32 [len] tokens up to EOS (space-separated ids without a vocabulary)."""
    ids = [t for t in until_eos(tokens, eos_id) if t != eos_id]
    return vocabulary.decode(ids) if vocabulary is not None else " ".join(map(str, ids))


def quality(seqio_task, vocabulary, examples, tokens, eos_id) -> dict[str, float]:
    """The task's own seqio metrics (BLEU, ROUGE, ...) of decoded tokens against the references."""
    predictions = [decode_text(vocabulary, t, eos_id) for t in tokens]
    targets = [e["targets_pretokenized"] for e in examples]
    scores = {}
    for metric_fn in seqio_task.metric_fns:
        scores.update({k: float(v) for k, v in metric_fn(targets, predictions).items()})
    return scores


def correction_scores(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """`ddtp_correct_en`'s metrics: exact match (% of predictions equal to their reference),
    corpus chrF (sacreBLEU defaults: character 6-grams, β = 2) and BLEU (`metrics.bleu`), 0-100.

    Raises:
      ValueError: targets and predictions differ in length.
    """
    import sacrebleu  # lazy, as in `bleu`

    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    exact = sum(t == p for t, p in zip(targets, predictions, strict=True))
    chrf = sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score
    return {
        "exact_match": 100.0 * exact / max(len(targets), 1),
        "chrf": chrf,
        **bleu(targets, predictions),
    }
