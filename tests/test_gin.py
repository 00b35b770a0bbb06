"""Every gin file parses and builds what it provides (required macros filled where needed)."""

import pathlib

import gin
import jax
import jax.numpy as jnp
import pytest

from specdec_t5x import gin_utils, models, network

GIN = gin_utils.GIN_DIR
MODEL_FILES = sorted(p.name for p in (GIN / "models").glob("t5_1_1_*.gin"))
DRAFT_FILES = sorted(p.name for p in (GIN / "models").glob("draft_*.gin"))
DECODING_FILES = sorted(p.name for p in (GIN / "decoding").glob("*.gin"))


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config(clear_constants=True)
    yield
    gin.clear_config(clear_constants=True)


def build(files, bindings=(), what="%MODEL"):
    gin_utils.parse(
        list(files),
        [*bindings, f"gin_utils.build.obj = {what}"],
        finalize=False,
    )
    return gin_utils.build()


def test_model_gin_files_exist():
    assert {f"t5_1_1_{s}.gin" for s in ("tiny", "small", "base", "large", "xl", "xxl")} <= set(
        MODEL_FILES
    )


@pytest.mark.parametrize("name", MODEL_FILES)
def test_t5_model_gin_builds(name):
    if name.endswith("_checkpoint.gin"):  # weights from a checkpoint: the macro must be named
        with pytest.raises(ValueError, match="TARGET_CHECKPOINT"):
            build([f"gin/models/{name}"], ["DROPOUT_RATE = 0.0"])
        return
    model = build(
        [f"gin/models/{name}"],
        ["DROPOUT_RATE = 0.0"],
    )
    assert isinstance(model, models.EncoderDecoderModel)
    cfg = model.module.config
    assert isinstance(cfg, network.T5Config) and cfg.vocab_size == 32128
    assert tuple(cfg.mlp_activations) == ("gelu", "linear") and not cfg.logits_via_embedding
    # T5X's numerics (T5X's v1.1 gins: bfloat16 activations, float32_attention_logits off).
    assert jnp.dtype(cfg.dtype) == jnp.bfloat16 and not cfg.float32_attention_logits
    assert not cfg.float32_final_logits
    if name == "t5_1_1_tiny.gin":  # small enough to really initialise and run
        ones = jnp.ones((1, 3), jnp.int32)
        out = model.module.apply(
            model.module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False),
            ones,
            ones,
            ones,
            enable_dropout=False,
        )
        assert out.shape == (1, 3, 32128)


def test_t5_model_gin_requires_dropout_rate():
    with pytest.raises(Exception, match="(?i)dropout_rate"):
        build(["gin/models/t5_1_1_small.gin"], [])


@pytest.mark.parametrize("name", DECODING_FILES)
def test_decoding_gin_binds_explicit_topk(name):
    bindings = ["DROPOUT_RATE = 0.0"]
    files = ["gin/models/t5_1_1_tiny.gin", f"gin/decoding/{name}"]
    if name == "speculative.gin":
        files.append("gin/models/draft_source_copy.gin")  # after speculative.gin (DRAFT)
        model = build(files, bindings, what="%SPEC_MODEL")
        assert isinstance(model, models.SpeculativeEncoderDecoderModel)
        # One route: the run passes gamma and the sampling settings per call (gin/runs/eval.gin),
        # so the sampler's own parameters stay unbound.
        with pytest.raises(ValueError):
            gin.query_parameter("speculative.speculative_sample.gamma")
        bound = gin.query_parameter("%TOPK")
    else:
        model = build(files, bindings)
        bound = gin.query_parameter("decoding.temperature_sample.topk")
    assert bound is not None  # topk always explicit (T5X's default is 1 = greedy)
    assert callable(model.decode_fn)


def test_every_gin_file_is_covered_somewhere():
    """New gin folders must get a test (experiments/runs are tested by their own modules; t5x/,
    the files for T5X's binaries, by tests/test_t5x_contract.py)."""
    folders = {p.parent.name for p in pathlib.Path(GIN).rglob("*.gin")}
    assert folders <= {"models", "decoding", "runs", "experiments", "t5x"}


@pytest.mark.parametrize("name", DRAFT_FILES)
def test_draft_gin_builds_a_draft(name):
    if name.startswith("draft_t5_1_1_"):  # weights come from a checkpoint: must be named
        with pytest.raises(ValueError, match="DRAFT_CHECKPOINT"):
            build(["gin/models/t5_1_1_tiny.gin", f"gin/models/{name}"], ["DROPOUT_RATE = 0.0"])
        return
    embedded = "ende" in name or "sum" in name  # the project-vocabulary drafts
    base = "gin/models/embedded_common.gin" if embedded else "gin/models/t5_1_1_tiny.gin"
    bindings = [] if embedded else ["DROPOUT_RATE = 0.0"]  # embedded_common has no dropout
    draft = build([base, f"gin/models/{name}"], bindings, what="%DRAFT")
    vocab = 8192 if embedded else 32128
    cache, step = draft.prepare(draft.params, jnp.ones((2, 5), jnp.int32), 7)
    logits, _ = step(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2,), jnp.int32), cache)
    assert logits.shape == (2, 3, vocab)


def test_mistyped_macro_binding_is_an_error_naming_the_macro():
    files = ["gin/runs/eval.gin", "gin/experiments/embedded_ende_model_t0.gin"]
    with pytest.raises(ValueError, match=r"GAMA \(did you mean GAMMA"):
        gin_utils.parse(files, ["GAMA=3"], finalize=False)
    gin.clear_config(clear_constants=True)
    gin_utils.parse(files, ["GAMMA=3"], finalize=False)  # the right name is accepted
    assert gin.query_parameter("%GAMMA") == 3


def test_experiment_outputs_go_to_untracked_runs_folder():
    """results/ holds committed, regenerated tables; run outputs go to runs/ (git-ignored)."""
    for path in sorted((GIN / "experiments").glob("*.gin")):
        for line in path.read_text().splitlines():
            if line.startswith("EVAL_OUTPUT_DIR"):
                assert line.split("=", 1)[1].strip().startswith("'runs/"), (path.name, line)


@pytest.mark.parametrize(
    "name", ["embedded_ende_draft.gin", "embedded_sum_draft.gin", "embedded_sum_draft_te.gin"]
)
def test_embedded_drafts_hold_bfloat16_cpu_weights_unless_asked_for_float32(name):
    from specdec_t5x import cpu_kernel

    if cpu_kernel.disabled_reason():
        pytest.skip(f"CPU kernel off here: {cpu_kernel.disabled_reason()}")
    target = "gin/models/embedded_sum_target.gin"  # the target-encoder draft names its encoder
    files = ["gin/models/embedded_common.gin", target, f"gin/models/{name}"]
    assert cpu_kernel.packed_weight_dtype(build(files, what="%DRAFT").params) == "bfloat16"
    gin.clear_config(clear_constants=True)
    f32 = build(files, ["DRAFT_CPU_WEIGHT_DTYPE = 'float32'"], what="%DRAFT")
    assert cpu_kernel.packed_weight_dtype(f32.params) == "float32"
