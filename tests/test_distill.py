"""Distillation (DistillSpec): divergences, generated (on-policy) batches, the mixed stream, training."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import init_params, perturbed, tiny_config
from test_train import DigitVocabulary, copy_pairs

from specdec_t5x import models, network
from specdec_t5x.data import packing
from specdec_t5x.training import distill, train

P = np.array([[0.5, 0.3, 0.2, 0.0 + 1e-9], [0.1, 0.1, 0.1, 0.7]])
Q = np.array([[0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])


def _div(kind):
    return np.asarray(distill.divergence(kind, jnp.log(P), jnp.log(Q)))


def test_divergences_match_their_definitions():
    np.testing.assert_allclose(_div("fkl"), np.sum(P * np.log(P / Q), -1), rtol=1e-5)
    np.testing.assert_allclose(_div("rkl"), np.sum(Q * np.log(Q / P), -1), rtol=1e-5)
    np.testing.assert_allclose(_div("tvd"), 0.5 * np.sum(np.abs(P - Q), -1), rtol=1e-5)
    m = 0.5 * (P + Q)
    jsd = 0.5 * np.sum(P * np.log(P / m), -1) + 0.5 * np.sum(Q * np.log(Q / m), -1)
    np.testing.assert_allclose(_div("jsd"), jsd, rtol=1e-5)
    # alpha = sum min(p, q) = 1 - TVD (paper, Section 3.3), the reason TVD is a candidate loss.
    np.testing.assert_allclose(1.0 - _div("tvd"), np.minimum(P, Q).sum(-1), rtol=1e-5)
    same = distill.divergence("jsd", jnp.log(Q), jnp.log(Q))
    np.testing.assert_allclose(same, 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="'l2'"):
        distill.divergence("l2", jnp.log(P), jnp.log(Q))


def test_generated_batch_layout():
    enc = jnp.array([[5, 6, 1, 0], [7, 1, 0, 0]])
    decodes = jnp.array([[9, 1, 0, 0, 0], [4, 4, 4, 4, 4]])  # row 1 never ends
    b = distill.generated_batch(enc, decodes, eos_id=1)
    np.testing.assert_array_equal(b["decoder_target_tokens"], [[9, 1, 0, 0, 0], [4, 4, 4, 4, 4]])
    np.testing.assert_array_equal(b["decoder_input_tokens"], [[0, 9, 1, 0, 0], [0, 4, 4, 4, 4]])
    np.testing.assert_array_equal(b["decoder_loss_weights"], [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(b["decoder_positions"], [[0, 1, 0, 0, 0], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(b["encoder_segment_ids"], [[1, 1, 1, 0], [1, 1, 0, 0]])
    assert set(b) == set(packing.make_batch([(np.array([1]), np.array([1]))], [[0]], 4, 5))


@pytest.fixture(scope="module")
def copy_setup():
    vocab = DigitVocabulary()
    examples = packing.tokenize(copy_pairs(64, 0), vocab, "", 8, 8, drop_long=True)
    draft = models.EncoderDecoderModel(network.Transformer(tiny_config()))
    return examples, draft


@pytest.fixture(scope="module")
def generators(copy_setup, tiny_target):
    """Jitted generators of the draft and the target, shared so each compiles once per module."""
    target = models.EncoderDecoderModel(tiny_target[0])
    return distill.make_generator(copy_setup[1], 8), distill.make_generator(target, 8)


def test_on_policy_batches_are_the_drafts_samples(copy_setup, generators):
    """Decoder sequences come from the draft's own decodes (greedy and sampled), not the labels."""
    examples, draft = copy_setup
    params = init_params(draft.module, 2)
    enc = next(packing.SourceBatches(examples, 4, 8, seed=0))
    generate = generators[0]
    rng = jax.random.PRNGKey(3)
    for t in (0.0, 1.0):
        temps = jnp.asarray(t, jnp.float32)
        b = generate(params, jnp.asarray(enc), temps, rng)
        batch = {"encoder_input_tokens": enc, "decoder_input_tokens": np.zeros((4, 8), np.int32)}
        decoder_params = {"temperature": t, "topk": 0}
        expected = np.asarray(
            draft.predict_batch(params, batch, rng, decoder_params=decoder_params)
        )
        targets = np.asarray(b["decoder_target_tokens"])
        np.testing.assert_array_equal(targets, expected)  # tokens after EOS are 0 in both
        np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:], targets[:, :-1])
        np.testing.assert_array_equal(b["encoder_input_tokens"], enc)
        # The references (copies of the inputs) are not what the untrained draft produced.
        labels = np.zeros_like(targets)
        by_input = {tuple(x): y for x, y in examples}
        for r, row in enumerate(enc):
            y = by_input[tuple(row[row > 0])]
            labels[r, : len(y)] = y
        assert not np.array_equal(targets, labels)
    # The temperature is traced (one compilation) and honoured: sampled rows differ from greedy,
    # and the rows of one sampled batch are independent draws (not one shared key per row).
    sampled = generate(params, jnp.asarray(enc), jnp.float32(1.0), rng)["decoder_target_tokens"]
    greedy = generate(params, jnp.asarray(enc), jnp.float32(0.0), rng)["decoder_target_tokens"]
    assert not np.array_equal(sampled, greedy)
    same_input = generate(params, jnp.asarray(np.repeat(enc[:1], 4, 0)), jnp.float32(1.0), rng)
    assert len({tuple(r) for r in np.asarray(same_input["decoder_target_tokens"])}) > 1
    with pytest.raises(ValueError, match="scalar"):
        generate(params, jnp.asarray(enc), jnp.zeros(4), rng)


def _mixed(examples, generators, target_params, mixture, seed=0):
    return distill.MixedBatches(
        packing.PackedBatches(examples, 4, 16, 8, seed),
        packing.SourceBatches(examples, 4, 16, seed),
        mixture,
        *generators,
        target_params,
        temperatures=(0.0, 1.0),
        regenerate_every=3,
        pool_batches=2,
        seed=seed,
    )


def test_mixed_batches_regenerate_from_current_draft_and_resume(
    copy_setup, generators, tiny_target
):
    examples, draft = copy_setup
    params_a, params_b = init_params(draft.module, 2), init_params(draft.module, 5)
    stream = _mixed(examples, generators, tiny_target[1], {"draft": 1.0})
    labels, batches = [], []
    for step in range(6):
        label, b = stream.next(step, params_a if step < 3 else params_b)
        labels.append(label)
        batches.append(np.asarray(b["decoder_target_tokens"]))
    assert labels == ["draft_t0", "draft_t1", "draft_t0"] * 2  # pool of 2 in turn, refilled at 3
    np.testing.assert_array_equal(batches[0], batches[2])  # same pool within a window
    # The pool refilled at step 3 holds the greedy decodes of *params_b* on new inputs.
    state = stream.state()
    assert state["sources"]["index"] == 4  # two refills of 2 batches each
    sources = packing.SourceBatches(examples, 4, 16, seed=0)
    sources.restore({"epoch": 0, "index": 2})
    enc = next(sources)
    expected = generators[0](params_b, jnp.asarray(enc), jnp.float32(0.0), None)
    np.testing.assert_array_equal(batches[3], expected["decoder_target_tokens"])
    # Resuming from a window boundary replays the same batches.
    resumed = _mixed(examples, generators, tiny_target[1], {"draft": 1.0})
    resumed.restore({"epoch": 0, "index": 0, "sources": {"epoch": 0, "index": 2}})
    for step in range(3, 6):
        _, b = resumed.next(step, params_b)
        np.testing.assert_array_equal(b["decoder_target_tokens"], batches[step])
    # Sources follow the mixture, reproducibly per step; 'data' batches come from the packed stream.
    both = _mixed(examples, generators, tiny_target[1], {"data": 0.5, "target": 0.5})
    drawn = [both.source(s) for s in range(200)]
    assert set(drawn) == {"data", "target"} and 60 < drawn.count("data") < 140
    assert drawn == [both.source(s) for s in range(200)]
    with pytest.raises(ValueError, match="mixture"):
        _mixed(examples, generators, tiny_target[1], {"drafts": 1.0})


def test_gradient_flows_only_into_the_draft(copy_setup, tiny_target):
    examples, draft = copy_setup
    target = models.EncoderDecoderModel(tiny_target[0])
    batch = packing.make_batch(examples, [[0, 1], [2, 3]], 16, 16)
    draft_params = init_params(draft.module, 2)

    def loss(draft_params, target_params, kind):
        p_logits = target.logits(target_params, batch)
        return distill.distillation_loss(draft, draft_params, p_logits, batch, None, 1.0, kind)[0]

    for kind in distill.DIVERGENCES:
        g_draft, g_target = jax.grad(loss, argnums=(0, 1))(draft_params, tiny_target[1], kind)
        assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_target))
        assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_draft)) > 0.0


def test_sharpened_target_turns_tvd_into_the_argmax_miss_rate(copy_setup, tiny_target):
    """τ -> 0: TVD(p_τ, q) -> 1 - q(argmax p) per token; τ = 1 is the plain loss; metrics use p."""
    examples, draft = copy_setup
    target = models.EncoderDecoderModel(tiny_target[0])
    batch = packing.make_batch(examples, [[0, 1], [2, 3]], 16, 16)
    draft_params = init_params(draft.module, 2)
    p_logits = target.logits(tiny_target[1], batch) * 5.0  # distinct maxima
    q_probs = jax.nn.softmax(draft.logits(draft_params, batch), -1)

    def run(tau):
        return distill.distillation_loss(
            draft, draft_params, p_logits, batch, None, 1.0, "tvd", 0.0, target_temperature=tau
        )[1]

    sharp, plain = run(1e-4), run(1.0)
    weights = batch["decoder_loss_weights"]
    hit = jnp.take_along_axis(q_probs, jnp.argmax(p_logits, -1)[..., None], -1)[..., 0]
    miss = float(jnp.sum((1.0 - hit) * weights) / jnp.sum(weights))
    assert float(sharp["divergence"]) == pytest.approx(miss, rel=1e-4)
    assert float(plain["divergence"]) == pytest.approx(1.0 - float(plain["alpha"]), rel=1e-5)
    assert float(plain["divergence"]) != pytest.approx(miss, rel=1e-2)
    assert float(sharp["alpha"]) == float(plain["alpha"])
    with pytest.raises(ValueError, match="target_temperature"):
        run(0.0)


def test_distillation_loss_shares_loss_fn_cross_entropy(copy_setup, tiny_target):
    """Label smoothing, z-loss and the loss normaliser of the model apply to the CE term."""
    examples, _ = copy_setup
    module, params = tiny_target
    model = models.EncoderDecoderModel(
        module, label_smoothing=0.1, z_loss=1e-3, loss_normalizing_factor=7.0
    )
    batch = packing.make_batch(examples, [[0, 1], [2, 3]], 16, 16)
    p_logits = model.logits(perturbed(params, 0.3, 0), batch)
    ce, _ = model.loss_fn(params, batch, None)
    loss, m = distill.distillation_loss(model, params, p_logits, batch, None, 0.0)
    np.testing.assert_allclose(loss, ce, rtol=1e-5)
    loss, m = distill.distillation_loss(model, params, p_logits, batch, None, 1.0, "tvd")
    np.testing.assert_allclose(m["alpha"], 1.0 - m["divergence"], rtol=1e-5)
    z = float(m["z_loss"]) * float(m["num_tokens"]) / 7.0
    np.testing.assert_allclose(loss, m["divergence"] * float(m["num_tokens"]) / 7.0 + z, rtol=1e-4)


def test_train_step_compiles_once_for_packed_and_generated(copy_setup, generators, tiny_target):
    examples, draft = copy_setup
    target = models.EncoderDecoderModel(tiny_target[0])
    opt = train.make_optimizer("adamw", 1e-3, warmup_steps=1, num_steps=10)
    step = train.make_train_step(draft, opt, False, target, "jsd")
    params = init_params(draft.module, 2)
    state = train.TrainState(jnp.asarray(0), params, opt.init(params))
    stream = _mixed(examples, generators, tiny_target[1], {"data": 0.5, "draft": 0.5})
    labels = set()
    for s in range(6):
        label, batch = stream.next(s, state.params)
        labels.add(label.split("_")[0])
        w = jnp.asarray([0.5, 0.5] if label == "data" else [0.0, 1.0])
        state, m = step(state, batch, jax.random.PRNGKey(0), tiny_target[1], w)
    assert labels == {"data", "draft"} and step._cache_size() == 1
    assert 0.0 < float(m["alpha"]) <= 1.0


def test_train_on_policy_runs_logs_alpha_and_resumes(tmp_path, tiny_target):
    """Mixed distillation end to end: per-source alpha is logged; a resumed run continues."""
    target = models.EncoderDecoderModel(tiny_target[0])
    draft = models.EncoderDecoderModel(network.Transformer(tiny_config(emb_dim=16, head_dim=4)))
    common = dict(
        run_dir=tmp_path / "run",
        batch_size=4,
        optimizer=train.make_optimizer("adamw", 3e-3, warmup_steps=2, num_steps=12),
        vocabulary=DigitVocabulary(),
        max_input_len=16,
        max_target_len=8,
        checkpoint_every=6,
        log_every=6,
        eval_every=0,
        num_eval_loss_examples=8,
        num_eval_decode_examples=4,
        eval_batch_size=4,
        decode_len=8,
        distill_from=target,
        distill_params=tiny_target[1],
        distill_divergence="tvd",
        distill_mixture={"data": 0.4, "draft": 0.4, "target": 0.2},
        regenerate_every=3,
        generated_pool_batches=2,
        progress=False,
    )
    pairs = copy_pairs(120, 0)
    train.train(draft, pairs, pairs[:8], num_steps=6, **common)
    final = train.train(draft, pairs, pairs[:8], num_steps=12, **common)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    steps = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in steps] == [6, 12] and final["num_steps"] == 12
    keys = set().union(*steps)
    assert {"alpha_data", "alpha_draft_t0", "divergence_data"} <= keys
    assert any(k.startswith("alpha_target_t") for k in keys)
    for r in steps:
        assert all(0.0 <= r[k] <= 1.0 for k in r if k.startswith("alpha_"))


def test_distill_gin_binds_draft_target_and_params_path(clean_gin, tmp_path):
    import gin

    from specdec_t5x import embedded, gin_utils

    path = tmp_path / "target" / "params.msgpack"
    embedded.save_params({"w": np.ones(2, np.float32)}, path)
    files = ["models/embedded_ende_target.gin", "models/embedded_ende_draft.gin"]
    files += ["runs/train.gin", "runs/distill.gin"]
    bindings = ["RUN_DIR = '/tmp/unused'", "NUM_STEPS = 10", "VOCABULARY = None"]
    bindings += [f"TARGET_PARAMS_PATH = '{path}'", "DIVERGENCE = 'tvd'"]
    bindings += ["gin_utils.build.obj = (%DRAFT_MODEL, %MODEL, %TARGET_PARAMS)"]
    gin_utils.parse(files, bindings, finalize=False)
    draft, target, target_params = gin_utils.build()
    assert draft.module.config.emb_dim == 128 and target.module.config.emb_dim == 256
    np.testing.assert_array_equal(target_params["w"], [1.0, 1.0])  # the export, not the shipped
    assert "distill_divergence = %DIVERGENCE" in gin.config_str()
    assert gin.query_parameter("%DIVERGENCE") == "tvd"
    assert gin.query_parameter("%MIXTURE") == {"data": 0.5, "draft": 0.5}
