"""The draft's output shortlist (`drafts.shortlist_params`, FR-Spec's frequency-ranked draft
vocabulary): logits, packing, errors, and exactness of speculative decoding with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, perturbed
from test_speculative import chi_square_pvalue, exact_sequence_probs, random_tables, run_toy

from specdec_t5x import cpu_kernel, drafts, models, steps

SHORTLIST = np.array([1, 2, 3, 5, 8, 13, 21, 30], np.int32)  # EOS = 1 included


def _logits(module, params, enc, tokens):
    cache = steps.prepare_cache(module, params, enc, 8)
    positions = jnp.zeros((enc.shape[0],), jnp.int32)
    return np.asarray(steps.make_block_step(module, params, enc)(tokens, positions, cache)[0])


def test_frequent_tokens_ranks_by_probability_and_keeps_eos():
    log_probs = np.log(np.array([0.05, 0.01, 0.3, 0.3, 0.2, 0.14]))
    assert drafts.frequent_tokens(log_probs, 3, always=()).tolist() == [2, 3, 4]  # tie: smaller id
    assert drafts.frequent_tokens(log_probs, 3).tolist() == [1, 2, 3]  # EOS replaces the 3rd
    assert drafts.frequent_tokens(log_probs, 6).tolist() == [0, 1, 2, 3, 4, 5]
    for bad in (0, 7):
        with pytest.raises(ValueError, match="size must be in"):
            drafts.frequent_tokens(log_probs, bad)
    with pytest.raises(ValueError, match="always ids"):
        drafts.frequent_tokens(log_probs, 2, always=(9,))


def test_shipped_ngram_shortlist():
    ids = drafts.ngram_shortlist(2048, "ngram_ende")
    assert ids.shape == (2048,) and ids.dtype == np.int32 and 1 in ids
    assert np.all(np.diff(ids) > 0)
    assert drafts.ngram_shortlist(None) is None


@pytest.mark.parametrize("packing", ["raw", "float32", "bfloat16"])
def test_shortlist_logits_are_the_columns_and_minus_inf_elsewhere(tiny_target, packing):
    module, params = tiny_target
    base = params if packing == "raw" else steps.pack_params(module, params, packing)
    short = drafts.shortlist_params(module, base, SHORTLIST)
    dense = short["decoder"]["logits_dense"]
    if packing == "raw" or not cpu_kernel.available():
        assert dense[cpu_kernel.SHORTLIST_KERNEL_NAME].shape == (8, SHORTLIST.size)
    else:  # packed again with the panels' dtype: 8 columns -> one panel of 32
        assert dense[cpu_kernel.PACKED_NAME].shape == (1, 8, 32)
        assert dense[cpu_kernel.PACKED_NAME].dtype == jnp.dtype(packing)
    assert dense[cpu_kernel.SHORTLIST_INDEX_NAME].shape == (32,)
    assert "logits_dense" in params["decoder"] and "kernel" in params["decoder"]["logits_dense"]

    enc = encoder_inputs(2, 5, [5, 3])
    tokens = jnp.asarray([[0, 7, 9], [0, 30, 2]], jnp.int32)
    full, got = _logits(module, base, enc, tokens), _logits(module, short, enc, tokens)
    np.testing.assert_allclose(got[..., SHORTLIST], full[..., SHORTLIST], rtol=1e-5, atol=1e-6)
    outside = np.setdiff1d(np.arange(32), SHORTLIST)
    assert np.all(np.isneginf(got[..., outside]))


def test_shortlist_of_a_shortlist_and_errors(tiny_target):
    module, params = tiny_target
    short = drafts.shortlist_params(module, params, SHORTLIST)
    assert drafts.shortlist_params(module, short, None) is short
    narrower = drafts.shortlist_params(module, short, [1, 5, 30])
    direct = drafts.shortlist_params(module, params, [1, 5, 30])
    enc = encoder_inputs(1, 4, [4])
    tokens = jnp.asarray([[0, 5]], jnp.int32)
    np.testing.assert_array_equal(
        _logits(module, narrower, enc, tokens), _logits(module, direct, enc, tokens)
    )
    with pytest.raises(ValueError, match="inside the tree's existing shortlist"):
        drafts.shortlist_params(module, short, [4])
    for bad in ([], [1, 1], [32], [-1]):
        with pytest.raises(ValueError, match="distinct ids"):
            drafts.shortlist_params(module, params, bad)


def test_hf_export_refuses_a_shortlisted_tree(tiny_target, tmp_path):
    from specdec_t5x import hf

    module, params = tiny_target
    short = drafts.shortlist_params(module, params, SHORTLIST)
    with pytest.raises(ValueError, match="output shortlist"):
        hf.export_hf(short, module.config, tmp_path / "hf")


@pytest.mark.parametrize("gamma, kernel", [(1, "1"), (4, "1"), (3, "0")])
def test_greedy_speculative_with_a_shortlisted_draft_equals_greedy(
    tiny_target, gamma, kernel, monkeypatch
):
    monkeypatch.setenv(cpu_kernel.ENV_VAR, kernel)
    module, params = tiny_target
    enc = encoder_inputs(4, 9, [9, 5, 7, 3])
    batch = {"encoder_input_tokens": enc, "decoder_input_tokens": jnp.zeros((4, 12), jnp.int32)}
    base = models.EncoderDecoderModel(module)
    expected = base.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})[0]
    draft_params = drafts.shortlist_params(
        module, steps.pack_params(module, perturbed(params, 0.05, 1)), SHORTLIST
    )
    spec = models.SpeculativeEncoderDecoderModel(module, drafts.T5Draft(module, draft_params))
    got, aux = jax.jit(
        lambda p, b: spec.predict_batch_with_aux(
            p, b, decoder_params={"gamma": gamma, "temperature": 0.0}
        )
    )(params, batch)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert int(aux["stats"].num_iterations.sum()) > 0


def test_sampling_with_a_shortlisted_draft_reaches_tokens_outside_the_shortlist(tiny_target):
    """At T = 1 the target's residual supplies the tokens the draft cannot propose."""
    module, params = tiny_target
    enc = encoder_inputs(32, 9, [9] * 32)
    batch = {"encoder_input_tokens": enc, "decoder_input_tokens": jnp.zeros((32, 8), jnp.int32)}
    draft_params = drafts.shortlist_params(module, perturbed(params, 0.05, 1), SHORTLIST)
    spec = models.SpeculativeEncoderDecoderModel(module, drafts.T5Draft(module, draft_params))
    out, aux = spec.predict_batch_with_aux(
        params, batch, decoder_params={"gamma": 3, "temperature": 1.0}, rng=jax.random.PRNGKey(3)
    )
    tokens = np.asarray(out)
    assert np.isin(tokens[tokens != 0], SHORTLIST, invert=True).any()
    assert int(aux["stats"].num_accepted.sum()) > 0


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sampling_distribution_with_a_shortlisted_q_is_the_targets(verification):
    """Chi-square over every output sequence of a toy target, with the draft's q restricted to a
    shortlist exactly as `shortlist_params` restricts it (logit -inf outside)."""
    p, q = random_tables(seed=11, vocab=6)
    q[..., [0, 3, 4]] = -np.inf  # shortlist {1 (EOS), 2, 5}
    decodes, st = run_toy(p, q, 20000, 3, seed=5, temperature=1.0, verification=verification)
    assert int(st.num_accepted.sum()) > 0
    assert np.isin(np.asarray(decodes), [3, 4]).any()  # the target still emits them
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 1.0, 0, 0.0)) > 1e-3
