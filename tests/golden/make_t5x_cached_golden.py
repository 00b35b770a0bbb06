"""Writes `t5x_cached_logits.{npz,json}`: T5X's per-step logits through its decode cache.

Run from the repository root with a google-research/t5x source checkout (the goldens were made at
commit cc342d419ec3e3e9c4bf1df33c82330cafdc1e16); T5X is not a dependency of this project and none
of its code is copied here: this script imports T5X's `t5x/examples/t5/network.py` (and its
`layers.py`) from the checkout, registering empty `t5x`, `t5x.examples` and `t5x.examples.t5`
packages first so that `t5x/__init__.py`, whose imports need packages unrelated to the network,
never runs:

  SPECDEC_CPU_KERNEL=0 PYTHONPATH=$PWD python tests/golden/make_t5x_cached_golden.py \
      --t5x_dir=/path/to/t5x [--add_machine]

Without `--add_machine` it writes both files afresh (bfloat16 and this machine's float32 logits);
with it, it adds (or replaces) this machine's float32 logits in the existing files, after checking
that T5X's bfloat16 logits here equal the stored ones. What it computes: T5X's
`network.Transformer` with the tiny config and the inputs of `t5x_network.json/.npz`, weights from
`tests/conftest.recipe_params`; the cache made as T5X's `EncoderDecoderModel._compute_kv_cache`
makes it (one `decode=True` apply on all-ones inputs with `mutable=['cache']`); then one jitted
`decode=True` call per position, as `_compute_logits_from_slice` makes them (the encoder output,
one token, `max_decode_length`), feeding the stored decoder input tokens. Parameters, encoder output
and cache are arguments of the jitted step (closed over, XLA would fold them into constants).
"""

import argparse
import datetime
import json
import os
import pathlib
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}


def import_t5x_network(t5x_dir: str):
    """T5X's `t5x.examples.t5.network` from a checkout, without running `t5x/__init__.py`."""
    for name in ("t5x", "t5x.examples", "t5x.examples.t5"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(t5x_dir, *name.split("."))]
        sys.modules[name] = package
    from t5x.examples.t5 import network

    return network


def t5x_cached_step_logits(t5x_network, config: dict, params, enc, dec) -> np.ndarray:
    """float32 [batch, dec_len, vocab]: row t is T5X's logits after feeding dec[:, t] at step t."""
    module = t5x_network.Transformer(t5x_network.T5Config(**config))
    return cached_step_logits(module, params, enc, dec)


def cached_step_logits(module, params, enc, dec) -> np.ndarray:
    """T5X's decode convention for any T5X-compatible `module`: `_compute_kv_cache`, then one
    `_compute_logits_from_slice` call per position (the test runs it on ours).

    Returns:
      float32 [batch, dec_len, vocab]: row t is the logits after feeding dec[:, t] at step t.
    """
    dec_len = dec.shape[1]
    ones_dec = jnp.ones_like(dec)
    cache = jax.jit(
        lambda p: module.apply(
            {"params": p},
            jnp.ones_like(enc),
            ones_dec,
            ones_dec,
            decode=True,
            enable_dropout=False,
            mutable=["cache"],
        )[1]["cache"]
    )(params)
    encoded = jax.jit(
        lambda p, e: module.apply({"params": p}, e, enable_dropout=False, method=module.encode)
    )(params, enc)

    @jax.jit
    def step(params, encoded, enc, cache, token):
        logits, variables = module.apply(
            {"params": params, "cache": cache},
            encoded,
            enc,
            token,
            token,
            enable_dropout=False,
            decode=True,
            max_decode_length=dec_len,
            mutable=["cache"],
            method=module.decode,
        )
        return logits[:, 0], variables["cache"]

    rows = []
    for t in range(dec_len):
        logits, cache = step(params, encoded, enc, cache, dec[:, t : t + 1])
        rows.append(np.asarray(logits))
    return np.stack(rows, axis=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--t5x_dir", required=True, help="google-research/t5x source checkout")
    parser.add_argument("--add_machine", action="store_true", help="add this machine's float32")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from conftest import machine_fingerprint, recipe_params

    from specdec_t5x import network

    t5x_network = import_t5x_network(args.t5x_dir)
    meta = json.loads((GOLDEN / "t5x_network.json").read_text())
    with np.load(GOLDEN / "t5x_network.npz") as arrays:
        enc = jnp.asarray(arrays["encoder_input_tokens"])
        dec = jnp.asarray(arrays["decoder_input_tokens"])
    config = dict(meta["config"], mlp_activations=tuple(meta["config"]["mlp_activations"]))
    ours = network.Transformer(network.T5Config(**config))
    params = recipe_params(ours, enc.shape[1], dec.shape[1])  # dtype-independent (float32)
    logits = {
        name: t5x_cached_step_logits(t5x_network, dict(config, dtype=dtype), params, enc, dec)
        for name, dtype in DTYPES.items()
    }
    fingerprint = machine_fingerprint()
    with open("/proc/cpuinfo") as f:
        info = {}
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    import jaxlib

    machine = {
        "cpu": f"{info.get('vendor_id')} {info.get('model name')} (family "
        f"{info.get('cpu family')}, model {info.get('model')})",
        "jaxlib": jaxlib.__version__,
        "date": datetime.date.today().isoformat(),
    }
    npz, meta_path = GOLDEN / "t5x_cached_logits.npz", GOLDEN / "t5x_cached_logits.json"
    if args.add_machine:
        with np.load(npz) as stored:
            arrays = dict(stored)
        if not np.array_equal(arrays["bf16_step_logits"], logits["bf16"]):
            raise SystemExit("T5X's bfloat16 logits here differ from the stored ones; not adding.")
        out_meta = json.loads(meta_path.read_text())
    else:
        arrays = {
            "encoder_input_tokens": np.asarray(enc),
            "decoder_input_tokens": np.asarray(dec),
            "bf16_step_logits": logits["bf16"],
        }
        out_meta = {
            "t5x_commit": meta["t5x_commit"],
            "config": meta["config"],
            "inputs": "encoder/decoder_input_tokens of t5x_network.npz",
            "weights": "tests/conftest.recipe_params (see README)",
            "bf16_step_logits": "T5X network, dtype=bfloat16, float32_attention_logits=False",
            "f32_step_logits": {},
        }
    arrays[f"f32_step_logits_{fingerprint}"] = logits["f32"]
    out_meta["f32_step_logits"][fingerprint] = machine
    np.savez_compressed(npz, **arrays)
    meta_path.write_text(json.dumps(out_meta, indent=1) + "\n")
    print(f"wrote {npz} and {meta_path} (float32 for machine {fingerprint}: {machine})")


if __name__ == "__main__":
    main()
