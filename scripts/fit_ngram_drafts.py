"""Fits the unigram and bigram drafts (paper Table 3) on a seqio task's training targets.

  python scripts/fit_ngram_drafts.py [--task ddtp_ende] [--out specdec_t5x/assets/models/ngram_ende]

Targets are tokenised by the task itself (T5 preprocessing, EOS appended) at --target_len.
"""

import argparse
import json
import pathlib

import numpy as np
import seqio

from specdec_t5x import drafts, provenance, vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="ddtp_ende")
    parser.add_argument("--split", default="train")
    parser.add_argument("--target_len", type=int, default=64)
    parser.add_argument("--out", default="specdec_t5x/assets/models/ngram_ende")
    args = parser.parse_args()
    task = seqio.get_mixture_or_task(args.task)
    ds = task.get_dataset(
        {"inputs": 8, "targets": args.target_len}, split=args.split, shuffle=False, num_epochs=1
    )
    targets = [np.asarray(ex["targets"]) for ex in ds.as_numpy_iterator()]
    size = vocab.model_vocab_size(task.output_features["targets"].vocabulary)
    unigram, bigram = drafts.fit_ngram_drafts(targets, size)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    drafts.save_ngram_drafts(out / "ngram.npz", unigram, bigram)
    info = {
        "task": args.task,
        "split": args.split,
        "num_targets": len(targets),
        "num_tokens": int(sum(len(t) for t in targets)),
        "vocab_size": size,
        "command": "python scripts/fit_ngram_drafts.py "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        "commit": provenance.git_commit(),
        "date": provenance.utc_date(),
    }
    (out / "provenance.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
