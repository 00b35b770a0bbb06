"""Kernel or XLA chosen by measurement (specdec_t5x/cpu_kernel/choice.py): the fastest candidate
is picked (injected timers, no real timing), the cache round-trips and misses on another CPU or
code path, a corrupt cache is measured again, the thread choice never changes a bit, and every
forced choice decodes the same greedy tokens."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs

from specdec_t5x import cpu_kernel, decoding, models
from specdec_t5x.cpu_kernel import choice, extension

pytestmark = pytest.mark.skipif(
    not cpu_kernel.available(), reason="CPU kernel extension not built (pip install -e .)"
)


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """Mode 'auto' with a fresh table and a cache file under tmp_path; yields the file's path."""
    path = tmp_path / "choice.json"
    monkeypatch.setenv(choice.ENV_VAR, "auto")
    monkeypatch.setenv(choice.CACHE_ENV_VAR, str(path))
    choice.clear_memory()
    yield path
    choice.clear_memory()


def table_timer(table, calls=None):
    """A timer from {(candidate, rows): seconds} (default 1.0); records its calls."""

    def timer(candidate, k, n, rows, dtype):
        if calls is not None:
            calls.append((candidate, k, n, rows, dtype))
        return table.get((candidate, rows), 1.0)

    return timer


def failing_timer(*args):
    raise AssertionError(f"measured again: {args}")


def test_the_fastest_candidate_is_chosen_per_bucket(auto):
    # rows 1: single fastest; 2: split; 4: xla by far; 8: xla by less than the margin.
    table = {
        ("single", 1): 0.5,
        ("split", 2): 0.5,
        ("xla", 4): 0.2,
        ("single", 8): 0.5,
        ("xla", 8): 0.45,
    }
    res = choice.ensure([(64, 96)], "float32", timer=table_timer(table))
    assert res["measured"] == len(choice.BUCKETS) and res["cached"] == 0
    pick = lambda rows, xla=True: choice.choose(64, 96, rows, "float32", xla)  # noqa: E731
    assert pick(1) == "single"
    assert [pick(r) for r in (2, 3)] == ["split", "split"]
    assert [pick(r) for r in (4, 5, 7)] == ["xla"] * 3
    assert pick(4, xla=False) in ("split", "single")  # no raw kernel: the kernel's best
    assert pick(8) == "single"  # XLA within the margin: the kernel (no second weight copy)
    assert pick(16) == "split"  # all equal: the first in CANDIDATES' order
    assert pick(32) == "auto" and pick(300) == "auto"  # not measured: the size rule
    assert choice.choose(64, 97, 1, "float32", True) == "auto"  # another shape: not measured
    assert choice.choose(64, 96, 1, "bfloat16", True) == "auto"  # another dtype: not measured
    assert choice.keep_raw(64, 96, "float32")
    assert not choice.keep_raw(64, 97, "float32")


def test_rows_buckets():
    assert [choice.rows_bucket(m) for m in (1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 0)] == [
        1, 2, 2, 4, 4, 8, 8, 16, 16, None, None,
    ]  # fmt: skip


def test_cache_round_trips_and_misses_on_another_cpu_or_path(auto, monkeypatch):
    calls = []
    choice.ensure([(64, 96)], "float32", timer=table_timer({("single", 1): 0.1}, calls))
    assert len(calls) == len(choice.BUCKETS) * len(choice.CANDIDATES)
    data = json.loads(auto.read_text())
    assert data["version"] == choice.VERSION and len(data["entries"]) == len(choice.BUCKETS)

    choice.clear_memory()  # a new process: everything comes from the file
    res = choice.ensure([(64, 96)], "float32", timer=failing_timer)
    assert res == {"measured": 0, "seconds": res["seconds"], "cached": len(choice.BUCKETS)}
    assert choice.choose(64, 96, 1, "float32", True) == "single"

    # Another code path (forced or another CPU's): measured again, the file keeps both.
    real_isa = extension.isa()
    monkeypatch.setattr(extension, "isa", lambda: "avx2+fma" if real_isa != "avx2+fma" else "x")
    calls.clear()
    choice.ensure([(64, 96)], "float32", timer=table_timer({}, calls))
    assert len(calls) == len(choice.BUCKETS) * len(choice.CANDIDATES)
    monkeypatch.setattr(extension, "isa", lambda: real_isa)

    # Another CPU (identity): measured again.
    other = dict(choice.identity(), cpu={"model_name": "another CPU"})
    monkeypatch.setattr(choice, "identity", lambda: other)
    choice.clear_memory()
    assert choice.choose(64, 96, 1, "float32", True) == "auto"
    calls.clear()
    choice.ensure([(64, 96)], "float32", timer=table_timer({}, calls))
    assert len(calls) == len(choice.BUCKETS) * len(choice.CANDIDATES)
    assert len(json.loads(auto.read_text())["entries"]) == 3 * len(choice.BUCKETS)


@pytest.mark.parametrize(
    "content", ["{not json", "[]", '{"version": 1, "entries": 5}', '{"version": 0}', ""]
)
def test_a_corrupt_cache_is_measured_again(auto, content):
    auto.write_text(content)
    calls = []
    res = choice.ensure([(64, 96)], "float32", timer=table_timer({("split", 1): 0.1}, calls))
    assert res["measured"] == len(choice.BUCKETS) and calls
    assert choice.choose(64, 96, 1, "float32", False) == "split"
    assert len(json.loads(auto.read_text())["entries"]) == len(choice.BUCKETS)  # rewritten


def test_bad_entries_and_switches(auto, monkeypatch):
    auto.write_text(json.dumps({"version": choice.VERSION, "entries": {"k": {"s": {"x": -1}}}}))
    assert choice.ensure([(64, 96)], "float32", timer=table_timer({}))["measured"] == 5
    monkeypatch.setenv(choice.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match=choice.ENV_VAR):
        choice.choose(64, 96, 1, "float32", True)
    for forced in ("split", "single"):
        monkeypatch.setenv(choice.ENV_VAR, forced)
        assert choice.choose(64, 96, 1, "float32", True) == forced
        assert not choice.keep_raw(64, 96, "float32")
    monkeypatch.setenv(choice.ENV_VAR, "xla")
    assert choice.choose(64, 96, 1, "float32", True) == "xla"
    assert choice.choose(64, 96, 1, "float32", False) == "auto"  # no raw kernel to run
    assert choice.keep_raw(64, 96, "float32")
    monkeypatch.setenv(choice.ENV_VAR, "threshold")
    assert choice.choose(64, 96, 1, "float32", True) == "auto"
    assert choice.ensure([(8, 8)], "float32", timer=failing_timer)["measured"] == 0
    monkeypatch.setenv(choice.CACHE_ENV_VAR, "off")
    assert choice.cache_path() is None
    monkeypatch.delenv(choice.ENV_VAR)  # the default: the size rule, nothing measured
    assert choice.mode() == "threshold" == choice.DEFAULT_MODE
    assert choice.choose(64, 96, 1, "float32", True) == "auto"


def test_a_failed_timing_leaves_the_size_rule(auto):
    res = choice.ensure([(64, 96)], "float32", timer=lambda *a: 1 / 0)
    assert res["measured"] == 0
    assert choice.choose(64, 96, 1, "float32", True) == "auto"


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_thread_choices_are_bit_identical(weight_dtype):
    """The `threads` attribute (size rule, one thread, split) never changes a bit, and 'split'
    really splits (XLA's intra-op pool has more than one thread) even a small matrix."""
    rng = np.random.default_rng(7)
    fn = jax.jit(cpu_kernel.matmul, static_argnums=(2, 3))
    for k, n in ((70, 1000), (33, 97), (256, 2049), (512, 64)):
        w = cpu_kernel.pack(jnp.asarray(rng.standard_normal((k, n)), jnp.float32), weight_dtype)
        for m in (1, 2, 5, 8, 13, 16):
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
            outs = {}
            for threads in (cpu_kernel.THREADS_AUTO, cpu_kernel.THREADS_ONE):
                outs[threads] = np.asarray(fn(x, w, n, threads))
            before, _ = cpu_kernel.split_stats()
            outs[cpu_kernel.THREADS_SPLIT] = np.asarray(fn(x, w, n, cpu_kernel.THREADS_SPLIT))
            after, pool = cpu_kernel.split_stats()
            assert after - before == (1 if pool > 1 else 0), (k, n, m, pool)
            for threads, out in outs.items():
                np.testing.assert_array_equal(out, outs[cpu_kernel.THREADS_ONE], err_msg=threads)
    with pytest.raises(ValueError, match="threads"):
        cpu_kernel.matmul(x, w, n, 3)


def test_an_xla_choice_is_the_unpacked_dot(auto, monkeypatch):
    """With 'xla' chosen, `dense` runs exactly `jnp.dot` on the raw kernel (no custom call)."""
    rng = np.random.default_rng(3)
    raw = jnp.asarray(rng.standard_normal((64, 96)), jnp.float32)
    packed = cpu_kernel.pack(raw)
    x = jnp.asarray(rng.standard_normal((2, 4, 64)), jnp.float32)

    def fn(x, p, w):  # the choice is read when traced: a new function object per setting
        return cpu_kernel.dense(x, p, 96, jnp.float32, kernel=w)

    ref = jax.jit(lambda x, w: jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32)))(x, raw)
    monkeypatch.setenv(choice.ENV_VAR, "xla")
    hlo = jax.jit(fn).lower(x, packed, raw).as_text()
    assert extension.MATMUL_TARGET not in hlo and "dot_general" in hlo
    np.testing.assert_array_equal(jax.jit(fn)(x, packed, raw), ref)
    jax.clear_caches()
    for forced, target in (("split", "threads = 2"), ("single", "threads = 1")):
        monkeypatch.setenv(choice.ENV_VAR, forced)
        hlo = jax.jit(fn).lower(x, packed, raw).as_text()
        jax.clear_caches()
        assert extension.MATMUL_THREADS_TARGET in hlo and target in hlo, forced


def _greedy(module, params, enc):
    model = models.EncoderDecoderModel(module, decode_fn=decoding.temperature_sample)
    batch = {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": jnp.zeros((enc.shape[0], 9), jnp.int32),
    }
    out = model.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})[0]
    return np.asarray(out)


def _raw_kept(packed) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(packed["decoder"])[0]
    return [
        jax.tree_util.keystr(p) for p, _ in leaves if jax.tree_util.keystr(p[-1:]) == "['kernel']"
    ]


def test_every_forced_choice_decodes_the_same_greedy_tokens(tiny_target, auto, monkeypatch):
    module, params = tiny_target
    enc = encoder_inputs(3, 7, [7, 4, 6])
    monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    want = _greedy(module, params, enc)
    monkeypatch.delenv(cpu_kernel.ENV_VAR)
    logits = {}
    tokens = jnp.asarray(np.random.RandomState(2).randint(3, 32, (3, 4)), jnp.int32)
    for forced in ("threshold", "split", "single", "xla"):
        monkeypatch.setenv(choice.ENV_VAR, forced)
        packed = models.pack_params(module, params)
        assert cpu_kernel.is_packed(packed)
        assert bool(_raw_kept(packed)) == (forced == "xla"), forced
        np.testing.assert_array_equal(_greedy(module, packed, enc), want, err_msg=forced)
        cache, step = models.EncoderDecoderModel(module).decoder_state(packed, enc, 4)
        logits[forced] = np.asarray(step(tokens, jnp.zeros((3,), jnp.int32), cache)[0])
    for forced in ("split", "single"):  # the kernel's thread choices: the very same floats
        np.testing.assert_array_equal(logits[forced], logits["threshold"], err_msg=forced)
    np.testing.assert_allclose(logits["xla"], logits["threshold"], rtol=1e-5, atol=1e-5)


def test_auto_choice_from_the_table_keeps_raw_kernels_only_where_xla_wins(
    tiny_target, auto, monkeypatch
):
    """Mode 'auto' with measurements that make XLA win one shape: `pack_params` keeps that
    shape's raw kernels (and only those), the step runs XLA's dot on them, the greedy tokens stay."""
    module, params = tiny_target
    enc = encoder_inputs(3, 7, [7, 4, 6])
    monkeypatch.setenv(cpu_kernel.ENV_VAR, "0")
    want = _greedy(module, params, enc)
    monkeypatch.delenv(cpu_kernel.ENV_VAR)
    mlp_in = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"].shape  # (8, 16)
    shapes = {
        tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params["decoder"])[0]
        if jax.tree_util.keystr(path[-1:]) == "['kernel']"
    }

    def timer(candidate, k, n, rows, dtype):
        return 0.1 if (candidate == "xla") == ((k, n) == mlp_in) else 1.0

    choice.ensure(shapes, "float32", timer=timer)
    packed = models.pack_params(module, params)
    kept = _raw_kept(packed)
    assert kept and all("wi_0" in p or "wi_1" in p for p in kept), kept
    np.testing.assert_array_equal(_greedy(module, packed, enc), want)
