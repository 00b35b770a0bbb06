"""Evaluation and curves of training runs (`specdec_t5x.training.train`): validation loss, greedy decodes
scored by BLEU or ROUGE, and the loss/quality plot of `metrics.jsonl` files.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import metrics, models

Array = jax.Array
Batch = dict[str, np.ndarray]


def make_eval_loss(model: models.EncoderDecoderModel) -> Callable[..., dict[str, Array]]:
    """Jitted `(params, batch) -> {'loss_sum', 'num_tokens'}` (teacher-forced, no dropout)."""

    def eval_loss(params, batch):
        loss, m = model.loss_fn(params, batch, None)
        return {"loss_sum": loss * m["num_tokens"], "num_tokens": m["num_tokens"]}

    return jax.jit(eval_loss)


def validation_loss(eval_loss, params, batches: Sequence[Batch]) -> float:
    """Token-weighted mean cross-entropy over `batches`."""
    totals = [eval_loss(params, b) for b in batches]
    loss_sum = sum(float(t["loss_sum"]) for t in totals)
    return loss_sum / max(sum(float(t["num_tokens"]) for t in totals), 1.0)


def make_greedy_decode(model: models.EncoderDecoderModel) -> Callable[[Any, Batch], Array]:
    """Jitted `(params, batch) -> int32 [batch, decode_len]` greedy decodes (argmax, no top-k)."""

    def decode(params, batch):
        decoder_params = {"temperature": 0.0, "topk": 0}
        return model.predict_batch_with_aux(params, batch, decoder_params=decoder_params)[0]

    return jax.jit(decode)


def greedy_translations(
    greedy_decode,
    params,
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    vocabulary,
    batch_size: int,
    input_len: int,
    decode_len: int,
) -> list[str]:
    """Greedy decodes of each example's inputs, detokenized (EOS and padding removed).

    Batches have fixed shapes `[batch_size, input_len]` / `[batch_size, decode_len]` (the last one
    padded with empty rows), so one compilation serves every call.
    """
    outputs = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        enc = np.zeros((batch_size, input_len), np.int32)
        for r, (x, _) in enumerate(chunk):
            enc[r, : len(x)] = x[:input_len]
        batch = {
            "encoder_input_tokens": enc,
            "decoder_input_tokens": np.zeros((batch_size, decode_len), np.int32),
        }
        decodes = np.asarray(greedy_decode(params, batch))
        for row in decodes[: len(chunk)]:
            ids = row.tolist()
            ids = ids[: ids.index(vocabulary.eos_id)] if vocabulary.eos_id in ids else ids
            outputs.append(vocabulary.decode([i for i in ids if i > 0]))
    return outputs


QUALITY_METRICS = ("bleu", "rouge", "correction")


def quality(references: Sequence[str], predictions: Sequence[str], metric: str) -> dict[str, float]:
    """`{'bleu': ...}` (`metrics.bleu`), `{'rouge1', 'rouge2', 'rougeL': ...}` (`metrics.
    rouge_mean`, deterministic mean F-measure x 100) or `{'exact_match', 'chrf', 'bleu'}`
    (`metrics.correction_scores`) of predictions against references.

    Raises:
      ValueError: `metric` not in `QUALITY_METRICS`.
    """
    if metric == "bleu":
        return metrics.bleu(list(references), list(predictions))
    if metric == "rouge":
        keys = ("rouge1", "rouge2", "rougeL")
        return metrics.rouge_mean(list(references), list(predictions), score_keys=keys)
    if metric == "correction":
        return metrics.correction_scores(list(references), list(predictions))
    raise ValueError(f"quality metric must be one of {QUALITY_METRICS}; got {metric!r}.")


def evaluate_decodes(greedy_decode, params, examples, references, vocabulary, metric, **kwargs):
    """`(quality(references, greedy decodes, metric), decodes as text)`; kwargs as above."""
    predictions = greedy_translations(greedy_decode, params, examples, vocabulary, **kwargs)
    return quality(references, predictions, metric), predictions


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl` (duplicates from a resumed run: last one wins).

    `run_dir` may also name a metrics file itself (as copied into `results/training/`).
    """
    by_key = {}
    path = pathlib.Path(run_dir)
    with open(path if path.is_file() else path / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            by_key[(record["split"], record["step"])] = record
    return sorted(by_key.values(), key=lambda r: r["step"])


def plot_curves(
    run_dirs: Mapping[str, str | os.PathLike],
    out_path: str | os.PathLike,
    step_offsets: Mapping[str, int] | None = None,
) -> None:
    """Cross-entropy on the data (left) and validation BLEU (right) of each named run.

    Training lines show the data cross-entropy (`xent` for distillation runs, whose `loss` mixes
    in the KL term), so targets and drafts share one scale; dots are validation cross-entropy.

    Args:
      run_dirs: name -> run folder (or its metrics.jsonl file).
      out_path: the PNG to write.
      step_offsets: name -> steps to add, to draw runs that resume an earlier run's weights on one
        axis of cumulative steps (a run that starts from an export counts from 0).
    """
    step_offsets = dict(step_offsets or {})
    if set(step_offsets) - set(run_dirs):
        unknown = sorted(set(step_offsets) - set(run_dirs))
        raise ValueError(f"step_offsets names runs not in run_dirs: {unknown}.")
    import matplotlib  # Lazy: plotting is for reports only.

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run_dir in run_dirs.items():
        offset = step_offsets.get(name, 0)
        records = [{**r, "step": r["step"] + offset} for r in read_metrics(run_dir)]
        tr = [r for r in records if r["split"] == "train"]
        va = [r for r in records if r["split"] == "validation"]
        xent = [r.get("xent_data", r.get("xent", r["loss"])) for r in tr]
        (line,) = ax_loss.plot([r["step"] for r in tr], xent, label=f"{name} (train)")
        color = line.get_color()
        ax_loss.plot(
            [r["step"] for r in va],
            [r["loss"] for r in va],
            "o--",
            color=color,
            label=f"{name} (val)",
        )
        key = "bleu" if all("bleu" in r for r in va) else "rougeL"
        ax_bleu.plot(
            [r["step"] for r in va], [r.get(key) for r in va], "o-", label=f"{name} ({key})"
        )
    ax_loss.set(xlabel="step", ylabel="cross-entropy (nats/token)", yscale="log")
    ax_bleu.set(xlabel="step", ylabel="validation BLEU or ROUGE-L (greedy)")
    for ax in (ax_loss, ax_bleu):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def correction_report(rows: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """What a text-correction model does to its inputs, beside what the references do.

    Args:
      rows: `{'input', 'reference', 'prediction'}` texts (`train`'s `test_predictions.jsonl`; the
        input without the task prefix).

    Returns:
      `metrics.correction_scores` (exact match, chrF, BLEU; 0-100) plus counts: `examples`,
      `references_changed` (reference != input), `predictions_unchanged` (prediction ==
      input), `fixed` (reference != input and prediction == reference), `kept_clean`
      (reference == input and prediction == input), `broke_clean` (reference == input and
      prediction != input).

    Raises:
      ValueError: `rows` is empty.
    """
    if not rows:
        raise ValueError("correction_report needs at least one row.")
    refs = [r["reference"] for r in rows]
    report: dict[str, Any] = dict(metrics.correction_scores(refs, [r["prediction"] for r in rows]))
    changed = [r["reference"] != r["input"] for r in rows]
    same = [r["prediction"] == r["input"] for r in rows]
    right = [r["prediction"] == r["reference"] for r in rows]
    report.update(
        examples=len(rows),
        references_changed=sum(changed),
        predictions_unchanged=sum(same),
        fixed=sum(c and ok for c, ok in zip(changed, right, strict=True)),
        kept_clean=sum(not c and s for c, s in zip(changed, same, strict=True)),
        broke_clean=sum(not c and not s for c, s in zip(changed, same, strict=True)),
    )
    return report


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m specdec_t5x.training.validation correction_report PREDICTIONS.jsonl`: prints
    `correction_report` of a run's test predictions as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["correction_report"])
    parser.add_argument("predictions", help="test_predictions.jsonl of a train run")
    args = parser.parse_args(argv)
    with open(args.predictions, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(json.dumps(correction_report(rows), indent=2))


if __name__ == "__main__":
    main()
