"""Drafts over the target's encoder: the network, the shared set-up, the warm start, training."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import init_params, tiny_config
from test_train import DigitVocabulary, copy_pairs

from specdec_t5x import drafts, embedded, models, network, steps
from specdec_t5x.timing import overheads
from specdec_t5x.training import checkpoints as train_checkpoints
from specdec_t5x.training import shared_encoder, train

DRAFT_SHAPE = dict(emb_dim=6, num_heads=2, head_dim=3, mlp_dim=12, num_decoder_layers=1)


def te_draft(target_module, seed=3):
    """A TargetEncoderTransformer over `target_module`'s encoder and its own (draft) subtrees."""
    module = network.TargetEncoderTransformer(
        tiny_config(**DRAFT_SHAPE), encoder_config=target_module.config
    )
    return module, drafts.draft_subtrees(init_params(module, seed))


def test_tree_holds_the_targets_encoder_and_the_drafts_decoder(tiny_target):
    target, tp = tiny_target
    module, own = te_draft(target)
    assert sorted(own) == ["decoder", "token_embedder"]
    cross = own["decoder"]["layers_0"]["encoder_decoder_attention"]
    assert cross["key"]["kernel"].shape == (target.config.emb_dim, 2 * 3)  # target width in
    assert own["token_embedder"]["embedding"].shape == (32, 6)
    full = drafts.with_target_encoder(own, tp)
    assert sorted(full) == ["decoder", "encoder", "encoder_token_embedder", "token_embedder"]
    assert full["encoder"] is tp["encoder"]  # shared leaves, not a copy
    enc = jnp.asarray([[5, 6, 7, 1, 0]], jnp.int32)
    encode = jax.jit(steps.encode, static_argnums=0)
    np.testing.assert_array_equal(encode(module, full, enc), encode(target, tp, enc))
    with pytest.raises(KeyError, match="lack"):
        drafts.with_target_encoder(own, {"decoder": tp["decoder"]})


def test_bad_configurations_are_refused(tiny_target):
    target, tp = tiny_target
    ones = jnp.ones((1, 4), jnp.int32)
    for encoder_config in (None, tiny_config(vocab_size=40)):
        module = network.TargetEncoderTransformer(tiny_config(), encoder_config=encoder_config)
        with pytest.raises(ValueError, match="encoder_config"):
            module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)
    with pytest.raises(ValueError, match="TargetEncoderTransformer"):
        drafts.T5Draft(target, tp, share_target_encoder=True)
    module, own = te_draft(target)
    with pytest.raises(ValueError, match="pass encoded"):
        drafts.T5Draft(module, own, share_target_encoder=True).prepare(own, ones, 8)


def test_shared_setup_equals_the_drafts_own_encoder_pass(tiny_target):
    target, tp = tiny_target
    module, own = te_draft(target)
    shared = models.SpeculativeEncoderDecoderModel(
        target, drafts.T5Draft(module, own, share_target_encoder=True)
    )
    alone = models.SpeculativeEncoderDecoderModel(
        target, drafts.T5Draft(module, drafts.with_target_encoder(own, tp))
    )
    enc = jnp.asarray([[5, 6, 7, 1, 0], [9, 8, 1, 0, 0]], jnp.int32)
    (tc, ts), (dc, ds) = shared.states(tp, own, enc, 8)
    dc2, ds2 = alone.draft_state(tp, drafts.with_target_encoder(own, tp), enc, 8)
    tokens, pos = jnp.asarray([[0, 4], [0, 9]], jnp.int32), jnp.zeros((2,), jnp.int32)
    np.testing.assert_array_equal(
        jax.jit(ds)(tokens, pos, dc)[0], jax.jit(ds2)(tokens, pos, dc2)[0]
    )
    tc2, ts2 = shared.decoder_state(tp, enc, 8)
    np.testing.assert_array_equal(
        jax.jit(ts)(tokens, pos, tc)[0], jax.jit(ts2)(tokens, pos, tc2)[0]
    )
    # The eval job's set-up timing takes the shared path (no encoder pass of the draft's own).
    setup = overheads.measure_setup_ms(shared, tp, own, enc, 8, repeats=1)
    assert setup["draft_setup_ms"] > 0 and setup["target_setup_ms"] > 0


def test_argmax_mode_equals_the_targets_greedy_output(tiny_target, gamma=3):
    target, tp = tiny_target
    module, own = te_draft(target)
    spec = models.SpeculativeEncoderDecoderModel(
        target, drafts.T5Draft(module, own, share_target_encoder=True)
    )
    rng = np.random.RandomState(gamma)
    enc = np.zeros((4, 9), np.int32)
    for r, n in enumerate([9, 5, 7, 3]):
        enc[r, : n - 1], enc[r, n - 1] = rng.randint(2, 32, n - 1), 1
    batch = {"encoder_input_tokens": enc, "decoder_input_tokens": np.zeros((4, 16), np.int32)}
    expected = models.EncoderDecoderModel(target).predict_batch(
        tp, batch, decoder_params={"temperature": 0.0, "topk": 0}
    )
    decodes, aux = jax.jit(
        lambda p, dp, b: spec.predict_batch_with_aux(
            p, b, decoder_params={"gamma": gamma, "temperature": 0.0}, draft_params=dp
        )
    )(tp, own, batch)
    np.testing.assert_array_equal(decodes, expected)
    assert int(np.sum(aux["stats"].num_draft_tokens)) > 0


def test_fit_encoder_map_recovers_a_linear_map():
    rng = np.random.RandomState(0)
    x = rng.randn(3, 20, 8)
    a = rng.randn(8, 5)
    weights = np.ones((3, 20))
    weights[:, 15:] = 0
    y = x @ a
    y[:, 15:] = 99.0  # padding: left out of the fit
    fitted, r2 = shared_encoder.fit_encoder_map(x, y, weights, ridge=0.0)
    np.testing.assert_allclose(fitted, a, rtol=1e-4, atol=1e-5)
    assert r2 == pytest.approx(1.0)
    _, r2_noisy = shared_encoder.fit_encoder_map(x, y + 3 * rng.randn(*y.shape), weights)
    assert r2_noisy < 0.9
    with pytest.raises(ValueError, match="same batch"):
        shared_encoder.fit_encoder_map(x, y[:2], weights)
    with pytest.raises(ValueError, match="at least 8"):
        shared_encoder.fit_encoder_map(x, y, np.zeros((3, 20)))


def test_mapped_cross_attention_reads_the_target_encoding_as_the_old_read_the_mapped_one(
    tiny_target,
):
    """decoder(mapped params, encoded) == decoder(old params, encoded @ A): the map composes."""
    target, tp = tiny_target
    old_module = network.Transformer(tiny_config(**DRAFT_SHAPE))
    old = init_params(old_module, 5)
    a = np.random.RandomState(1).randn(target.config.emb_dim, 6).astype(np.float32) * 0.5
    own = shared_encoder.map_cross_attention(old, a)
    assert sorted(own) == ["decoder", "token_embedder"]
    module = network.TargetEncoderTransformer(
        tiny_config(**DRAFT_SHAPE), encoder_config=target.config
    )
    enc = jnp.asarray([[5, 6, 7, 1, 0]], jnp.int32)
    dec = jnp.asarray([[0, 4, 9, 2]], jnp.int32)
    encoded = steps.encode(target, tp, enc)

    def decode(m, params, x):
        return m.apply({"params": params}, x, enc, dec, dec, enable_dropout=False, method=m.decode)

    np.testing.assert_allclose(
        decode(module, own, encoded), decode(old_module, old, encoded @ a), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ValueError, match="input width"):
        shared_encoder.map_cross_attention(old, a[:, :4])


def test_training_keeps_the_target_encoder_frozen_and_exports_the_draft_only(tmp_path, tiny_target):
    target, tp = tiny_target
    module, own = te_draft(target)
    full = drafts.with_target_encoder(own, tp)
    common = dict(
        run_dir=tmp_path / "run",
        batch_size=4,
        optimizer=train.make_optimizer(
            "adamw", 3e-3, warmup_steps=1, num_steps=4, weight_decay=0.1
        ),
        vocabulary=DigitVocabulary(),
        max_input_len=16,
        max_target_len=8,
        checkpoint_every=4,
        log_every=2,
        eval_every=0,
        num_eval_loss_examples=8,
        num_eval_decode_examples=4,
        eval_batch_size=4,
        decode_len=8,
        distill_from=models.EncoderDecoderModel(target),
        distill_params=tp,
        distill_divergence="tvd",
        distill_mixture={"data": 0.5, "draft": 0.5},
        regenerate_every=2,
        generated_pool_batches=1,
        init_params=full,
        export_path=tmp_path / "export" / "params.msgpack",
        export_dtype=jnp.float32,
        progress=False,
    )
    pairs = copy_pairs(60, 0)
    draft_model = models.EncoderDecoderModel(module)
    with pytest.raises(ValueError, match="match no parameter"):
        train.train(draft_model, pairs, pairs[:8], num_steps=4, frozen_params=("enc",), **common)
    frozen = tuple(drafts.TARGET_ENCODER_SUBTREES)
    final = train.train(draft_model, pairs, pairs[:8], num_steps=4, frozen_params=frozen, **common)
    assert final["num_steps"] == 4
    exported = embedded.load_params(path=tmp_path / "export" / "params.msgpack")
    assert sorted(exported) == ["decoder", "token_embedder"]
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), exported, own)
    assert max(jax.tree_util.tree_leaves(moved)) > 0  # the draft trained
    # The checkpoint's encoder is the target's, untouched (weight decay 0.1 would move it).
    path, _ = train_checkpoints.export_checkpoint(
        tmp_path / "run", tmp_path / "ckpt.msgpack", None, jnp.float32
    )
    ckpt = embedded.load_params(path=path)
    for mine, theirs in drafts.TARGET_ENCODER_SUBTREES.items():
        jax.tree_util.tree_map(np.testing.assert_array_equal, ckpt[mine], tp[theirs])
    path, _ = train_checkpoints.export_checkpoint(
        tmp_path / "run", tmp_path / "own.msgpack", None, jnp.float32, exclude=frozen
    )
    assert sorted(embedded.load_params(path=path)) == ["decoder", "token_embedder"]
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert any("alpha_draft_t0" in r for r in records)


def test_gin_model_file_builds_a_sharing_draft_and_its_training_tree(clean_gin, tmp_path):
    from benchmarks import accelerator
    from specdec_t5x import gin_utils

    target = network.Transformer(accelerator.EMBEDDED["embedded_ende_target"])
    module = network.TargetEncoderTransformer(
        accelerator.EMBEDDED["embedded_ende_draft"], encoder_config=target.config
    )
    shapes = jax.eval_shape(lambda: init_params(module, 0))
    own = drafts.draft_subtrees(
        jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    )
    path = embedded.save_params(own, tmp_path / "te" / "params.msgpack")
    files = ["models/embedded_ende_target.gin", "models/embedded_ende_draft_te.gin"]
    bindings = [f"DRAFT_PARAMS_PATH = '{path}'", "VOCABULARY = None"]
    bindings += ["gin_utils.build.obj = (%DRAFT, %DRAFT_PARAMS, %DRAFT_MODEL, %TARGET_PARAMS)"]
    gin_utils.parse(files, bindings, finalize=False)
    draft, full, draft_model, tp = gin_utils.build()
    assert draft.shares_target_encoder and isinstance(
        draft.module, network.TargetEncoderTransformer
    )
    assert sorted(draft.params) == ["decoder", "token_embedder"]  # no copy of the encoder
    assert sorted(full) == ["decoder", "encoder", "encoder_token_embedder", "token_embedder"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, full["encoder"], tp["encoder"])
    assert draft_model.module.encoder_config.emb_dim == 256
