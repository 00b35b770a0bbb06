"""Per-call parameter packing and per-batch decode time of the speculative model as T5X's binaries
call it, beside T5X's own baseline decode, interleaved in one process (same load for all).

  PYTHONPATH=/work/t5x_stubs python pack_cost.py [--rounds 3] > results/pack_cost.json

T5X's infer.py/eval.py call `model.predict_batch_with_aux(params, batch)` under jit with the raw
restored tree (target + params['draft']); the speculative model packs the decoder projections of
both for the CPU kernel inside every such call (models.py SpeculativeEncoderDecoderModel.states ->
EncoderDecoderModel.pack_params / T5Draft.pack_params -> steps.pack_params). Built here as
gin/t5x/speculative.gin builds it (target and draft networks from the shipped configs, weights
from the local T5X exports, draft in params, speculative_sample γ = 5, T = 0), on the first 100
DDTP test inputs at T5X's shapes (batch 4, 128 input / 64 target tokens), one device, jax.jit.
Variants, each a jitted call per batch, run back to back on every batch (interleaved), `rounds`
passes over the 25 batches, after a first (compiling) call:

* pack: one jitted pack of the target + draft parameters (what a call repeats), alone; the jit
  returns only the packed panels (`cpu_kernel.packed_arrays`), so it does not also copy the
  unchanged leaves out as a jit returning the whole tree would;
* pack_tree: the same jit returning the whole packed trees (upper bound: + a copy of every leaf);
* t5x_baseline: T5X's own models.EncoderDecoderModel + t5x.examples.t5.network + T5X's
  temperature_sample (temperature 0, topk 1) on the target's raw tree: baseline_model.gin's model;
* spec_raw: the speculative model on the raw tree, kernel on (as T5X's binaries call it: packs
  inside the call);
* spec_koff: the same traced with SPECDEC_CPU_KERNEL=0 (jnp.dot, no packing: T5X's path);
* spec_packed: the speculative model on a tree packed once outside jit (`model.pack_params` and
  the draft's; this also packs the set-up projections, which packing inside jit leaves on jnp.dot).
Reports medians and IQRs of wall (perf_counter) and process CPU time (both cores count) per call,
and checks that every decode variant gives the same tokens on every batch.
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import time

import jax
import numpy as np
import seqio

from specdec_t5x import checkpoints, cpu_kernel, drafts, models, network, speculative, tasks  # noqa: F401
from specdec_t5x import t5x_binaries, vocab
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x.examples.t5 import network as t5x_network

TARGET = "/work/t5x_run/ckpt/target/checkpoint_0"
DRAFT = "/work/t5x_run/ckpt/draft/checkpoint_0"
COMMON = dict(vocab_size=8192, dtype="float32", mlp_activations=("gelu", "linear"),
              dropout_rate=0.0, logits_via_embedding=False)
TARGET_CFG = dict(emb_dim=256, num_heads=4, num_encoder_layers=4, num_decoder_layers=4,
                  head_dim=64, mlp_dim=1024, **COMMON)
DRAFT_CFG = dict(emb_dim=128, num_heads=2, num_encoder_layers=2, num_decoder_layers=1,
                 head_dim=64, mlp_dim=256, **COMMON)


def timed(fn, *args):
    w, c = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - w, time.process_time() - c, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    voc = vocab.get_vocabulary()
    target_net = t5x_binaries.network_from_config(network.T5Config(**TARGET_CFG))
    draft_net = t5x_binaries.network_from_config(network.T5Config(**DRAFT_CFG))
    decode_fn = functools.partial(speculative.speculative_sample, gamma=5, temperature=0.0,
                                  topk=0, topp=0.0)
    model = models.SpeculativeEncoderDecoderModel(
        target_net, drafts.T5Draft(draft_net, None), input_vocabulary=voc, output_vocabulary=voc,
        decode_fn=decode_fn, draft_in_params=True)
    t5x_model = t5x_models.EncoderDecoderModel(
        module=t5x_network.Transformer(t5x_network.T5Config(**TARGET_CFG)),
        input_vocabulary=voc, output_vocabulary=voc, optimizer_def=None,
        decode_fn=functools.partial(t5x_decoding.temperature_sample, temperature=0.0, topk=1))
    target = checkpoints.load_t5x_checkpoint(TARGET)["target"]
    draft = checkpoints.load_t5x_checkpoint(DRAFT)["target"]
    raw = jax.device_put({**target, "draft": draft})
    raw_target = {k: v for k, v in raw.items() if k != "draft"}

    def pack_both(p):
        t, d = model.split_params(p)
        return model.pack_params(t), model.draft.pack_params(d)

    pack_tree_jit = jax.jit(pack_both)
    pack_jit = jax.jit(lambda p: [cpu_kernel.packed_arrays(t) for t in pack_both(p)])
    t_packed, d_packed = pack_both(raw)  # outside jit: also the set-up projections
    packed = {**t_packed, "draft": d_packed}
    assert cpu_kernel.is_packed(t_packed) and cpu_kernel.is_packed(d_packed), "kernel not in use"
    inside_t, inside_d = pack_tree_jit(raw)
    assert cpu_kernel.is_packed(inside_t) and cpu_kernel.is_packed(inside_d)
    panel_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(pack_jit(raw)))

    ds = seqio.get_mixture_or_task("ddtp_ende").get_dataset(
        {"inputs": 128, "targets": 64}, split="test", shuffle=False, use_cached=False, seed=0).take(100)
    enc = np.zeros((100, 128), np.int32)
    for i, ex in enumerate(ds.as_numpy_iterator()):
        enc[i, : len(ex["inputs"])] = ex["inputs"]
    batches = [{"encoder_input_tokens": enc[i: i + args.batch],
                "decoder_input_tokens": np.zeros((args.batch, 64), np.int32)}
               for i in range(0, 100, args.batch)]
    spec = jax.jit(lambda p, b: model.predict_batch_with_aux(p, b)[0])
    spec_koff_fn = jax.jit(lambda p, b: model.predict_batch_with_aux(p, b)[0])
    base = jax.jit(lambda p, b: t5x_model.predict_batch_with_aux(p, b)[0])

    variants = [("pack", pack_jit, lambda b: (raw,)), ("pack_tree", pack_tree_jit, lambda b: (raw,)),
                ("t5x_baseline", base, lambda b: (raw_target, b)),
                ("spec_raw", spec, lambda b: (raw, b)),
                ("spec_koff", spec_koff_fn, lambda b: (raw, b)),
                ("spec_packed", spec, lambda b: (packed, b))]
    first_call = {}
    for name, fn, a in variants:  # first call: trace + compile + run
        if name == "spec_koff":
            os.environ["SPECDEC_CPU_KERNEL"] = "0"  # read when packing, i.e. when traced
        first_call[name] = round(timed(fn, *a(batches[0]))[0], 3)
        os.environ.pop("SPECDEC_CPU_KERNEL", None)
    times = {name: {"wall": [], "cpu": []} for name, _, _ in variants}
    same = True
    for _ in range(args.rounds):
        for b in batches:
            outs = {}
            for name, fn, a in variants:
                w, c, out = timed(fn, *a(b))
                times[name]["wall"].append(w)
                times[name]["cpu"].append(c)
                outs[name] = out
            ref = np.asarray(outs["t5x_baseline"])
            same &= all(np.array_equal(ref, np.asarray(outs[k]))
                        for k in ("spec_raw", "spec_koff", "spec_packed"))
    med = {k: {c: round(statistics.median(v[c]) * 1e3, 2) for c in ("wall", "cpu")}
           for k, v in times.items()}
    iqr = {k: {c: [round(float(x * 1e3), 2) for x in np.percentile(v[c], [25, 75])]
               for c in ("wall", "cpu")} for k, v in times.items()}
    ratio = lambda a, b: {c: round(med[a][c] / med[b][c], 4) for c in ("wall", "cpu")}  # noqa: E731
    out = {
        "what": "ms per call (one batch of %d; pack: one pack of target + draft), medians over 25 "
                "batches x %d rounds, variants interleaved per batch" % (args.batch, args.rounds),
        "median_ms": med, "iqr_ms": iqr, "first_call_s (trace + compile + run)": first_call,
        "pack / spec_raw": ratio("pack", "spec_raw"),
        "pack_tree / spec_raw": ratio("pack_tree", "spec_raw"),
        "spec_raw - spec_packed (ms)": {c: round(med["spec_raw"][c] - med["spec_packed"][c], 2)
                                        for c in ("wall", "cpu")},
        "t5x_baseline / spec_raw (speed-up, kernel on)": ratio("t5x_baseline", "spec_raw"),
        "t5x_baseline / spec_koff (speed-up, kernel off)": ratio("t5x_baseline", "spec_koff"),
        "t5x_baseline / spec_packed (speed-up, packed once)": ratio("t5x_baseline", "spec_packed"),
        "all decodes identical to t5x_baseline": bool(same),
        "param_bytes_raw (target + draft)": int(sum(x.nbytes for x in jax.tree_util.tree_leaves(raw))),
        "panel_bytes_packed_in_jit": int(panel_bytes),
        "env": {k: os.environ.get(k) for k in ("SPECDEC_CPU_KERNEL", "XLA_FLAGS")},
        "devices": str(jax.devices()),
        "uptime_end": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
