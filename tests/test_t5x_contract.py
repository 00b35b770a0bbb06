"""T5X's model contract, called as T5X's own binaries call it, without T5X installed.

What `t5x/infer.py`, `t5x/eval.py` and `t5x/utils.py` (google-research/t5x at cc342d4) call on a
model, and where this file checks it:

* `model.FEATURE_CONVERTER_CLS(pack=False)` (infer.py, eval.py): `test_feature_converter`.
* `model.get_initial_variables(rng=, input_shapes=, input_types=)` under `jax.eval_shape`
  (`utils.TrainStateInitializer`), its `params_axes` turned into mesh axes by flax's
  `get_axis_names` and `logical_to_mesh_axes` with T5X's standard rules (`InferenceState.
  as_logical_axes`, `PjitPartitioner.get_mesh_axes`), then `predict_batch_with_aux` jitted with
  those shardings (`utils.get_infer_fn`): `run_as_t5x`, on 1 CPU device and on 2 in a subprocess.
* `score_batch(params, batch, return_intermediates=False)` (eval.py's score mode).
* The axis names, leaf for leaf, against those T5X's own network declares for T5 1.1 small, base
  and XXL (`tests/golden/t5x_params_axes.json`, recorded by `scripts/record_t5x_axes.py`).
* `gin/t5x/speculative.gin`, parsed as a user's T5X gin includes it (T5X's imported names come from
  `tests/t5x_stand_ins/`): greedy stays greedy, the missing-γ error fires under gin, the draft is
  restored into `params['draft']` by `t5x_binaries.AddDraftParams`, a misordered include is named.
"""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, tiny_config
from flax.linen import partitioning as flax_partitioning
from flax.traverse_util import flatten_dict
from jax.sharding import NamedSharding

from specdec_t5x import (
    checkpoints,
    decoding,
    drafts,
    gin_utils,
    models,
    network,
    partitioning,
    t5x_binaries,
)

TESTS = pathlib.Path(__file__).resolve().parent
GOLDEN = json.loads((TESTS / "golden" / "t5x_params_axes.json").read_text())
STAND_INS = TESTS / "t5x_stand_ins"
# T5X's `standard_logical_axis_rules()` (1-D parameter and activation partitioning) as T5X's
# PjitPartitioner passes them to flax.
T5X_RULES = [*partitioning.LOGICAL_AXIS_RULES, ("layers", None)]
T5X_INPUT_SHAPES = {"encoder_input_tokens": (4, 7), "decoder_input_tokens": (4, 8)}
T5X_INPUT_TYPES = {"encoder_input_tokens": np.int32, "decoder_input_tokens": np.int32}
GREEDY = {"temperature": 0.0, "topk": 0}


def tiny_pair(draft_in_params: bool):
    module = network.Transformer(tiny_config())
    draft_module = network.Transformer(tiny_config(num_encoder_layers=1, num_decoder_layers=1))
    draft_params = None if draft_in_params else init_params(draft_module, 2)
    draft = drafts.T5Draft(draft_module, draft_params)
    spec = models.SpeculativeEncoderDecoderModel(
        module, draft, decode_fn=decoding_partial(), draft_in_params=draft_in_params
    )
    return module, spec


def decoding_partial():
    from specdec_t5x import speculative

    def decode_fn(*args, **kwargs):  # a bound decode fn, as gin's wrapper is
        return speculative.speculative_sample(*args, **{"gamma": 3, **GREEDY, **kwargs})

    return decode_fn


def batch_of(batch_size: int = 4):
    return {
        "encoder_input_tokens": encoder_inputs(batch_size, 7, [7, 4, 6, 2][:batch_size]),
        "decoder_input_tokens": jnp.zeros((batch_size, 8), jnp.int32),
    }


def mesh_axes(model):
    """T5X's route from a model to parameter mesh axes (TrainStateInitializer, InferenceState.
    as_logical_axes, PjitPartitioner.get_mesh_axes)."""
    shapes = jax.eval_shape(
        lambda rng: model.get_initial_variables(
            rng=rng, input_shapes=T5X_INPUT_SHAPES, input_types=T5X_INPUT_TYPES
        ),
        jax.random.PRNGKey(0),
    )
    logical = flax.core.unfreeze(flax_partitioning.get_axis_names(shapes["params_axes"]))
    return jax.tree_util.tree_map(
        lambda spec: flax_partitioning.logical_to_mesh_axes(spec, T5X_RULES),
        logical,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )


def run_as_t5x():
    """The speculative model (draft in params) jitted as T5X's infer step with T5X's parameter
    shardings on all devices; returns a JSON-able summary."""
    module, spec = tiny_pair(draft_in_params=True)
    variables = spec.get_initial_variables(jax.random.PRNGKey(1), T5X_INPUT_SHAPES, T5X_INPUT_TYPES)
    params = variables["params"]
    mesh = partitioning.make_mesh((1, -1))  # T5X's CPU mesh: every device on 'model'
    specs = mesh_axes(spec)
    shardings = jax.tree_util.tree_map(
        lambda s: NamedSharding(mesh, s),
        specs,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )
    params = jax.device_put(params, shardings)
    infer_step = jax.jit(
        lambda p, b, rng: spec.predict_batch_with_aux(p, b, rng),
        in_shardings=(shardings, None, None),
    )
    decodes, aux = infer_step(params, batch_of(), jax.random.PRNGKey(0))
    target = {k: v for k, v in variables["params"].items() if k != "draft"}
    baseline = models.EncoderDecoderModel(module, decode_fn=decoding.temperature_sample)
    want = baseline.predict_batch_with_aux(target, batch_of(), decoder_params=GREEDY)[0]
    wi = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    query = params["encoder"]["layers_1"]["attention"]["query"]["kernel"]
    draft_wo = params["draft"]["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]
    return {
        "num_devices": len(jax.devices()),
        "equal": bool(np.array_equal(decodes, want)),
        "wi_spec": str(wi.sharding.spec),
        "query_spec": str(query.sharding.spec),
        "draft_wo_spec": str(draft_wo.sharding.spec),
        "wi_shard_shapes": sorted({tuple(s.data.shape) for s in wi.addressable_shards}),
        "scores": np.asarray(aux["scores"]).tolist(),
        "iterations": np.asarray(aux["stats"].num_iterations).tolist(),
    }


# ----------------------------------------------------------------------------------------------
# The model contract.


def test_feature_converter():
    import seqio

    module, spec = tiny_pair(draft_in_params=False)
    for model in (models.EncoderDecoderModel(module), spec):
        assert model.FEATURE_CONVERTER_CLS is seqio.EncDecFeatureConverter
        converter = model.FEATURE_CONVERTER_CLS(pack=False)  # as infer.py and eval.py
        assert isinstance(converter, seqio.EncDecFeatureConverter)
    assert models.EncoderDecoderModel.FEATURE_CONVERTER_CLS is seqio.EncDecFeatureConverter


def test_signatures_are_t5x():
    init = inspect.signature(models.EncoderDecoderModel.get_initial_variables).parameters
    assert list(init) == ["self", "rng", "input_shapes", "input_types"]
    assert init["input_types"].default is None
    t5x_predict = [
        "self",
        "params",
        "batch",
        "rng",
        "decoder_params",
        "return_all_decodes",
        "num_decodes",
        "prompt_with_targets",
    ]
    for cls in (models.EncoderDecoderModel, models.SpeculativeEncoderDecoderModel):
        predict = inspect.signature(cls.predict_batch_with_aux).parameters
        assert list(predict)[: len(t5x_predict)] == t5x_predict, cls
        assert all(p.kind is p.KEYWORD_ONLY for p in list(predict.values())[len(t5x_predict) :])
        spec_init = inspect.signature(cls.get_initial_variables).parameters
        assert list(spec_init) == ["self", "rng", "input_shapes", "input_types"], cls
    score = inspect.signature(models.EncoderDecoderModel.score_batch).parameters
    assert list(score) == ["self", "params", "batch", "return_intermediates"]


@pytest.mark.parametrize("size", ["small", "base", "xxl"])
def test_params_axes_are_t5x_names_leaf_for_leaf(size):
    fields = dict(GOLDEN["t5_configs"][size])
    fields["mlp_activations"] = tuple(fields["mlp_activations"])
    model = models.EncoderDecoderModel(network.Transformer(network.T5Config(**fields)))
    shapes = jax.eval_shape(
        lambda rng: model.get_initial_variables(rng, T5X_INPUT_SHAPES, T5X_INPUT_TYPES),
        jax.random.PRNGKey(0),
    )
    names = flatten_dict(flax_partitioning.get_axis_names(shapes["params_axes"]), sep="/")
    params = flatten_dict(shapes["params"], sep="/")
    got = {k: {"axes": list(names[k]), "shape": list(v.shape)} for k, v in params.items()}
    assert got == GOLDEN["configs"][size]


def test_get_initial_variables_returns_params_and_axes_for_both_models():
    module, spec = tiny_pair(draft_in_params=True)
    base_vars = models.EncoderDecoderModel(module).get_initial_variables(
        jax.random.PRNGKey(1), T5X_INPUT_SHAPES, T5X_INPUT_TYPES
    )
    spec_vars = spec.get_initial_variables(jax.random.PRNGKey(1), T5X_INPUT_SHAPES)
    assert set(base_vars) == {"params", "params_axes"}
    assert set(spec_vars) == {"params", "params_axes"}
    assert set(spec_vars["params"]) == set(base_vars["params"]) | {"draft"}
    same = jax.tree_util.tree_map(
        np.array_equal,
        base_vars["params"],
        {k: spec_vars["params"][k] for k in base_vars["params"]},
    )
    assert all(jax.tree_util.tree_leaves(same))  # the target's initialisation is unchanged
    # Every parameter, the draft's included, has a logical axis name per dimension.
    axes = flatten_dict(flax_partitioning.get_axis_names(spec_vars["params_axes"]))
    params = flatten_dict(spec_vars["params"])
    assert set(axes) == set(params)
    assert all(len(axes[k]) == v.ndim for k, v in params.items())


def test_predict_jitted_as_t5x_on_one_device():
    out = run_as_t5x()
    assert out["equal"]
    assert out["scores"] == [0.0] * 4  # greedy: T5X's rescaled log-probs are 0
    assert min(out["iterations"]) >= 1


@pytest.mark.slow
def test_predict_jitted_as_t5x_on_two_devices_shards_kernels_on_model():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    body = "import json, sys; sys.path.insert(0, sys.argv[1]); import test_t5x_contract as t; "
    body += "print('RESULT' + json.dumps(t.run_as_t5x()))"
    proc = subprocess.run(
        [sys.executable, "-c", body, str(TESTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=TESTS.parent,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT") :])
    assert out["num_devices"] == 2 and out["equal"]
    assert out["wi_spec"] == "P(None, 'model')"  # [embed, mlp]
    assert out["query_spec"] == "P(None, 'model')"  # [embed, joined_kv]
    assert out["draft_wo_spec"] == "P('model', None)"  # the draft's [mlp, embed]
    assert out["wi_shard_shapes"] == [[8, 8]]  # mlp 16 split in two


def test_speculative_model_refuses_what_it_cannot_do_in_one_line():
    module, spec = tiny_pair(draft_in_params=False)
    params = init_params(module, 1)
    with pytest.raises(ValueError, match="one decode per example; got num_decodes=4"):
        spec.predict_batch_with_aux(params, batch_of(), num_decodes=4)
    decodes, aux = spec.predict_batch_with_aux(params, batch_of(), return_all_decodes=True)
    assert decodes.shape == (4, 1, 8) and aux["scores"].shape == (4, 1)
    with pytest.raises(ValueError, match="return_intermediates"):
        spec.score_batch(
            params,
            {**batch_of(), "decoder_target_tokens": batch_of()["decoder_input_tokens"]},
            True,
        )


# ----------------------------------------------------------------------------------------------
# gin/t5x/speculative.gin as a T5X user includes it.

USER_MODEL_GIN = """
from __gin__ import dynamic_registration
from t5x import models
from t5x.examples.t5 import network

VOCABULARY = None
MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel.module = @network.Transformer()
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 32
  dtype = 'float32'
  emb_dim = 8
  num_heads = 4
  num_encoder_layers = 2
  num_decoder_layers = 2
  head_dim = 3
  mlp_dim = 16
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
"""

# What a user adds after their model gin (the README's lines, with a tiny draft's shape).
USER_LINES = """
include 'gin/t5x/speculative.gin'
from t5x.examples.t5 import network
draft/network.T5Config:
  num_encoder_layers = 1
  num_decoder_layers = 1
DRAFT_CHECKPOINT = '{draft}'
"""


@pytest.fixture
def t5x_stand_ins(clean_gin, monkeypatch):
    """T5X's imported names from `tests/t5x_stand_ins` (imported once: gin's registry keeps the
    classes it registered, so they must stay the same objects across tests)."""
    monkeypatch.syspath_prepend(str(STAND_INS))
    import t5x.examples.t5.network  # noqa: F401
    import t5x.models  # noqa: F401
    import t5x.utils

    assert pathlib.Path(t5x.utils.__file__).is_relative_to(STAND_INS)  # never a real T5X
    # Gin's registry outlives clear_config, and dynamic registration registers a name once per
    # process: the stand-ins' entries are put back for these tests and taken out after them, so
    # other tests' bindings such as 'models.EncoderDecoderModel' stay unambiguous.
    registry = gin.config._REGISTRY
    for selector, value in _STAND_IN_ENTRIES.items():
        registry[selector] = value
    yield
    for selector in [s for s, _ in registry.items() if s.startswith("t5x.")]:
        _STAND_IN_ENTRIES[selector] = registry.pop(selector)


_STAND_IN_ENTRIES = {}  # gin registry entries of the stand-ins, kept between tests


def exported_pair(tmp_path):
    """T5X checkpoints of a tiny target and draft (as `checkpoints.save_t5x_checkpoint` exports
    the shipped pair) and their parameters."""
    target = init_params(network.Transformer(tiny_config()), 1)
    draft = init_params(
        network.Transformer(tiny_config(num_encoder_layers=1, num_decoder_layers=1)), 2
    )
    target_dir = checkpoints.save_t5x_checkpoint(target, tmp_path / "target", 0)
    draft_dir = checkpoints.save_t5x_checkpoint(draft, tmp_path / "draft", 0)
    return target, draft, target_dir, draft_dir


def parse_user_gin(tmp_path, draft_dir, order="after", bindings=()):
    user = tmp_path / "user_model.gin"
    user.write_text(USER_MODEL_GIN)
    lines = USER_LINES.format(draft=draft_dir)
    text = f"include '{user}'\n{lines}" if order == "after" else f"{lines}\ninclude '{user}'\n"
    run = tmp_path / "user_infer.gin"
    run.write_text("from __gin__ import dynamic_registration\n" + text)
    gin_utils.parse(
        [str(run)],
        [*bindings, "gin_utils.build.obj = (%MODEL, @utils.RestoreCheckpointConfig())"],
        finalize=False,
    )
    return gin_utils.build()


def restore_as_t5x(model, restore_config, target_dir):
    """What T5X's restore does with the state transformation functions: the target checkpoint's
    state, transformed, must match the model's initial variables leaf for leaf."""
    state = {"target": checkpoints.load_t5x_checkpoint(target_dir)["target"], "state": {}}
    expected = jax.eval_shape(
        lambda rng: model.get_initial_variables(rng, T5X_INPUT_SHAPES, T5X_INPUT_TYPES),
        jax.random.PRNGKey(0),
    )["params"]
    for fn in restore_config.state_transformation_fns:
        state = fn(state, {"target": expected, "state": {}})
    assert jax.tree_util.tree_structure(state["target"]) == jax.tree_util.tree_structure(expected)
    return jax.tree_util.tree_map(jnp.asarray, state["target"])


def test_t5x_gin_greedy_stays_greedy_and_restores_the_draft(t5x_stand_ins, tmp_path):
    target, draft, target_dir, draft_dir = exported_pair(tmp_path)
    model, restore_config = parse_user_gin(tmp_path, draft_dir)
    assert isinstance(model, models.SpeculativeEncoderDecoderModel) and model.draft_in_params
    params = restore_as_t5x(model, restore_config, target_dir)
    assert all(
        jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, params["draft"], draft))
    )
    # Only what a user binds: no temperature anywhere, so greedy must come from the shipped gin.
    decodes, aux = jax.jit(model.predict_batch_with_aux)(params, batch_of())
    baseline = models.EncoderDecoderModel(model.module, decode_fn=decoding.temperature_sample)
    want = baseline.predict_batch_with_aux(target, batch_of(), decoder_params=GREEDY)[0]
    np.testing.assert_array_equal(decodes, want)
    assert aux["stats"].num_iterations.shape == (4,)


def test_t5x_gin_needs_gamma_error_fires_under_gin(t5x_stand_ins, tmp_path):
    _, _, target_dir, draft_dir = exported_pair(tmp_path)
    model, restore_config = parse_user_gin(tmp_path, draft_dir, bindings=["GAMMA = None"])
    params = restore_as_t5x(model, restore_config, target_dir)
    with pytest.raises(ValueError, match="speculative decoding needs gamma"):
        model.predict_batch_with_aux(params, batch_of())


def test_t5x_gin_included_before_the_model_gin_is_named(t5x_stand_ins, tmp_path):
    _, _, target_dir, draft_dir = exported_pair(tmp_path)
    model, restore_config = parse_user_gin(tmp_path, draft_dir, order="before")
    assert not isinstance(model, models.SpeculativeEncoderDecoderModel)  # the user's MODEL won
    state = {"target": checkpoints.load_t5x_checkpoint(target_dir)["target"]}
    baseline_state = {"target": {k: None for k in state["target"]}}
    (fn,) = restore_config.state_transformation_fns
    with pytest.raises(ValueError, match="include gin/t5x/speculative.gin after your model gin"):
        fn(state, baseline_state)


def test_network_from_config_names_a_field_it_lacks():
    from dataclasses import make_dataclass

    config = make_dataclass("T5Config", [("vocab_size", int), ("rotary", bool)])(32, True)
    with pytest.raises(ValueError, match=r"\['rotary'\]"):
        t5x_binaries.network_from_config(config)


def test_project_gin_draft_file_may_come_first(clean_gin):
    gin_utils.parse(
        [
            "models/embedded_ende_draft.gin",
            "models/embedded_ende_target.gin",
            "decoding/speculative.gin",
        ],
        ["gin_utils.build.obj = %SPEC_MODEL"],
        finalize=False,
    )
    assert isinstance(gin_utils.build().draft, drafts.T5Draft)
    gin.clear_config(clear_constants=True)
    with pytest.raises(ValueError, match="DRAFT comes from a draft file"):
        gin_utils.parse(
            ["models/embedded_ende_target.gin", "decoding/speculative.gin"], finalize=False
        )


def test_gin_files_ship_inside_the_package():
    root = pathlib.Path(gin_utils.search_path())
    assert (root / "gin" / "t5x" / "speculative.gin").is_file()
    assert root == pathlib.Path(network.__file__).parent
    text = textwrap.dedent((TESTS.parent / "setup.py").read_text())
    assert '"gin/*/*.gin"' in text


def test_t5x_draft_shape_file_is_the_shipped_draft(t5x_stand_ins, tmp_path):
    """gin/t5x/embedded_ende_draft.gin gives the draft the shape of the shipped draft (the project's
    gin/models/embedded_ende_draft.gin), so the shipped draft's T5X export restores into it."""
    user = tmp_path / "user_model.gin"
    user.write_text(USER_MODEL_GIN.replace("vocab_size = 32", "vocab_size = 8192"))
    run = tmp_path / "user_infer.gin"
    run.write_text(
        f"include '{user}'\ninclude 'gin/t5x/speculative.gin'\n"
        "include 'gin/t5x/embedded_ende_draft.gin'\nDRAFT_CHECKPOINT = '/unused'\n"
    )
    gin_utils.parse([str(run)], ["gin_utils.build.obj = %MODEL"], finalize=False)
    t5x_shape = gin_utils.build().draft.module.config
    gin.clear_config(clear_constants=True)
    gin_utils.parse(
        ["models/embedded_ende_draft.gin"], ["gin_utils.build.obj = %DRAFT_MODULE"], finalize=False
    )
    assert t5x_shape == gin_utils.build().config
