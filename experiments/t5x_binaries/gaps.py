"""Top-2 logit gaps of the target (T5X's own t5x.examples.t5.network) along T5X's greedy decodes.

  PYTHONPATH=/work/t5x_stubs python gaps.py <baseline infer dir> <other infer dir> [...] \
      [--dtype float32|bfloat16] > gaps_<...>.json

Both infer dirs from runs with gin/output_ids.gin (token ids). For each example the baseline's
tokens are teacher-forced through the target (the shipped target's T5Config, weights from its T5X
checkpoint; inputs as the task 'ddtp_ende' makes them: first 100 test examples, 128 input tokens).
Reports, per compared run, every example whose tokens differ from the baseline's with, at the first
differing position, the target's top-1 / top-2 tokens and their logit gap (and the logit gap
between the two runs' tokens there); and for all 100 the smallest top-2 gap along the baseline's
path (how close the greedy decodes come to a tie). Also checks that the teacher-forced argmax
reproduces the baseline's every token (float32), so the inputs are the ones T5X decoded.
--dtype bfloat16: activations (T5Config.dtype) and weights in bfloat16, as T5X's infer defaults
with a bfloat16 model config; teacher-forced full forward, not the cached decode.
"""
import argparse
import glob
import json

import jax
import jax.numpy as jnp
import numpy as np
import seqio

from specdec_t5x import checkpoints, tasks  # noqa: F401  (registers ddtp_ende)
from t5x.examples.t5 import network

TARGET = "/work/t5x_run/ckpt/target/checkpoint_0"
LENGTHS = {"inputs": 128, "targets": 64}


def load(d):
    (path,) = glob.glob(f"{d}/*-predict*.jsonl-00000-of-00001")
    return [json.loads(line) for line in open(path)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("others", nargs="+")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    base = load(args.baseline)
    n = len(base)
    ds = seqio.get_mixture_or_task("ddtp_ende").get_dataset(
        LENGTHS, split="test", shuffle=False, use_cached=False, seed=0).take(n)
    exs = list(ds.as_numpy_iterator())
    for r, ex in zip(base, exs):
        assert r["inputs"]["inputs_pretokenized"] == ex["inputs_pretokenized"].decode(), "input mismatch"
    enc = np.zeros((n, LENGTHS["inputs"]), np.int32)
    for i, ex in enumerate(exs):
        enc[i, : len(ex["inputs"])] = ex["inputs"]
    tgt = np.zeros((n, LENGTHS["targets"]), np.int32)
    for i, r in enumerate(base):
        t = r["prediction_tokens"]
        tgt[i, : len(t)] = t
    dec_in = np.concatenate([np.zeros((n, 1), np.int32), tgt[:, :-1]], axis=1)

    cfg = network.T5Config(vocab_size=8192, dtype=args.dtype, emb_dim=256, num_heads=4,
                           num_encoder_layers=4, num_decoder_layers=4, head_dim=64, mlp_dim=1024,
                           mlp_activations=("gelu", "linear"), dropout_rate=0.0,
                           logits_via_embedding=False)
    model = network.Transformer(cfg)
    params = checkpoints.load_t5x_checkpoint(TARGET)["target"]
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, args.dtype), params)
    fwd = jax.jit(lambda p, e, d, t: model.apply({"params": p}, e, d, t, enable_dropout=False))
    logits = np.asarray(fwd(params, enc, dec_in, tgt).astype(jnp.float32))  # [n, L, V]
    top2 = np.argsort(-logits, axis=-1)[..., :2]
    top2_val = np.take_along_axis(logits, top2, axis=-1)
    gap = top2_val[..., 0] - top2_val[..., 1]
    lengths = [len(r["prediction_tokens"]) for r in base]
    argmax_ok = [bool((top2[i, : lengths[i], 0] == tgt[i, : lengths[i]]).all()) for i in range(n)]
    min_gap = [float(gap[i, : lengths[i]].min()) for i in range(n)]
    out = {"baseline": args.baseline, "dtype": args.dtype, "n": n,
           "teacher_forced_argmax_equals_baseline_tokens": sum(argmax_ok),
           "min_top2_gap_along_baseline_path": {
               "min": min(min_gap), "median": float(np.median(min_gap)),
               "examples_below_0.01": sum(g < 0.01 for g in min_gap),
               "examples_below_0.1": sum(g < 0.1 for g in min_gap)},
           "runs": []}
    for d in args.others:
        other = load(d)
        diffs = []
        for i, (a, b) in enumerate(zip(base, other)):
            s, t = a["prediction_tokens"], b["prediction_tokens"]
            if s == t:
                continue
            j = next((k for k in range(min(len(s), len(t))) if s[k] != t[k]), min(len(s), len(t)))
            row = {"example": i, "position": j, "baseline_token": s[j] if j < len(s) else None,
                   "other_token": t[j] if j < len(t) else None,
                   "top1": int(top2[i, j, 0]), "top2": int(top2[i, j, 1]),
                   "top2_gap": float(gap[i, j])}
            if row["baseline_token"] is not None and row["other_token"] is not None:
                row["gap_baseline_vs_other_token"] = float(
                    logits[i, j, s[j]] - logits[i, j, t[j]])
            diffs.append(row)
        out["runs"].append({"run": d, "differing": len(diffs), "examples": diffs})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
