"""The CPU kernels (specdec_t5x/cpu_kernel): the matmul exact against jnp.dot, the fused attention
against a float64 softmax reference, both wired into decoding, and
its fallbacks (env var off, extension missing)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs

from specdec_t5x import cpu_kernel, decoding, embedded, models, network
from specdec_t5x.cpu_kernel import extension
from specdec_t5x.timing import step_timer

needs_kernel = pytest.mark.skipif(
    not cpu_kernel.available(),
    reason="CPU kernel extension not built (pip install -e . with a C++ compiler builds it)",
)
pytestmark = needs_kernel


def _isas():
    """Every code path this CPU can run (the kernel is forced onto each in turn)."""
    detected = cpu_kernel.isa()
    order = ["portable", "avx2+fma", "avx512f"]
    return order[: order.index(detected) + 1] if detected in order else []


@pytest.fixture(params=_isas())
def isa(request):
    cpu_kernel.force_isa(request.param)
    yield request.param
    cpu_kernel.force_isa(None)


def _rel_err(out, ref):
    return float(np.max(np.abs(np.asarray(out) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_matmul_equals_dot(isa, weight_dtype):
    """All M in 1..16, 20, 37; K and N not multiples of 32; bf16 weights vs bf16-rounded dot."""
    rng = np.random.default_rng(0)
    for k, n in ((70, 45), (33, 97)):
        w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
        packed = cpu_kernel.pack(w, weight_dtype)
        assert packed.shape == (-(-n // 32), k, 32)
        assert packed.dtype == cpu_kernel.WEIGHT_DTYPES[weight_dtype]
        w_ref = np.asarray(w.astype(packed.dtype).astype(jnp.float32), np.float64)
        fn = jax.jit(cpu_kernel.matmul, static_argnums=2)
        for m in [*range(1, 17), 20, 37]:
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
            out = fn(x, packed, n)
            assert out.shape == (m, n) and out.dtype == jnp.float32
            assert _rel_err(out, np.asarray(x, np.float64) @ w_ref) < 1e-5, (k, n, m)


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_row_results_do_not_depend_on_the_row_count(isa, weight_dtype):
    """On the portable and AVX2 paths every output is one float32 chain over k whatever chunk its
    row falls in, so a row's result is the same bits in a call of any number of rows (the verify
    call's first row equals the one-token step's). The AVX-512 path splits k into two chains for
    chunks of at most 3 rows (latency), so there only the value is checked."""
    rng = np.random.default_rng(6)
    fn = jax.jit(cpu_kernel.matmul, static_argnums=2)
    for k, n in ((300, 45), (129, 97), (40, 64)):  # K over one 128-row block, tail panels
        packed = cpu_kernel.pack(
            jnp.asarray(rng.standard_normal((k, n)), jnp.float32), weight_dtype
        )
        x = jnp.asarray(rng.standard_normal((20, k)), jnp.float32)
        full = np.asarray(fn(x, packed, n))
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 13):
            part = np.asarray(fn(x[:m], packed, n))
            if isa == "avx512f":
                np.testing.assert_allclose(part, full[:m], rtol=1e-5, atol=1e-5)
            else:
                np.testing.assert_array_equal(part, full[:m], err_msg=f"{isa} k={k} n={n} m={m}")


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_split_over_threads_is_bit_identical(weight_dtype):
    """A product split over XLA's intra-op threads (panel blocks from a shared counter) gives the
    same bits as on one thread: every column is summed by the same code in the same order."""
    rng = np.random.default_rng(5)
    fn = jax.jit(cpu_kernel.matmul, static_argnums=2)
    old = cpu_kernel.set_split_bytes(1 << 62)
    try:
        for k, n in ((70, 1000), (33, 97), (256, 2049)):
            packed = cpu_kernel.pack(
                jnp.asarray(rng.standard_normal((k, n)), jnp.float32), weight_dtype
            )
            for m in (1, 3, 12, 37):
                x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
                cpu_kernel.set_split_bytes(1 << 62)
                one = np.asarray(fn(x, packed, n))
                calls_before, _ = cpu_kernel.split_stats()
                cpu_kernel.set_split_bytes(0)
                split = np.asarray(fn(x, packed, n))
                calls_after, threads = cpu_kernel.split_stats()
                np.testing.assert_array_equal(split, one)
                # XLA hands the kernel its intra-op pool; with more than one thread it must split.
                assert calls_after - calls_before == (1 if threads > 1 else 0), (k, n, m, threads)
    finally:
        cpu_kernel.set_split_bytes(old)


def test_pack_round_trip_and_leading_axes():
    w = jnp.asarray(np.random.default_rng(1).standard_normal((40, 50)), jnp.float32)
    np.testing.assert_array_equal(cpu_kernel.unpack(cpu_kernel.pack(w), 50), w)
    x = jnp.ones((2, 3, 40), jnp.float32)
    np.testing.assert_allclose(cpu_kernel.matmul(x, cpu_kernel.pack(w), 50), x @ w, rtol=1e-5)


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_pack_op_equals_pad_and_transpose(weight_dtype):
    """The C++ pack (8-panel blocks, non-temporal stores, tail panel) is bit-identical to XLA's
    pad + reshape + transpose, also for panel counts that are not multiples of 8 and under vmap."""
    dtype = cpu_kernel.WEIGHT_DTYPES[weight_dtype]
    rng = np.random.default_rng(2)
    for k, n in ((1, 1), (3, 33), (17, 415), (64, 257), (5, 1024), (7, 800)):
        w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
        got, want = cpu_kernel.pack(w, weight_dtype), cpu_kernel.pack_reference(w, dtype)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    ws = jnp.asarray(rng.standard_normal((3, 9, 300)), jnp.float32)
    got = jax.vmap(lambda x: cpu_kernel.pack(x, weight_dtype))(ws)
    want = jnp.stack([cpu_kernel.pack_reference(x, dtype) for x in ws])
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_bad_inputs_are_refused():
    w = jnp.ones((8, 5), jnp.float32)
    packed = cpu_kernel.pack(w)
    with pytest.raises(ValueError, match=r"non-empty \[K, N\]"):
        cpu_kernel.pack(jnp.ones((0, 5)))
    with pytest.raises(ValueError, match=r"non-empty \[K, N\]"):
        cpu_kernel.pack(jnp.ones((8, 0)))
    with pytest.raises(ValueError, match="at least one row"):
        cpu_kernel.matmul(jnp.ones((0, 8)), packed, 5)
    with pytest.raises(ValueError, match="does not fit"):
        cpu_kernel.matmul(jnp.ones((2, 7)), packed, 5)
    with pytest.raises(ValueError, match="does not fit"):
        cpu_kernel.matmul(jnp.ones((2, 8)), packed, 33)
    with pytest.raises(ValueError, match="float32 activations"):
        cpu_kernel.matmul(jnp.ones((2, 8), jnp.bfloat16), packed, 5)
    with pytest.raises(ValueError, match="cpu_weight_dtype .* must be one of"):
        cpu_kernel.pack(w, "float16")


def test_while_loop_vmap_and_grad():
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
    packed = cpu_kernel.pack(w)
    x = jnp.asarray(rng.standard_normal((5, 3, 24)), jnp.float32)
    # vmap over activations (one weight pass) and over a stack of packed weights.
    out = jax.jit(jax.vmap(lambda a: cpu_kernel.matmul(a, packed, 40)))(x)
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-5)
    stacked = jax.vmap(cpu_kernel.pack)(jnp.stack([w, -2 * w]))
    out = jax.vmap(lambda a, p: cpu_kernel.matmul(a, p, 40))(x[:2], stacked)
    np.testing.assert_allclose(out, jnp.stack([x[0] @ w, x[1] @ (-2 * w)]), rtol=1e-5, atol=1e-5)

    def body(i, y):  # chained products inside a while loop
        return jnp.tanh(cpu_kernel.matmul(y, packed, 40)[:, :24])

    got = jax.jit(lambda y: jax.lax.fori_loop(0, 3, body, y))(x[0])
    want = x[0]
    for _ in range(3):
        want = jnp.tanh((want @ w)[:, :24])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda a: cpu_kernel.matmul(a, packed, 40).sum())(x[0])


# ----------------------------------------------------------------------------------------------
# The fused cached attention.


def _attention_inputs(rng, b, q, h, d, s, bias_shape, masked=0.2):
    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    bias = np.where(
        rng.random(bias_shape) < masked, network.NEG_INF, rng.standard_normal(bias_shape)
    )
    return (
        normal(b, q, h, d),
        normal(b, h, s, d),
        normal(b, h, s, d),
        jnp.asarray(bias, jnp.float32),
    )


def _attention_float64(q, k, v, bias):
    q, k, v, bias = (np.asarray(a, np.float64) for a in (q, k, v, bias))
    logits = np.einsum("bqhd,bhkd->bhqk", q, k) + bias
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bqhd", weights, v)


def test_attention_equals_softmax_reference(isa):
    """Query rows 1..16, 20, 37; head_dim a multiple of 16 (the AVX-512 path), of 8 only (AVX2,
    also on an AVX-512 CPU) or neither (portable); cache lengths not multiples of 8 or 16; bias
    broadcast over batch and/or heads; masked entries (-1e10) and a fully masked row (uniform
    weights, as jax.nn.softmax gives)."""
    rng = np.random.default_rng(3)
    fn = jax.jit(cpu_kernel.attention)
    cases = [
        (1, 4, 64, 256, (1, 1)),
        (2, 3, 16, 37, (2, 3)),
        (2, 2, 20, 9, (1, 2)),
        (1, 2, 128, 5, (2, 1)),
        (1, 2, 24, 19, (1, 1)),
    ]
    for b, h, d, s, (bb, hb) in cases:
        for q in [*range(1, 17), 20, 37]:
            if bb == 2 and b == 1:  # a batch-2 bias needs a batch-2 query
                continue
            args = _attention_inputs(rng, b, q, h, d, s, (bb, hb, q, s))
            out = fn(*args)
            assert out.shape == (b, q, h, d) and out.dtype == jnp.float32
            assert _rel_err(out, _attention_float64(*args)) < 1e-5, (b, h, d, s, q)
            ref = cpu_kernel.attention_reference(*args)  # XLA's path (other platforms)
            assert _rel_err(out, np.asarray(ref, np.float64)) < 1e-5
    q, k, v, bias = _attention_inputs(rng, 1, 3, 2, 32, 11, (1, 1, 3, 11), masked=0.0)
    bias = bias.at[0, 0, 1].set(network.NEG_INF)  # query row 1 sees nothing
    out = fn(q, k, v, bias)
    np.testing.assert_allclose(out[0, 1], np.asarray(v[0]).mean(axis=1), rtol=1e-5, atol=1e-6)


def test_attention_bad_inputs_vmap_loop_and_grad():
    rng = np.random.default_rng(4)
    q, k, v, bias = _attention_inputs(rng, 2, 3, 2, 16, 10, (2, 2, 3, 10))
    with pytest.raises(ValueError, match="float32 operands"):
        cpu_kernel.attention(q.astype(jnp.bfloat16), k, v, bias)
    with pytest.raises(ValueError, match="do not match"):
        cpu_kernel.attention(q, k[:, :, :9], v, bias)
    with pytest.raises(ValueError, match="do not match"):
        cpu_kernel.attention(q, k, v, bias[:, :, :, :9])
    with pytest.raises(ValueError, match="do not match"):
        cpu_kernel.attention(q[:, :0], k, v, bias[:, :, :0])
    with pytest.raises(ValueError, match="rank-4"):
        cpu_kernel.attention(q[0], k, v, bias)
    # vmap over a stack of inputs (leading axes fold into the batch), and inside a while loop.
    stack = [jnp.stack([a, 2 * a]) for a in (q, k, v, bias)]
    got = jax.jit(jax.vmap(cpu_kernel.attention))(*stack)
    want = jnp.stack([cpu_kernel.attention_reference(*(a[i] for a in stack)) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got = jax.vmap(cpu_kernel.attention, in_axes=(0, None, None, None))(stack[0], k, v, bias)
    np.testing.assert_allclose(
        got[1], cpu_kernel.attention_reference(2 * q, k, v, bias), rtol=1e-5, atol=1e-5
    )

    def body(i, x):
        return jnp.tanh(cpu_kernel.attention(x, k, v, bias))

    got = jax.jit(lambda x: jax.lax.fori_loop(0, 3, body, x))(q)
    want = q
    for _ in range(3):
        want = jnp.tanh(cpu_kernel.attention_reference(want, k, v, bias))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(lambda x: cpu_kernel.attention(x, k, v, bias).sum())(q)


# ----------------------------------------------------------------------------------------------
# Wiring into the decoder.


def _dense_names(tree, prefix=""):
    out = set()
    for key, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items"):
            out |= _dense_names(value, f"{prefix}/{key}")
        else:
            out.add(f"{prefix}/{key}")
    return out


def _setup_names(num_encoder_layers: int, num_decoder_layers: int) -> set[str]:
    """The set-up projections' packed names (encoder attention + MLP, cross-attention K/V)."""
    want = set()
    for i in range(num_encoder_layers):
        want |= {
            f"/encoder/layers_{i}/attention/{p}/kernel_packed"
            for p in "query key value out".split()
        }
        want |= {f"/encoder/layers_{i}/mlp/{p}/kernel_packed" for p in ("wi_0", "wi_1", "wo")}
    for i in range(num_decoder_layers):
        want |= {
            f"/decoder/layers_{i}/encoder_decoder_attention/{p}/kernel_packed"
            for p in ("key", "value")
        }
    return want


def test_pack_params_packs_every_decode_projection(tiny_target):
    module, params = tiny_target
    packed = models.pack_params(module, params, "bfloat16")
    names = _dense_names(packed)
    assert cpu_kernel.is_packed(packed) and not cpu_kernel.is_packed(params)
    packed_names = {n for n in names if n.endswith("/kernel_packed")}
    cfg = module.config
    setup = _setup_names(cfg.num_encoder_layers, cfg.num_decoder_layers)
    want = {"/decoder/logits_dense/kernel_packed"}
    for i in range(cfg.num_decoder_layers):
        want |= {
            f"/decoder/layers_{i}/self_attention/{p}/kernel_packed"
            for p in "query key value out".split()
        }
        want |= {
            f"/decoder/layers_{i}/encoder_decoder_attention/{p}/kernel_packed"
            for p in ("query", "out")
        }
        want |= {f"/decoder/layers_{i}/mlp/{p}/kernel_packed" for p in ("wi_0", "wi_1", "wo")}
    assert packed_names == want | setup
    assert not any(n.endswith("/kernel") for n in names)  # one copy of every projection

    def at(tree, name):
        for key in name.strip("/").split("/"):
            tree = tree[key]
        return tree

    # The decode projections in the weight dtype asked for; the set-up ones in float32 always.
    assert {at(packed, n).dtype for n in want} == {jnp.dtype(jnp.bfloat16)}
    assert {at(packed, n).dtype for n in setup} == {jnp.dtype(jnp.float32)}
    for n in setup:  # the same panels as packing the raw kernel alone
        raw = at(params, n.replace("kernel_packed", "kernel"))
        np.testing.assert_array_equal(at(packed, n), cpu_kernel.pack(raw))
    # Everything else is the very same array (no second copy), and the input is untouched.
    assert packed["encoder"]["relpos_bias"] is params["encoder"]["relpos_bias"]
    assert (
        packed["encoder"]["layers_0"]["pre_mlp_layer_norm"]
        is (params["encoder"]["layers_0"]["pre_mlp_layer_norm"])
    )
    assert packed["token_embedder"] is params["token_embedder"]
    assert "kernel" in params["decoder"]["logits_dense"]
    assert "kernel" in params["encoder"]["layers_0"]["mlp"]["wo"]
    assert models.pack_params(module, packed, "bfloat16") is packed  # idempotent


def test_setup_switch_leaves_the_set_up_on_jnp_dot(tiny_target):
    """SPECDEC_CPU_KERNEL_SETUP=0 (A/B runs) packs the decode projections only: the encoder and
    the cross-attention K/V are the raw tree's very arrays."""
    module, params = tiny_target
    with cpu_kernel.env_var(cpu_kernel.SETUP_ENV_VAR, "0"):
        packed = models.pack_params(module, params)
    names = {n for n in _dense_names(packed) if n.endswith("/kernel_packed")}
    cfg = module.config
    assert names and not names & _setup_names(cfg.num_encoder_layers, cfg.num_decoder_layers)
    assert packed["encoder"] is params["encoder"]
    cross = packed["decoder"]["layers_0"]["encoder_decoder_attention"]
    assert cross["key"] is params["decoder"]["layers_0"]["encoder_decoder_attention"]["key"]


def test_packing_traced_parameters_leaves_the_set_up_on_jnp_dot(tiny_target):
    """Inside a traced call (a jitted predict over raw parameters) packing runs on every call, and
    a set-up projection is used once per call: only the decode projections are packed there."""
    module, params = tiny_target
    seen = {}

    def trace(p):
        packed = models.pack_params(module, p)
        seen["names"] = {n for n in _dense_names(packed) if n.endswith("/kernel_packed")}
        return jnp.zeros(())

    jax.eval_shape(trace, params)
    cfg = module.config
    setup = _setup_names(cfg.num_encoder_layers, cfg.num_decoder_layers)
    assert "/decoder/logits_dense/kernel_packed" in seen["names"]
    assert not seen["names"] & setup
    concrete = {n for n in _dense_names(models.pack_params(module, params)) if "packed" in n}
    assert setup <= concrete


def test_packed_set_up_matches_jnp_dot(tiny_target):
    """The encoder output and the cached cross-attention K/V from a packed tree (set-up on the
    kernel) agree with the raw tree's (jnp.dot) to 1e-5, at every length bucket."""
    from specdec_t5x import steps

    module, params = tiny_target
    packed = models.pack_params(module, params)
    with cpu_kernel.env_var(cpu_kernel.SETUP_ENV_VAR, "0"):
        decode_only = models.pack_params(module, params)
    assert "kernel_packed" in packed["encoder"]["layers_0"]["mlp"]["wo"]
    enc_len = 64
    setup = jax.jit(lambda p, e: steps.prepare_cache(module, p, e, 8))
    rng = np.random.default_rng(0)
    for length in (5, 16, 40, 64):
        enc = np.zeros((2, enc_len), np.int32)
        enc[:, :length] = rng.integers(2, module.config.vocab_size, (2, length))
        enc = jnp.asarray(enc)
        got, want = setup(packed, enc), setup(decode_only, enc)
        leaves = jax.tree_util.tree_leaves_with_path(want)
        assert any("cached_key" in jax.tree_util.keystr(k) for k, _ in leaves)
        for (path, w), g in zip(leaves, jax.tree_util.tree_leaves(got), strict=True):
            np.testing.assert_allclose(
                g, w, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path)
            )
        encoded = steps.encode(module, packed, enc)
        ref = steps.encode(module, decode_only, enc)
        np.testing.assert_allclose(encoded, ref, rtol=1e-5, atol=1e-5)


def test_packed_trees_narrow_to_bfloat16_and_unpack_exactly(tiny_target):
    """A float32-packed tree narrows to bfloat16 panels bit-identical to packing the raw tree in
    bfloat16 (never widened back); `unpack_params` restores the raw float32 tree exactly, also for
    scanned layers; the T5X-layout HF export of a packed tree equals that of the raw tree."""
    from conftest import init_params, tiny_config

    from specdec_t5x import steps

    module, params = tiny_target
    packed = models.pack_params(module, params)
    assert cpu_kernel.packed_weight_dtype(packed) == "float32"
    assert cpu_kernel.packed_weight_dtype(params) is None
    narrowed = models.pack_params(module, packed, "bfloat16")
    direct = models.pack_params(module, params, "bfloat16")
    assert cpu_kernel.packed_weight_dtype(narrowed) == "bfloat16"
    assert jax.tree_util.tree_structure(narrowed) == jax.tree_util.tree_structure(direct)
    for a, b in zip(
        jax.tree_util.tree_leaves(narrowed), jax.tree_util.tree_leaves(direct), strict=True
    ):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert narrowed["encoder"]["relpos_bias"] is params["encoder"]["relpos_bias"]
    assert models.pack_params(module, narrowed, "float32") is narrowed  # never widened
    assert models.pack_params(module, narrowed, "bfloat16") is narrowed

    assert steps.unpack_params(module, params) is params
    for m, p in ((module, params), (None, None)):
        if m is None:  # scanned layers: a leading layer axis on every decoder kernel
            m = network.Transformer(tiny_config(scan_layers=True))
            p = init_params(m, 2)
        restored = steps.unpack_params(m, models.pack_params(m, p))
        assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(p)
        for a, b in zip(
            jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(p), strict=True
        ):
            np.testing.assert_array_equal(a, b)


def test_hf_export_of_a_packed_tree_is_the_raw_export(tiny_target, tmp_path):
    from safetensors import numpy as safetensors_numpy

    from specdec_t5x import hf

    module, params = tiny_target
    raw_dir = hf.export_hf(params, module.config, tmp_path / "raw")
    packed_dir = hf.export_hf(models.pack_params(module, params), module.config, tmp_path / "p")
    want = safetensors_numpy.load_file(raw_dir / "model.safetensors")
    got = safetensors_numpy.load_file(packed_dir / "model.safetensors")
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def _rounded_like_packed(raw, packed):
    """raw params with exactly the kernels that `packed` holds as bfloat16 rounded to bfloat16."""
    if "kernel_packed" in packed:
        rounded = raw["kernel"]
        if packed["kernel_packed"].dtype == jnp.bfloat16:
            rounded = rounded.astype(jnp.bfloat16).astype(jnp.float32)
        return {"kernel": rounded}
    return {
        k: _rounded_like_packed(v, packed[k]) if hasattr(v, "items") else v for k, v in raw.items()
    }


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_decoder_logits_with_and_without_kernel(tiny_target, monkeypatch, weight_dtype):
    """Cached block steps (k = 1 and 3) on packed params vs the jnp.dot path (for bfloat16
    weights: jnp.dot with the same weights rounded to bfloat16)."""
    module, params = tiny_target
    enc = encoder_inputs(2, 7, [7, 4])
    tokens = jnp.asarray(np.random.RandomState(3).randint(3, 32, (2, 6)), jnp.int32)
    model = models.EncoderDecoderModel(module, cpu_weight_dtype=weight_dtype)
    packed = model.pack_params(params)
    assert packed["decoder"]["logits_dense"]["kernel_packed"].dtype == weight_dtype
    ref_params = _rounded_like_packed(params, packed)

    def run(p, k):
        cache, step = model.decoder_state(p, enc, 6)
        outs = []
        for t in range(0, 6, k):
            logits, cache = step(tokens[:, t : t + k], jnp.full((2,), t, jnp.int32), cache)
            outs.append(logits)
        return np.concatenate(outs, axis=1)

    for k in (1, 3):
        with_kernel = run(params, k)
        np.testing.assert_array_equal(run(packed, k), with_kernel)
        monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
        without = run(ref_params, k)
        monkeypatch.delenv(cpu_kernel.ENV_VAR)
        np.testing.assert_allclose(with_kernel, without, rtol=1e-5, atol=1e-5)
    if weight_dtype == "bfloat16":  # the option does change numerics vs float32 weights
        monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
        assert not np.allclose(run(params, 3), without, rtol=1e-6, atol=0)


def test_packed_decoder_runs_the_fused_attention(tiny_target, monkeypatch):
    """Packed float32 params: every cached attention (self and cross) is one `cpu_kernel.attention`
    call; SPECDEC_CPU_ATTENTION=0 keeps XLA's dots; the logits agree to 1e-5."""
    module, params = tiny_target
    enc = encoder_inputs(2, 7, [7, 4])
    tokens = jnp.asarray(np.random.RandomState(4).randint(3, 32, (2, 3)), jnp.int32)
    model = models.EncoderDecoderModel(module)
    packed = model.pack_params(params)
    layers = module.config.num_decoder_layers

    def run(fused):
        monkeypatch.setenv(cpu_kernel.ATTENTION_ENV_VAR, "1" if fused else "0")
        cache, _ = model.decoder_state(packed, enc, 6)
        step = step_timer.decoder_step(module)
        fn = jax.jit(step)
        args = (packed, enc, tokens, jnp.zeros((2,), jnp.int32), cache)
        hlo = fn.lower(*args).as_text()
        return np.asarray(fn(*args)[0]), hlo.count("specdec_attention")

    fused, calls = run(True)
    assert calls == 2 * layers, calls
    unfused, calls = run(False)
    assert calls == 0
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-5)


def test_scanned_layers_use_the_kernel(monkeypatch):
    """`scan_layers=True` stacks the layers: packed with a leading layer axis, same logits."""
    from conftest import init_params, tiny_config

    module = network.Transformer(tiny_config(scan_layers=True))
    params = init_params(module, 2)
    packed = models.pack_params(module, params)
    assert packed["decoder"]["layers"]["mlp"]["wo"]["kernel_packed"].shape == (2, 1, 16, 32)
    encoder_wo = packed["encoder"]["layers"]["mlp"]["wo"]["kernel_packed"]  # the set-up's too
    assert encoder_wo.shape[0] == 2 and encoder_wo.shape[-1] == 32
    enc = encoder_inputs(1, 5, [5])
    model = models.EncoderDecoderModel(module)
    tokens = jnp.asarray([[0, 5, 7]], jnp.int32)
    pos = jnp.zeros((1,), jnp.int32)
    outs = []
    for p, env in ((packed, "1"), (params, "0")):
        monkeypatch.setenv(cpu_kernel.ENV_VAR, env)
        cache, step = model.decoder_state(p, enc, 4)
        outs.append(step(tokens, pos, cache)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_fallback_env_var_off(tiny_target, monkeypatch):
    module, params = tiny_target
    monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    assert cpu_kernel.disabled_reason() == "SPECDEC_CPU_KERNEL=0"
    assert models.pack_params(module, params) is params


def test_fallback_extension_missing(tiny_target, monkeypatch, caplog):
    """Simulated missing build: parameters stay raw, decoding runs on jnp.dot and says so once."""
    module, params = tiny_target
    monkeypatch.setattr(extension, "library", lambda: None)
    extension.log_fallback_once.cache_clear()
    assert not cpu_kernel.available()
    with caplog.at_level("WARNING"):
        assert models.pack_params(module, params) is params
        assert models.pack_params(module, params) is params
    assert sum("extension is missing" in r.message for r in caplog.records) == 1
    model = models.EncoderDecoderModel(module)
    batch = {
        "encoder_input_tokens": encoder_inputs(1, 7, [7]),
        "decoder_input_tokens": jnp.zeros((1, 5), jnp.int32),
    }
    decodes, _ = model.predict_batch_with_aux(params, batch)
    assert decodes.shape == (1, 5)


def test_stale_extension_is_not_loaded(monkeypatch, caplog):
    """A build from an older source tree (no attention symbol) is refused with a logged reason,
    so decoding falls back to jnp.dot instead of failing on the missing FFI target."""

    class OldBuild:  # exports the matmul symbols only
        SpecdecMatmul = SpecdecPack = object()

    monkeypatch.setattr(extension.ctypes, "CDLL", lambda path: OldBuild())
    extension.library.cache_clear()
    extension.log_fallback_once.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert extension.library() is None
        assert any("is stale" in r.message for r in caplog.records)
    finally:
        extension.library.cache_clear()
    monkeypatch.undo()
    assert cpu_kernel.available()  # the real build loads again


def test_bfloat16_activations_keep_dot(monkeypatch):
    module = network.Transformer(
        network.T5Config(
            vocab_size=32,
            dtype=jnp.bfloat16,
            emb_dim=8,
            num_heads=2,
            head_dim=4,
            mlp_dim=16,
            num_encoder_layers=1,
            num_decoder_layers=1,
        )
    )
    ones = jnp.ones((1, 4), jnp.int32)
    params = module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)["params"]
    assert models.pack_params(module, params) is params


# Real English source sentences of the DDTP test split (Debian package descriptions).
SENTENCES = [
    "converter from ABC to MIDI format and back",
    "This package contains the documentation.",
    "It is fast and small.",
    "command line tool to manage archives",
    "This package provides the development files for the library.",
]


def test_greedy_decodes_identical_on_embedded_models(monkeypatch):
    """Shipped target and draft: greedy decodes (baseline and speculative) with and without the
    kernel are token-identical on a few DDTP sentences."""
    from specdec_t5x import drafts, speculative, vocab

    voc = vocab.get_vocabulary()
    configs = {
        "target": dict(
            emb_dim=256,
            num_heads=4,
            num_encoder_layers=4,
            num_decoder_layers=4,
            head_dim=64,
            mlp_dim=1024,
        ),
        "draft": dict(
            emb_dim=128,
            num_heads=2,
            num_encoder_layers=2,
            num_decoder_layers=1,
            head_dim=64,
            mlp_dim=256,
        ),
    }
    nets = {
        name: network.Transformer(
            network.T5Config(
                vocab_size=8192, mlp_activations=("gelu", "linear"), dropout_rate=0.0, **cfg
            )
        )
        for name, cfg in configs.items()
    }
    target_params = embedded.load_params("embedded_ende_target")
    draft_params = embedded.load_params("embedded_ende_draft")
    rows = [voc.encode("translate English to German: " + s)[:31] + [1] for s in SENTENCES]
    enc = np.zeros((len(rows), 32), np.int32)
    for i, r in enumerate(rows):
        enc[i, : len(r)] = r
    batch = {
        "encoder_input_tokens": jnp.asarray(enc),
        "decoder_input_tokens": jnp.zeros((len(rows), 20), jnp.int32),
    }
    draft = drafts.T5Draft(nets["draft"], draft_params)
    spec = models.SpeculativeEncoderDecoderModel(
        nets["target"], draft, decode_fn=speculative.speculative_sample
    )
    base = models.EncoderDecoderModel(nets["target"], decode_fn=decoding.temperature_sample)

    def decode_both():
        greedy = {"temperature": 0.0}
        b = base.predict_batch_with_aux(target_params, batch, decoder_params=greedy)[0]
        s = spec.predict_batch_with_aux(
            target_params,
            batch,
            decoder_params={**greedy, "gamma": 4},
            draft_params=draft_params,
        )[0]
        return np.asarray(b), np.asarray(s)

    with_kernel = decode_both()
    monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    without = np.asarray(
        base.predict_batch_with_aux(target_params, batch, decoder_params={"temperature": 0.0})[0]
    )
    np.testing.assert_array_equal(with_kernel[0], without)
    np.testing.assert_array_equal(with_kernel[1], without)
    assert (with_kernel[0] > 0).sum() > 5 * len(rows)  # real decodes, not empty outputs
