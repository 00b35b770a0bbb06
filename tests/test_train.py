"""Training loop: packing, distillation loss, and a resumable smoke run on a synthetic copy task."""

import json
import re

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from specdec_t5x import embedded, gin_utils, models, network
from specdec_t5x.data import packing
from specdec_t5x.training import checkpoints as train_checkpoints
from specdec_t5x.training import distill, freezing, train, validation


class DigitVocabulary:
    """Fake vocabulary: "5 7 9" <-> [5, 7, 9]; pad 0, EOS 1 (T5 conventions)."""

    eos_id = 1

    def encode(self, text):
        return [int(t) for t in text.split()]

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def copy_pairs(n, seed, vocab=32):
    """Synthetic copy task: the target repeats the 2-6 input tokens."""
    rng = np.random.RandomState(seed)
    pairs = []
    for _ in range(n):
        text = " ".join(str(t) for t in rng.randint(3, vocab, rng.randint(2, 7)))
        pairs.append((text, text))
    return pairs


def test_pack_rows_first_fit():
    lengths = np.array([[3, 2], [4, 4], [2, 3]])
    assert packing.pack_rows(lengths, [0, 1, 2], 6, 6) == [[0, 2], [1]]


def test_make_batch_matches_docstring():
    examples = [(np.array([5, 1]), np.array([7, 8, 1])), (np.array([6, 1]), np.array([9, 1]))]
    b = packing.make_batch(examples, [[0, 1]], 6, 6)
    np.testing.assert_array_equal(b["encoder_input_tokens"][0], [5, 1, 6, 1, 0, 0])
    np.testing.assert_array_equal(b["encoder_segment_ids"][0], [1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(b["encoder_positions"][0], [0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(b["decoder_target_tokens"][0], [7, 8, 1, 9, 1, 0])
    np.testing.assert_array_equal(b["decoder_input_tokens"][0], [0, 7, 8, 0, 9, 0])
    np.testing.assert_array_equal(b["decoder_positions"][0], [0, 1, 2, 0, 1, 0])
    np.testing.assert_array_equal(b["decoder_loss_weights"][0], [1, 1, 1, 1, 1, 0])


def test_packed_logits_equal_unpacked(tiny_target):
    """Packing two examples into one row changes nothing about either example's logits."""
    module, params = tiny_target
    model = models.EncoderDecoderModel(module)
    examples = [(np.array([5, 9, 1]), np.array([7, 8, 1])), (np.array([6, 1]), np.array([9, 4, 1]))]
    packed = packing.make_batch(examples, [[0, 1]], 8, 8)
    single = packing.make_batch(examples, [[0], [1]], 8, 8)
    packed_logits = model.logits(params, packed)[0]  # [8, V]
    single_logits = model.logits(params, single)  # [2, 8, V]
    np.testing.assert_allclose(packed_logits[:3], single_logits[0, :3], atol=1e-5)
    np.testing.assert_allclose(packed_logits[3:6], single_logits[1, :3], atol=1e-5)


def test_packed_batches_resume_replays_stream():
    examples = packing.tokenize(copy_pairs(40, 0), DigitVocabulary(), "", 8, 8, drop_long=True)
    stream = packing.PackedBatches(examples, 4, 16, 16, seed=3)
    for _ in range(5):  # crosses an epoch boundary (40 examples ~ 10 rows)
        next(stream)
    state = stream.state()
    expected = next(stream)
    resumed = packing.PackedBatches(examples, 4, 16, 16, seed=3)
    resumed.restore(state)
    got = next(resumed)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_distillation_loss_zero_kl_against_itself(tiny_target):
    module, params = tiny_target
    model = models.EncoderDecoderModel(module)
    examples = packing.tokenize(copy_pairs(6, 1), DigitVocabulary(), "", 8, 8, drop_long=True)
    batch = packing.make_batch(examples, [[0, 1], [2, 3]], 16, 16)
    p_logits = model.logits(params, batch)
    loss, m = distill.distillation_loss(model, params, p_logits, batch, None, distill_weight=1.0)
    assert abs(float(m["kl"])) < 1e-5 and abs(float(loss)) < 1e-5
    np.testing.assert_allclose(m["alpha"], 1.0, atol=1e-5)  # q = p accepts everything
    ce, _ = model.loss_fn(params, batch, None)
    _, m = distill.distillation_loss(model, params, p_logits, batch, None, distill_weight=0.0)
    np.testing.assert_allclose(m["loss"], ce, rtol=1e-5)


def test_embedded_params_round_trip(tmp_path, tiny_target):
    _, params = tiny_target
    path = embedded.save_params(params, tmp_path / "m" / "params.msgpack", jnp.bfloat16)
    restored = embedded.load_params(path=path)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True):
        assert b.dtype == jnp.float32
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError):
        embedded.load_params()
    # A file cut short (an interrupted copy or download) names itself and what went wrong.
    cut = tmp_path / "cut" / "params.msgpack"
    cut.parent.mkdir()
    cut.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=rf"parameter file {cut} is truncated or not a param"):
        embedded.load_params(path=cut)
    cut.write_bytes(b"\x2a")  # msgpack's 42: decodable, but no tree
    with pytest.raises(ValueError, match=rf"parameter file {cut} decodes to int, not a parameter"):
        embedded.load_params(path=cut)


def test_train_lowers_loss_and_resumes(tmp_path):
    """A few steps on the copy task lower the loss; a second call resumes from the checkpoint."""
    module = network.Transformer(tiny_config(emb_dim=32, mlp_dim=64, head_dim=8))
    model = models.EncoderDecoderModel(module)
    common = dict(
        run_dir=tmp_path / "run",
        batch_size=8,
        optimizer=train.make_optimizer("adamw", 3e-3, warmup_steps=5, num_steps=60),
        vocabulary=DigitVocabulary(),
        max_input_len=16,
        max_target_len=16,
        checkpoint_every=20,
        log_every=10,
        eval_every=0,
        num_eval_decode_examples=8,
        eval_batch_size=8,
        decode_len=8,
        progress=False,
    )
    train_pairs, eval_pairs = copy_pairs(400, 0), copy_pairs(16, 1)
    first = train.train(model, train_pairs, eval_pairs, num_steps=40, **common)
    assert first["num_steps"] == 40
    final = train.train(
        model,
        train_pairs,
        eval_pairs,
        num_steps=60,
        export_path=tmp_path / "export" / "params.msgpack",
        test_data=eval_pairs,
        **common,
    )
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    steps = [r["step"] for r in records if r["split"] == "train"]
    assert steps == [10, 20, 30, 40, 50, 60]  # resumed at 40, not restarted
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert losses[-1] < 0.7 * losses[0]
    assert final["num_steps"] == 60 and final["loss"] < first["loss"]
    assert final["num_test_examples"] == 16
    assert (tmp_path / "run" / "test_predictions.jsonl").is_file()
    exported = embedded.load_params(path=tmp_path / "export" / "params.msgpack")
    # A mid-run checkpoint exports to the same file format; the last one equals train's export.
    path, step = train_checkpoints.export_checkpoint(
        tmp_path / "run", tmp_path / "ckpt" / "params.msgpack"
    )
    assert step == 60
    from_checkpoint = embedded.load_params(path=path)
    assert jax.tree_util.tree_structure(from_checkpoint) == jax.tree_util.tree_structure(exported)
    for a, b in zip(
        jax.tree_util.tree_leaves(from_checkpoint), jax.tree_util.tree_leaves(exported), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FileNotFoundError, match="step 7"):
        train_checkpoints.export_checkpoint(tmp_path / "run", tmp_path / "x.msgpack", step=7)
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        train_checkpoints.export_checkpoint(tmp_path / "nowhere", tmp_path / "x.msgpack")


RUN = ["RUN_DIR = '/tmp/unused'", "NUM_STEPS = 10", "VOCABULARY = None"]  # no seqio import


def test_train_gin_requires_run_dir_and_steps(clean_gin):
    with pytest.raises(ValueError, match="NUM_STEPS, RUN_DIR"):
        gin_utils.parse(["models/embedded_ende_target.gin", "runs/train.gin"], finalize=False)


@pytest.mark.parametrize("which", ["target", "draft"])
def test_train_gin_builds_embedded_models(clean_gin, which):
    files = ["models/embedded_ende_target.gin", "models/embedded_ende_draft.gin", "runs/train.gin"]
    model = "%MODEL" if which == "target" else "%DRAFT_MODEL"
    gin_utils.parse(files, [*RUN, f"gin_utils.build.obj = {model}"], finalize=False)
    built = gin_utils.build()
    cfg = built.module.config
    assert isinstance(built, models.EncoderDecoderModel) and cfg.vocab_size == 8192
    assert cfg.emb_dim == {"target": 256, "draft": 128}[which]
    assert gin.query_parameter("%NUM_STEPS") == 10
    assert gin.query_parameter("%OPTIMIZER") == "adafactor"


@pytest.mark.skipif(
    not all(embedded.params_path(f"embedded_ende_{w}").is_file() for w in ("target", "draft")),
    reason="shipped embedded models not present (scripts/train_embedded.sh makes them)",
)
@pytest.mark.parametrize("task,draft", [("ende", ""), ("sum", ""), ("sum", "_te"), ("correct", "")])
def test_shipped_params_fit_their_gin_architectures(clean_gin, task, draft):
    gin_utils.parse(
        [f"models/embedded_{task}_target.gin", f"models/embedded_{task}_draft{draft}.gin"],
        ["gin_utils.build.obj = (%TARGET_MODULE, %TARGET_PARAMS, %DRAFT_MODULE, %DRAFT_PARAMS)"],
    )
    target_module, target_params, draft_module, draft_params = gin_utils.build()
    ones = jnp.ones((1, 4), jnp.int32)
    for module, params in ((target_module, target_params), (draft_module, draft_params)):
        init = jax.eval_shape(lambda m=module: m.init(jax.random.PRNGKey(0), ones, ones, ones))
        expected = jax.tree.map(lambda x: (x.shape, x.dtype), init["params"])
        assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == expected


def test_quality_metric_bleu_rouge_or_correction():
    assert set(validation.quality(["the cat sat"], ["the cat sat"], "bleu")) == {"bleu"}
    rouge = validation.quality(["the cat sat"], ["the cat ran"], "rouge")
    assert rouge == pytest.approx({"rouge1": 200 / 3, "rouge2": 50.0, "rougeL": 200 / 3})
    correction = validation.quality(["It is fast."], ["It is fast."], "correction")
    assert correction["exact_match"] == 100.0 and set(correction) == {"exact_match", "chrf", "bleu"}
    with pytest.raises(ValueError, match="'meteor'"):
        validation.quality([], [], "meteor")


def test_plot_curves_offsets_resumed_runs(tmp_path):

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"split": "train", "step": 10, "loss": 3.0},
        {"split": "validation", "step": 10, "loss": 3.5, "bleu": 1.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "curves.png"
    validation.plot_curves({"a": run, "b": run / "metrics.jsonl"}, out, step_offsets={"b": 1000})
    assert out.stat().st_size > 0
    with pytest.raises(ValueError, match="'c'"):
        validation.plot_curves({"a": run}, out, step_offsets={"c": 5})


def test_freezing_patterns_pick_subtrees_and_wildcards():
    patterns = ("token_embedder", "decoder/logits_dense", "*/mlp/*")
    assert freezing.matches("token_embedder/embedding", patterns)
    assert freezing.matches("decoder/logits_dense/kernel", patterns)
    assert freezing.matches("encoder/layers_3/mlp/wi_0/kernel", patterns)
    assert not freezing.matches("encoder/layers_3/attention/query/kernel", patterns)
    assert not freezing.matches("decoder/logits_densest/kernel", patterns)  # a path, not a prefix
    with pytest.raises(ValueError, match=re.escape("['*/mpl/*'] match no parameter")):
        freezing.check_patterns({"encoder": {"mlp": {"wo": np.zeros(2)}}}, ["*/mpl/*"])


def test_partial_fine_tune_trains_only_its_leaves_and_ships_them_over_a_base(tmp_path, monkeypatch):
    """Attention-only fine-tuning: frozen leaves do not move, the export holds the trained leaves
    only with `base.json`, and `embedded.load_params` returns the whole tree the run evaluated."""
    monkeypatch.setattr(embedded, "MODELS_DIR", tmp_path / "models")
    module = network.Transformer(tiny_config(emb_dim=32, mlp_dim=64, head_dim=8))
    model = models.EncoderDecoderModel(module)
    shapes = {"encoder_input_tokens": (1, 16), "decoder_input_tokens": (1, 8)}
    base = model.get_initial_variables(jax.random.PRNGKey(3), shapes)["params"]
    embedded.save_params(base, embedded.params_path("base_model"), jnp.float32)
    frozen = ("token_embedder", "decoder/logits_dense", "*/mlp/*")
    export = tmp_path / "tuned" / "params.msgpack"
    final = train.train(
        model,
        copy_pairs(200, 0),
        copy_pairs(8, 1),
        run_dir=tmp_path / "run",
        num_steps=6,
        batch_size=8,
        optimizer=train.make_optimizer("adamw", 3e-3, warmup_steps=2, num_steps=6),
        vocabulary=DigitVocabulary(),
        max_input_len=16,
        max_target_len=16,
        log_every=3,
        eval_every=0,
        num_eval_decode_examples=8,
        eval_batch_size=8,
        decode_len=8,
        progress=False,
        init_params=base,
        frozen_params=frozen,
        export_path=export,
        export_dtype=jnp.float32,
        export_base="base_model",
    )
    assert final["num_steps"] == 6
    stored = freezing.flat(flax.serialization.msgpack_restore(export.read_bytes()))
    assert stored and not any(freezing.matches(path, frozen) for path in stored)
    assert json.loads((export.parent / "base.json").read_text())["base"] == "base_model"
    loaded, base_flat = freezing.flat(embedded.load_params(path=export)), freezing.flat(base)
    assert set(loaded) == set(base_flat)
    for path, leaf in loaded.items():
        if freezing.matches(path, frozen):
            np.testing.assert_array_equal(leaf, base_flat[path])
        else:
            np.testing.assert_array_equal(leaf, stored[path])
    changed = [p for p in stored if not np.array_equal(stored[p], base_flat[p])]
    assert any("attention" in p for p in changed)  # the run did train
    # A base that changed since is refused, naming both digests.
    embedded.save_params(jax.tree.map(lambda x: x + 1, base), embedded.params_path("base_model"))
    with pytest.raises(ValueError, match="base model changed"):
        embedded.load_params(path=export)
    with pytest.raises(ValueError, match="needs frozen_params"):
        train.train(
            model,
            [],
            [],
            run_dir=tmp_path / "r2",
            num_steps=1,
            batch_size=8,
            vocabulary=DigitVocabulary(),
            optimizer=train.make_optimizer("adamw", 1e-3),
            export_base="base_model",
        )


def test_correction_report_counts_what_the_model_and_the_references_change():
    rows = [
        {"input": "It are fast.", "reference": "It is fast.", "prediction": "It is fast."},  # fixed
        {"input": "Zed prases.", "reference": "Zed parses.", "prediction": "Zed prases."},  # missed
        {"input": "Clean text.", "reference": "Clean text.", "prediction": "Clean text."},  # kept
        {"input": "Also clean.", "reference": "Also clean.", "prediction": "Also, clean."},  # broke
    ]
    report = validation.correction_report(rows)
    assert report["exact_match"] == 50.0 and report["examples"] == 4
    assert report["references_changed"] == 2 and report["predictions_unchanged"] == 2
    assert (report["fixed"], report["kept_clean"], report["broke_clean"]) == (1, 1, 1)
    with pytest.raises(ValueError, match="at least one row"):
        validation.correction_report([])
