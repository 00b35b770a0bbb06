"""Per-step logits through the decode cache, bit for bit against T5X's own network.

The goldens (`tests/golden/t5x_cached_logits.{npz,json}`, made by
`tests/golden/make_t5x_cached_golden.py`, see tests/golden/README.md) are T5X's per-step logits: its
`network.Transformer` with the cache made as `EncoderDecoderModel._compute_kv_cache` makes it, then
one jitted `decode=True` call per position fed the stored decoder tokens. Our network is driven two
ways, with the CPU kernel off (`SPECDEC_CPU_KERNEL=0`, the path that claims bit-identity):

* `t5x_convention`: the very calls T5X's model makes (no `decoder_positions`, the encoder output
  re-projected at every step, the cache's `cache_index`).
* `block_steps`: our decode path, `steps.encode` + `steps.init_cache` + `steps.make_block_step`
  (one token per call at its absolute position, cross-attention K/V read from the cache).

Teacher-forced logits and greedy tokens (tests/test_t5x_network_golden.py) did not notice when the
cached attention started contracting the heads-first cache as it lies (its float32 sums then ran in
another order, ~2e-6 off T5X's); these compare every step's logits bitwise. XLA:CPU fuses the
bfloat16 dots' operand conversion into a copy laid out for the dot, so on CPU only float32 sees the
cache layout: the float32 comparison is bitwise against T5X run on a machine with this
`conftest.machine_fingerprint()` (XLA:CPU picks float32 dot kernels by CPU; skipped elsewhere, and
the generator's `--add_machine` records one) and to 1e-5 everywhere. On every machine and backend,
`test_cached_attention_reads_the_cache_as_t5x_does` checks one cached attention call bitwise
against T5X's dataflow from T5X's own cache layout (both failed, float32, with the cache contracted
as it lies).
"""

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import machine_fingerprint, recipe_params

from specdec_t5x import network, steps

GOLDEN = pathlib.Path(__file__).parent / "golden"
GOLDEN_SCRIPT = GOLDEN / "make_t5x_cached_golden.py"  # its T5X-convention decode runs ours too
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}
CONVENTIONS = ("t5x_convention", "block_steps")


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_KERNEL", "0")


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDEN / "t5x_cached_logits.json").read_text())
    with np.load(GOLDEN / "t5x_cached_logits.npz") as arrays:
        return dict(arrays), meta


def _module(meta, dtype_name: str) -> network.Transformer:
    cfg = dict(meta["config"], mlp_activations=tuple(meta["config"]["mlp_activations"]))
    return network.Transformer(network.T5Config(dtype=DTYPES[dtype_name], **cfg))


def _t5x_convention(module, params, enc, dec) -> np.ndarray:
    """T5X's `_compute_kv_cache` + one `_compute_logits_from_slice` call per position: the
    generator's own function (`golden/make_t5x_cached_golden.py`), run on our network."""
    spec = importlib.util.spec_from_file_location("make_t5x_cached_golden", GOLDEN_SCRIPT)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    return generator.cached_step_logits(module, params, enc, dec)  # [b, dec_len, vocab]


def _block_steps(module, params, enc, dec) -> np.ndarray:
    """Our decode path: cached cross K/V, one-token blocks at absolute positions."""
    dec_len = dec.shape[1]
    setup = jax.jit(
        lambda p, e: steps.init_cache(module, p, steps.encode(module, p, e), e, dec_len)
    )
    cache = setup(params, enc)

    @jax.jit
    def step(params, enc, cache, token, position):
        logits, cache = steps.make_block_step(module, params, enc)(token, position, cache)
        return logits[:, 0], cache

    rows = []
    for t in range(dec_len):
        position = jnp.full((dec.shape[0],), t, jnp.int32)
        logits, cache = step(params, enc, cache, dec[:, t : t + 1], position)
        rows.append(np.asarray(logits))
    return np.stack(rows, axis=1)  # [b, dec_len, vocab]


@pytest.fixture(scope="module")
def step_logits(golden):
    """{(dtype_name, convention): float32 [batch, dec_len, vocab]}, computed once per module."""
    arrays, meta = golden
    enc = jnp.asarray(arrays["encoder_input_tokens"])
    dec = jnp.asarray(arrays["decoder_input_tokens"])
    run = {"t5x_convention": _t5x_convention, "block_steps": _block_steps}
    cache: dict = {}

    def get(dtype_name: str, convention: str) -> np.ndarray:
        if (dtype_name, convention) not in cache:
            module = _module(meta, dtype_name)
            params = recipe_params(module, enc.shape[1], dec.shape[1])
            cache[dtype_name, convention] = run[convention](module, params, enc, dec)
        return cache[dtype_name, convention]

    return get


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_bf16_step_logits_bitwise(golden, step_logits, convention):
    arrays, _ = golden
    np.testing.assert_array_equal(step_logits("bf16", convention), arrays["bf16_step_logits"])


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_f32_step_logits_bitwise_on_recorded_machine(golden, step_logits, convention):
    arrays, meta = golden
    fingerprint = machine_fingerprint()
    key = f"f32_step_logits_{fingerprint}"
    if key not in arrays:
        pytest.skip(
            f"no T5X float32 cached-logits golden recorded on a machine with fingerprint "
            f"{fingerprint} (recorded: {sorted(meta['f32_step_logits'])}; add one with "
            "tests/golden/make_t5x_cached_golden.py --add_machine)"
        )
    got = step_logits("f32", convention)
    differ = int(np.sum(got != arrays[key]))
    assert differ == 0, (
        f"{differ} of {got.size} cached float32 logits differ from T5X's (max "
        f"{np.max(np.abs(got - arrays[key])):.3g}): did the cached attention's contraction "
        "order or cache layout change? (network._t5x_cache_read)"
    )


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_f32_step_logits_close(golden, step_logits, convention):
    # Any machine: T5X's float32 logits (recorded on some CPU) to float32 summation-order noise.
    arrays, meta = golden
    for fingerprint in meta["f32_step_logits"]:
        np.testing.assert_allclose(
            step_logits("f32", convention),
            arrays[f"f32_step_logits_{fingerprint}"],
            rtol=1e-5,
            atol=1e-5,
        )


# ----------------------------------------------------------------------------------------------
# The same property on any machine, at the layer: a cached attention call equals the computation
# T5X's `layers.py` makes from *its* cache layout, [batch, heads, head_dim, length] (an argument
# of the jitted reference, so XLA reads it as it lies), with T5X's einsums and dtypes.

B, H, D, S, EMB, POS = 4, 4, 16, 24, 64, 17  # S: cache length; POS: the step's position


def _layer_inputs(dtype):
    rng = np.random.default_rng(5)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    params = {name: {"kernel": normal(EMB, H * D) / 8} for name in ("query", "key", "value")}
    params["out"] = {"kernel": normal(H * D, EMB) / 8}
    filled = (jnp.arange(S) < POS).astype(dtype)  # slots written by earlier steps
    cache_t5x = {  # T5X's layout [b, h, d, S]
        "cached_key": normal(B, H, D, S).astype(dtype) * filled,
        "cached_value": normal(B, H, D, S).astype(dtype) * filled,
    }
    return params, normal(B, 1, EMB).astype(dtype), cache_t5x, normal(B, H, 1, S).astype(dtype)


def _t5x_dataflow(params, x, cache_t5x, bias, dtype, cache_mode):
    """T5X's cached attention step from its own cache layout (self: written at POS first)."""
    dense = lambda y, name: jnp.dot(y.astype(dtype), params[name]["kernel"].astype(dtype))
    query = dense(x, "query").reshape(B, 1, H, D)
    key, value = cache_t5x["cached_key"], cache_t5x["cached_value"]  # [b, h, d, S]
    if cache_mode == "self":
        one_hot = jax.nn.one_hot(POS, S, dtype=dtype)
        key = key + jnp.moveaxis(dense(x, "key").reshape(B, 1, H, D), -3, -1) * one_hot
        value = value + jnp.moveaxis(dense(x, "value").reshape(B, 1, H, D), -3, -1) * one_hot
        visible = jnp.arange(S) <= POS
    else:
        visible = jnp.arange(S) < S - 3  # the last 3 source positions are padding
    key, value = jnp.moveaxis(key, -1, -3), jnp.moveaxis(value, -1, -3)  # [b, S, h, d]
    mask = jnp.broadcast_to(visible, (B, 1, 1, S))
    attention_bias = jax.lax.select(
        mask, jnp.zeros(mask.shape, dtype), jnp.full(mask.shape, network.NEG_INF, dtype)
    )
    if cache_mode == "self":
        attention_bias = attention_bias + bias
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) + attention_bias.astype(dtype)
    weights = jax.nn.softmax(logits).astype(dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, value).reshape(B, 1, H * D)
    return dense(out, "out")


def _our_layer(params, x, cache_ours, bias, dtype, cache_mode):
    """Our `MultiHeadAttention` on its heads-first cache [b, h, S, d]."""
    cfg = network.T5Config(
        vocab_size=8, emb_dim=EMB, num_heads=H, head_dim=D, dtype=dtype, dropout_rate=0.0
    )
    layer = network.MultiHeadAttention(cfg)
    variables = {"params": params, "cache": cache_ours}
    if cache_mode == "self":
        positions = jnp.full((B, 1), POS, jnp.int32)
        out, _ = layer.apply(
            variables,
            x,
            x,
            None,
            bias,
            cache_mode="self",
            query_positions=positions,
            mutable=["cache"],
        )
    else:
        mask = jnp.broadcast_to(jnp.arange(S) < S - 3, (B, 1, 1, S))
        out, _ = layer.apply(variables, x, None, mask, None, cache_mode="cross", mutable=["cache"])
    return out


@pytest.mark.parametrize("cache_mode", ["self", "cross"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_cached_attention_reads_the_cache_as_t5x_does(dtype, cache_mode):
    params, x, cache_t5x, bias = _layer_inputs(dtype)
    cache_ours = {name: jnp.swapaxes(c, 2, 3) for name, c in cache_t5x.items()}  # [b, h, S, d]
    want = jax.jit(_t5x_dataflow, static_argnums=(4, 5))(
        params, x, cache_t5x, bias, dtype, cache_mode
    )
    got = jax.jit(_our_layer, static_argnums=(4, 5))(params, x, cache_ours, bias, dtype, cache_mode)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
