"""The typed settings (`speculation.Speculation`, `split_decoder_params`) and the model's typed
decode path (`SpeculativeEncoderDecoderModel.decode`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import models, speculative_model
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation, split_decoder_params


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma=0), "gamma must be an int >= 1"),
        (dict(gamma="auto"), "chosen outside jit"),
        (dict(gamma=2, verification="blocks"), "verification='blocks'"),
        (dict(gamma=2, draft_confidence_threshold=1.0), "draft_confidence_threshold=1.0"),
        (dict(tree=(2, 2), gamma=3), "gamma must be None or the tree's depth 2"),
        (dict(tree=(2,), verification="block"), "no early exit"),
        (dict(tree=(2, 2), tree_rule="spec"), "tree_rule='spec'"),
        (dict(tree=(2, 0)), "tree must be a non-empty tuple"),
    ],
)
def test_speculation_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Speculation(**kwargs)


def test_speculation_passes_on_only_what_is_set():
    assert Speculation().decoder_params() == {}
    assert Speculation(gamma=3, verification="block").decoder_params() == {
        "gamma": 3,
        "verification": "block",
    }
    tree = Speculation(tree=[2, 1])
    assert (
        tree.depth == 2 and tree.shape.num_nodes == 5 and tree.decoder_params() == {"tree": [2, 1]}
    )


def test_split_decoder_params_keeps_the_keywords_the_dict_had():
    full = {"gamma": 3, "temperature": 0.5, "topk": 4, "topp": 0.0, "other": 1, "tree": None}
    sampling, speculation, rest = split_decoder_params(full)
    assert sampling == SamplingSettings(0.5, 4, 0.0)
    assert speculation == Speculation(gamma=3)
    assert rest == {"other": 1, "tree": None}  # explicit None overrides a binding, as given
    # An incomplete sampling group stays loose: the decode fn's own values fill the rest.
    sampling, speculation, rest = split_decoder_params({"temperature": 0.0})
    assert sampling is None and speculation is None and rest == {"temperature": 0.0}
    assert split_decoder_params({}) == (None, None, {})
    with pytest.raises(ValueError, match="topk"):
        split_decoder_params({"temperature": 1.0, "topk": -1, "topp": 0.0})


def test_decode_equals_predict_batch_with_aux():
    from conftest import encoder_inputs, tiny_spec_pair

    spec, params = tiny_spec_pair()
    assert models.SpeculativeEncoderDecoderModel is speculative_model.SpeculativeEncoderDecoderModel
    batch = {
        "encoder_input_tokens": encoder_inputs(2, 6, [6, 3], vocab=50),
        "decoder_input_tokens": jnp.zeros((2, 6), jnp.int32),
    }
    rng = jax.random.PRNGKey(1)
    settings = {"gamma": 2, "temperature": 1.0, "topk": 0, "topp": 0.9}
    want, want_aux = spec.predict_batch_with_aux(params, batch, rng, decoder_params=settings)
    got, aux = spec.decode(
        params,
        batch,
        rng,
        sampling=SamplingSettings(temperature=1.0, topp=0.9),
        speculation=Speculation(gamma=2),
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(aux["scores"], want_aux["scores"])
    np.testing.assert_array_equal(aux["stats"].num_accepted, want_aux["stats"].num_accepted)
