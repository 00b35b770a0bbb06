"""Our network against T5X's own network and model, bf16 included (goldens: tests/golden/README.md).

The expected arrays were produced by T5X's `t5x/examples/t5/network.py::Transformer` and
`t5x/models.py::EncoderDecoderModel` (commit in tests/golden/t5x_network.json) with the same
weights, which both sides build from the NumPy recipe `conftest.recipe_params`. Bit-identity holds on the same backend
with the same kernels (CPU here, with our CPU kernel off: SPECDEC_CPU_KERNEL=0). XLA:CPU chooses its float32 dot kernels
by CPU model, and T5X's own float32 logits differ by ~1 ulp between CPU models: float32 logits are bitwise against
T5X's run on a machine with the same `conftest.machine_fingerprint()` (skipped elsewhere) and to 1e-5 everywhere.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import machine_fingerprint, recipe_params

from specdec_t5x import decoding, models, network

GOLDEN = pathlib.Path(__file__).parent / "golden"
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_KERNEL", "0")


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDEN / "t5x_network.json").read_text())
    with np.load(GOLDEN / "t5x_network.npz") as arrays:
        return dict(arrays), meta


def _setup(golden, dtype_name):
    arrays, meta = golden
    cfg = dict(meta["config"], mlp_activations=tuple(meta["config"]["mlp_activations"]))
    module = network.Transformer(network.T5Config(dtype=DTYPES[dtype_name], **cfg))
    enc = jnp.asarray(arrays["encoder_input_tokens"])
    dec_len = arrays["decoder_input_tokens"].shape[1]
    return arrays, module, recipe_params(module, enc.shape[1], dec_len), enc, dec_len


def _teacher_forced_logits(golden, dtype_name):
    arrays, module, params, enc, _ = _setup(golden, dtype_name)
    logits = module.apply(
        {"params": params},
        enc,
        jnp.asarray(arrays["decoder_input_tokens"]),
        jnp.asarray(arrays["decoder_target_tokens"]),
        enable_dropout=False,
    )
    return np.asarray(logits), arrays


def test_teacher_forced_logits_bitwise_bf16(golden):
    # bfloat16 rounding of every activation hides the CPU's float32 summation order: bitwise on
    # every machine tried so far.
    logits, arrays = _teacher_forced_logits(golden, "bf16")
    np.testing.assert_array_equal(logits, arrays["bf16_logits"])


def test_teacher_forced_logits_f32_close(golden):
    # Any machine: T5X's float32 logits (recorded on another CPU) to float32 summation-order noise.
    logits, arrays = _teacher_forced_logits(golden, "f32")
    np.testing.assert_allclose(logits, arrays["f32_logits"], rtol=1e-5, atol=1e-5)


def test_teacher_forced_logits_f32_bitwise_on_recorded_machine(golden):
    # Bitwise where T5X itself was run on a machine with this fingerprint (XLA:CPU picks float32
    # kernels by CPU, so T5X's own float32 logits differ by ~1 ulp between CPU models).
    fingerprint = machine_fingerprint()
    with np.load(GOLDEN / "t5x_network_f32_by_machine.npz") as by_machine:
        if fingerprint not in by_machine:
            pytest.skip(
                f"no T5X float32 golden recorded on a machine with fingerprint {fingerprint} "
                f"(recorded: {sorted(by_machine)}; tests/golden/README.md says how to add one)"
            )
        expected = by_machine[fingerprint]
    logits, _ = _teacher_forced_logits(golden, "f32")
    np.testing.assert_array_equal(logits, expected)


@pytest.mark.parametrize("dtype_name", ["bf16", "f32"])
def test_greedy_decodes_equal_t5x(golden, dtype_name):
    # Our model glue: cached cross K/V, position-addressed block steps.
    arrays, module, params, enc, dec_len = _setup(golden, dtype_name)
    batch = {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": jnp.zeros((enc.shape[0], dec_len), jnp.int32),
    }
    decodes, _ = models.EncoderDecoderModel(module).predict_batch_with_aux(
        params, batch, decoder_params={"temperature": 0.0}
    )
    np.testing.assert_array_equal(np.asarray(decodes), arrays[f"{dtype_name}_greedy_decodes"])


def test_t5x_model_step_convention_drives_our_network(golden):
    # T5X's EncoderDecoderModel calling convention, reproduced: `_compute_kv_cache` builds the cache
    # with all-ones dummy inputs through `__call__`; `_compute_logits_from_slice` feeds one token
    # per call with the real encoder output, no decoder_positions, and squeezes the length axis.
    arrays, module, params, enc, dec_len = _setup(golden, "bf16")
    ones_dec = jnp.ones((enc.shape[0], dec_len), jnp.int32)
    _, variables = module.apply(
        {"params": params},
        encoder_input_tokens=jnp.ones_like(enc),
        decoder_input_tokens=ones_dec,
        decoder_target_tokens=ones_dec,
        mutable=["cache"],
        decode=True,
        enable_dropout=False,
    )
    encoded = module.apply({"params": params}, enc, enable_dropout=False, method=module.encode)

    def compute_logits_from_slice(state):
        logits, new_vars = module.apply(
            {"params": params, "cache": state.cache},
            encoded,
            enc,
            state.cur_token,
            state.cur_token,
            enable_dropout=False,
            decode=True,
            max_decode_length=dec_len,
            mutable=["cache"],
            method=module.decode,
        )
        return jnp.squeeze(logits, axis=1), new_vars["cache"]

    for name, rng, params_kw in [
        ("greedy", None, {"temperature": 0.0}),
        ("sampled", jax.random.PRNGKey(7), {"temperature": 1.0, "topk": 0}),
    ]:
        decodes, scores = decoding.temperature_sample(
            inputs=jnp.zeros((enc.shape[0], dec_len), jnp.int32),
            cache=variables["cache"],
            tokens_to_logits=compute_logits_from_slice,
            eos_id=1,
            num_decodes=1,
            decode_rng=rng,
            cache_offset=0,
            **params_kw,
        )
        np.testing.assert_array_equal(np.asarray(decodes[:, -1]), arrays[f"bf16_{name}_decodes"])
        if name == "sampled":
            np.testing.assert_array_equal(np.asarray(scores[:, -1]), arrays["bf16_sampled_scores"])
