"""Warm-starts a target-encoder draft (`network.TargetEncoderTransformer`) from a shipped draft.

    python scripts/init_target_encoder_draft.py --task=ende --out=/tmp/te_init/params.msgpack

Encodes `--num_sources` training sources with the target's and the draft's encoders, fits the
linear map between them (`shared_encoder.fit_encoder_map`), maps the draft's cross-attention
key / value kernels through it (`shared_encoder.map_cross_attention`) and writes the draft's own
subtrees (bfloat16). Prints the fit's R² and, on validation pairs (teacher-forced), how often the
new draft's argmax equals the old draft's and the target's.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import accelerator
from specdec_t5x import drafts, embedded, network, steps, vocab
from specdec_t5x.data import packing
from specdec_t5x.training import shared_encoder

TASKS = {  # corpus, fields, task prefix, shipped target / draft, lengths
    "ende": ("ddtp_ende", "en", "de", "translate English to German: ", "embedded_ende", 64, 64),
    "sum": ("debian_summarize", "document", "synopsis", "summarize: ", "embedded_sum", 256, 32),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--out", required=True, help="msgpack file to write")
    parser.add_argument("--draft_params_path", default=None, help="default: the shipped draft")
    parser.add_argument("--num_sources", type=int, default=2000)
    parser.add_argument("--num_check", type=int, default=200, help="validation pairs to check")
    args = parser.parse_args(argv)
    corpus, src, tgt, prefix, name, input_len, target_len = TASKS[args.task]
    tcfg = accelerator.EMBEDDED["embedded_ende_target"]
    dcfg = accelerator.EMBEDDED["embedded_ende_draft"]
    target, draft = network.Transformer(tcfg), network.Transformer(dcfg)
    te_draft = network.TargetEncoderTransformer(dcfg, encoder_config=tcfg)
    tp = embedded.load_params(name=f"{name}_target")
    dp = (
        embedded.load_params(path=args.draft_params_path)
        if args.draft_params_path
        else embedded.load_params(name=f"{name}_draft")
    )
    voc = vocab.get_vocabulary()

    def batches(split, n):  # (encoder, decoder) batches of 64 tokenized pairs
        pairs = packing.read_jsonl_pairs(corpus, split, src, tgt, max_examples=n)
        examples = packing.tokenize(pairs, voc, prefix, input_len, target_len, drop_long=False)
        return packing.padded_batches(examples, 64, input_len, target_len)

    enc_t = jax.jit(lambda p, e: steps.encode(target, p, e))
    enc_d = jax.jit(lambda p, e: steps.encode(draft, p, e))
    ts, ds, ws = [], [], []
    for enc, _ in batches("train", args.num_sources):
        ts.append(np.asarray(enc_t(tp, enc)))
        ds.append(np.asarray(enc_d(dp, enc)))
        ws.append(enc > 0)
    a, r2 = shared_encoder.fit_encoder_map(
        np.concatenate(ts), np.concatenate(ds), np.concatenate(ws)
    )
    own = shared_encoder.map_cross_attention(dp, a)
    full = drafts.with_target_encoder(own, tp)

    def logits(module, params, enc, dec):
        inputs = jnp.pad(dec[:, :-1], ((0, 0), (1, 0)))
        return module.apply({"params": params}, enc, inputs, dec, enable_dropout=False)

    logits = jax.jit(logits, static_argnums=0)
    agree_old = agree_target = old_target = total = 0
    for enc, dec in batches("validation", args.num_check):
        mask = dec > 0
        new = np.argmax(logits(te_draft, full, enc, dec), -1)
        old = np.argmax(logits(draft, dp, enc, dec), -1)
        tgt_ = np.argmax(logits(target, tp, enc, dec), -1)
        agree_old += int(np.sum((new == old) & mask))
        agree_target += int(np.sum((new == tgt_) & mask))
        old_target += int(np.sum((old == tgt_) & mask))
        total += int(np.sum(mask))
    path = embedded.save_params(own, args.out)
    print(
        f"encoder map R² {r2:.3f} over {int(np.concatenate(ws).sum())} source tokens; "
        f"teacher-forced argmax on {total} validation tokens: new draft = old draft "
        f"{agree_old / total:.3f}, new draft = target {agree_target / total:.3f} "
        f"(old draft = target {old_target / total:.3f}); wrote {path}"
    )


if __name__ == "__main__":
    main()
