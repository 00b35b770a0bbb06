"""Test-split BLEU of drafts decoding on their own (greedy), e.g. the unigram/bigram drafts.

  python scripts/draft_bleu.py [--drafts unigram,bigram] [--out results/training/ngram_drafts_bleu.json]

Any draft follows the block-step contract, so the baseline sampler (`decoding.temperature_sample`,
argmax) decodes with it alone; the n-gram drafts ignore the source, which is what the paper's
unigram/bigram baselines are.
"""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import decoding, drafts, metrics, models, provenance, vocab
from specdec_t5x import inputs as inputs_lib


def _greedy_fn(draft):
    """Jitted greedy decoding with the draft alone: (params, enc [b, 64]) -> tokens [b, 64]."""

    @jax.jit
    def greedy(params, enc):
        cache, step = draft.prepare(params, enc, 64)
        inputs = jnp.zeros((enc.shape[0], 64), jnp.int32)
        fn = models.one_token_logits_fn(step)
        return decoding.temperature_sample(inputs, cache, fn, 1, temperature=0.0, topk=0)[0]

    return greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--drafts", default="unigram,bigram")
    parser.add_argument("--task", default="ddtp_ende")
    parser.add_argument("--num_examples", type=int, default=100000)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--out", default="results/training/ngram_drafts_bleu.json")
    args = parser.parse_args()
    vocabulary = vocab.get_vocabulary()
    examples, _ = inputs_lib.load_examples(args.task, "test", args.num_examples, 64, 64, vocabulary)
    references = [e["targets_pretokenized"] for e in examples]
    result = {"task": args.task, "split": "test", "num_examples": len(examples), "bleu": {}}
    for name in args.drafts.split(","):
        draft = drafts.load_ngram_draft(name)
        greedy = _greedy_fn(draft)
        predictions = []
        for start in range(0, len(examples), args.batch_size):
            rows = examples[start : start + args.batch_size]
            enc = np.zeros((args.batch_size, 64), np.int32)
            for i, e in enumerate(rows):
                enc[i, : len(e["inputs"])] = e["inputs"]
            out = np.asarray(greedy(draft.params, jnp.asarray(enc))[:, -1])
            predictions += [metrics.decode_text(vocabulary, t, 1) for t in out[: len(rows)]]
        result["bleu"][name] = metrics.bleu(references, predictions)["bleu"]
        result.setdefault("first_predictions", {})[name] = predictions[:3]
    result.update(
        command="python scripts/draft_bleu.py "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        commit=provenance.git_commit(),
        date=provenance.utc_date(),
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    print(json.dumps(result["bleu"]))


if __name__ == "__main__":
    main()
