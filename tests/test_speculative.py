"""Speculative sampling: exact greedy tokens, exact sampling distribution, stats, edge cases."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_inputs, init_params, perturbed, tiny_config
from scipy import stats as scipy_stats

from specdec_t5x import drafts, models, network, sampling, speculative
from specdec_t5x import steps as model_steps

EOS = 1

# ---------------------------------------------------------------------------------------------
# Toy closures: a second-order Markov "model" whose logits are a table lookup on
# (position, previous input token, current input token). Its cache is the token history by
# position, written like a KV cache, so rollback bugs would show up here too.


def toy_step(table):
    """Block step over table float32 [L, V, V, V]: logits of output t given inputs t-1 and t."""
    table = jnp.asarray(table, jnp.float32)
    max_len = table.shape[0]

    def step(tokens, positions, cache):
        batch, k = tokens.shape
        pos = positions[:, None] + jnp.arange(k)  # [b, k]
        rows = jnp.arange(batch)[:, None]
        history = cache["history"].at[rows, pos].set(tokens, mode="drop")
        prev = jnp.where(pos >= 1, history[rows, jnp.clip(pos - 1, 0, None)], 0)
        logits = table[jnp.clip(pos, 0, max_len - 1), prev, tokens]
        return logits, {"history": history}

    return step


def toy_cache(batch, max_len):
    return {"history": jnp.zeros((batch, max_len), jnp.int32)}


def exact_sequence_probs(table, max_len, temperature, topk, topp):
    """{sequence tuple: probability} of the toy target's adjusted distribution, enumerated."""
    probs = {}
    vocab = table.shape[-1]
    adjusted = np.asarray(
        sampling.adjusted_probs(jnp.asarray(table), temperature, topk, topp), np.float64
    )
    for seq in itertools.product(range(vocab), repeat=max_len):
        p, inputs, out = 1.0, [0], []
        for t, y in enumerate(seq):
            prev = inputs[-2] if len(inputs) >= 2 else 0
            p *= adjusted[t, prev, inputs[-1], y]
            out.append(y)
            inputs.append(y)
            if y == EOS:
                break
        key = tuple(out) + (0,) * (max_len - len(out))
        if len(out) < max_len and seq[len(out) :] != (0,) * (max_len - len(out)):
            continue  # count each truncated sequence once
        probs[key] = probs.get(key, 0.0) + p
    return probs


def run_toy(p_table, q_table, batch, gamma, seed=0, **kwargs):
    max_len = p_table.shape[0]
    fn = jax.jit(
        lambda rng: speculative.speculative_sample(
            jnp.zeros((batch, max_len), jnp.int32),
            toy_cache(batch, max_len),
            toy_step(p_table),
            toy_cache(batch, max_len),
            toy_step(q_table),
            EOS,
            gamma=gamma,
            decode_rng=rng,
            **kwargs,
        )
    )
    return fn(jax.random.PRNGKey(seed))


def chi_square_pvalue(decodes, expected_probs):
    n = decodes.shape[0]
    observed = {}
    for row in map(tuple, np.asarray(decodes)):
        observed[row] = observed.get(row, 0) + 1
    unexpected = {k: v for k, v in observed.items() if expected_probs.get(k, 0.0) == 0.0}
    assert not unexpected, f"sequences with target probability 0: {unexpected}"
    keys = sorted(expected_probs, key=expected_probs.get, reverse=True)
    exp = np.array([expected_probs[k] * n for k in keys])
    obs = np.array([observed.get(k, 0) for k in keys], np.float64)
    big = exp >= 5  # pool small bins
    exp = np.append(exp[big], exp[~big].sum())
    obs = np.append(obs[big], obs[~big].sum())
    if exp[-1] < 5:
        exp[-2] += exp[-1]
        obs[-2] += obs[-1]
        exp, obs = exp[:-1], obs[:-1]
    exp *= obs.sum() / exp.sum()
    return scipy_stats.chisquare(obs, exp).pvalue


def random_tables(seed, vocab=6, max_len=3):
    rng = np.random.RandomState(seed)
    p = rng.randn(max_len, vocab, vocab, vocab) * 1.5
    q = p + rng.randn(*p.shape)  # correlated draft: 0 < alpha < 1
    return p.astype(np.float32), q.astype(np.float32)


SETTINGS = [(0.5, 0, 0.0), (1.0, 0, 0.0), (2.0, 0, 0.0), (1.0, 3, 0.0), (1.0, 0, 0.8)]


# Token verification: every setting at every γ; block verification: every setting at γ = 3 and
# the other γ at T = 1 (γ = 8 below), which keeps the number of compiles down.
DISTRIBUTION_CASES = [("token", g, *setting) for g in (1, 3, 4) for setting in SETTINGS] + [
    ("block", g, *setting)
    for g, setting in [(3, s) for s in SETTINGS] + [(1, SETTINGS[1]), (4, SETTINGS[1])]
]


@pytest.mark.parametrize("verification, gamma, temperature, topk, topp", DISTRIBUTION_CASES)
def test_sampling_distribution_is_the_targets(verification, gamma, temperature, topk, topp):
    p, q = random_tables(seed=gamma)
    n = 20000
    decodes, st = run_toy(
        p,
        q,
        n,
        gamma,
        seed=11,
        temperature=temperature,
        topk=topk,
        topp=topp,
        verification=verification,
    )
    expected = exact_sequence_probs(p, 3, temperature, topk, topp)
    assert chi_square_pvalue(decodes, expected) > 1e-3
    alpha = float(st.num_accepted.sum() / st.num_draft_tokens.sum())
    assert 0.05 < alpha < 0.95  # the test exercises both acceptance and rejection
    assert np.any(np.asarray(decodes)[:, :2] == EOS)  # rows end mid-block at EOS too


@pytest.mark.parametrize("verification", ["token", "block"])
def test_long_blocks_gamma_8_are_exact(verification):
    """γ = 8 on 6-token sequences: whole blocks fit, rows end at EOS at different iterations."""
    p, q = random_tables(seed=12, vocab=3, max_len=6)
    decodes, st = run_toy(p, q, 20000, 8, seed=13, temperature=1.0, verification=verification)
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 6, 1.0, 0, 0.0)) > 1e-3
    assert int(np.asarray(st.accept_histogram)[:, 4:].sum()) > 0  # long accepted runs happen


@pytest.mark.parametrize("verification, gamma", [("token", 1), ("token", 4), ("block", 4)])
def test_draft_equal_to_target_accepts_everything(verification, gamma):
    p, _ = random_tables(seed=5, max_len=4)
    decodes, st = run_toy(p, p, 20000, gamma, seed=3, temperature=1.0, verification=verification)
    np.testing.assert_allclose(st.num_accepted, st.num_draft_tokens)  # alpha = 1 exactly
    np.testing.assert_allclose(st.beta_sum, st.num_beta, rtol=1e-5)
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 4, 1.0, 0, 0.0)) > 1e-3


@pytest.mark.parametrize("verification", ["token", "block"])
def test_disjoint_support_draft_is_still_exact(verification):
    p, _ = random_tables(seed=6, vocab=8)
    q = -p  # q's top-3 are p's bottom-3: disjoint supports under top-k = 3
    decodes, st = run_toy(
        p, q, 20000, 3, seed=4, temperature=1.0, topk=3, verification=verification
    )
    assert int(st.num_accepted.sum()) == 0 and float(st.beta_sum.sum()) == 0.0
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 1.0, 3, 0.0)) > 1e-3


def test_block_verification_generates_more_tokens_per_iteration_with_the_same_drafts():
    """The paper's §1 example in the loop (context-free p = (1/3, 2/3), q = (2/3, 1/3) on two
    non-EOS tokens, γ = 2): Eq. 1 gives 1 + 10/9 tokens per full iteration with token verification,
    block verification 1 + 11/9."""
    vocab, max_len = 4, 64  # long rows: the cut last iteration barely biases the mean
    p_row = np.log([1e-30, 1e-30, 1 / 3, 2 / 3]).astype(np.float32)
    q_row = np.log([1e-30, 1e-30, 2 / 3, 1 / 3]).astype(np.float32)
    p = np.broadcast_to(p_row, (max_len, vocab, vocab, vocab))
    q = np.broadcast_to(q_row, (max_len, vocab, vocab, vocab))
    per_iteration = {}
    for verification in ("token", "block"):
        _, st = run_toy(p, q, 1000, 2, seed=5, temperature=1.0, verification=verification)
        hist = np.asarray(st.accept_histogram).sum(0)
        per_iteration[verification] = float(hist @ np.arange(3) / hist.sum())
    assert abs(per_iteration["token"] - 10 / 9) < 0.05, per_iteration
    assert abs(per_iteration["block"] - 11 / 9) < 0.05, per_iteration


@pytest.mark.parametrize("temperature, verification", [(1.0, "token"), (0.5, "block")])
def test_early_exit_drafting_is_exact_and_shortens_blocks(temperature, verification):
    p, q = random_tables(seed=14, vocab=4, max_len=5)
    decodes, st = run_toy(
        p,
        q,
        20000,
        4,
        seed=15,
        temperature=temperature,
        verification=verification,
        draft_confidence_threshold=0.6,
    )
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 5, temperature, 0, 0.0)) > 1e-3
    proposed, iterations = int(st.num_proposed.sum()), int(st.num_iterations.sum())
    assert iterations < proposed < 4 * iterations  # some blocks stopped early, some did not


def test_early_exit_in_argmax_mode_equals_greedy():
    p, q = random_tables(seed=16, vocab=6, max_len=6)
    want, _ = run_toy(p, q, 3, 4, temperature=0.0)
    got, st = run_toy(p, q, 3, 4, temperature=0.0, draft_confidence_threshold=0.5)
    np.testing.assert_array_equal(got, want)
    assert int(st.num_proposed.sum()) < 4 * int(st.num_iterations.sum())


def test_counted_alpha_agrees_with_beta_estimate_and_known_alpha():
    vocab = 6
    rng = np.random.RandomState(0)
    p_row, q_row = rng.randn(vocab) * 1.5, rng.randn(vocab) * 1.5
    p_row[EOS] = q_row[EOS] = -30.0  # keep sequences running to the length limit
    p_table = np.broadcast_to(p_row, (8, vocab, vocab, vocab)).astype(np.float32)
    q_table = np.broadcast_to(q_row, (8, vocab, vocab, vocab)).astype(np.float32)
    known = float(
        np.minimum(jax.nn.softmax(jnp.asarray(p_row)), jax.nn.softmax(jnp.asarray(q_row))).sum()
    )
    _, st = run_toy(p_table, q_table, 4000, 3, seed=9, temperature=1.0)
    counted = float(st.num_accepted.sum() / st.num_draft_tokens.sum())
    beta_alpha = float(st.beta_sum.sum() / st.num_beta.sum())
    stderr = np.sqrt(known * (1 - known) / float(st.num_draft_tokens.sum()))
    assert abs(counted - known) < 4 * stderr
    np.testing.assert_allclose(beta_alpha, known, rtol=1e-4)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_argmax_mode_on_toy_equals_greedy_path(verification):
    p, q = random_tables(seed=8, vocab=6, max_len=3)
    decodes, _ = run_toy(p, q, 1, 2, temperature=0.0, verification=verification)
    expected = exact_sequence_probs(p, 3, 0.0, 0, 0.0)
    (best,) = [k for k, v in expected.items() if v == 1.0]
    np.testing.assert_array_equal(decodes[0], best)


def test_eos_accepted_mid_block_ends_the_row():
    vocab, max_len = 6, 8
    path = [3, 4, EOS, 5, 5, 5, 5, 5]
    table = np.zeros((max_len, vocab, vocab, vocab), np.float32)
    for t, y in enumerate(path):
        table[t, ..., y] = 5.0
    decodes, st = run_toy(table, table, 2, 5, temperature=0.0)
    np.testing.assert_array_equal(decodes, [[3, 4, EOS, 0, 0, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(st.num_iterations, [1, 1])
    np.testing.assert_array_equal(st.num_generated, [3, 3])
    np.testing.assert_array_equal(st.num_accepted, [3, 3])
    np.testing.assert_array_equal(st.num_draft_tokens, [3, 3])
    np.testing.assert_array_equal(st.accept_histogram[:, 3], [1, 1])
    assert int(st.accept_histogram.sum()) == 2


def test_length_limit_is_never_exceeded():
    vocab, max_len = 6, 7
    table = np.zeros((max_len, vocab, vocab, vocab), np.float32)
    table[..., 4] = 5.0  # never EOS
    for steps, gamma in [(None, 3), (5, 4), (2, 8), (0, 2)]:
        decodes, st = run_toy(table, table, 2, gamma, temperature=0.0, max_decode_steps=steps)
        n = max_len if steps is None else steps
        np.testing.assert_array_equal(decodes, [[4] * n + [0] * (max_len - n)] * 2)
        np.testing.assert_array_equal(st.num_generated, [n, n])


def test_no_nan_with_underflowing_draft_probabilities():
    p, _ = random_tables(seed=2)
    q = p.copy()
    q[..., 2] = -1e9  # q(2) underflows to exactly 0 where p(2) > 0
    decodes, st = run_toy(p, q, 5000, 3, seed=1, temperature=1.0)
    assert not np.any(np.isnan(np.asarray(st.beta_sum)))
    assert chi_square_pvalue(decodes, exact_sequence_probs(p, 3, 1.0, 0, 0.0)) > 1e-3


# ---------------------------------------------------------------------------------------------
# Tiny T5 target with T5 and n-gram drafts: argmax mode gives the target's greedy tokens.

BATCH, ENC_LEN, MAX_LEN = 4, 9, 16


@pytest.fixture(scope="module")
def t5_setup(tiny_target):
    module, params = tiny_target
    enc = encoder_inputs(BATCH, ENC_LEN, [9, 5, 7, 3])
    batch = {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": jnp.zeros((BATCH, MAX_LEN), jnp.int32),
    }
    baseline = models.EncoderDecoderModel(module)
    greedy = jax.jit(
        lambda p, b: baseline.predict_batch_with_aux(
            p, b, decoder_params={"temperature": 0.0, "topk": 0}
        )[0]
    )
    return module, params, batch, greedy


def spec_decoder(module, draft, **decoder_params):
    """A jitted speculative decode (params, draft_params, batch) -> (decodes, stats). A
    `T5Draft` reads its weights only from `draft_params`, so one decoder serves every T5Draft of
    the same draft module (one compilation per parameter-tree structure)."""
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    fn = jax.jit(
        lambda p, dp, b: model.predict_batch_with_aux(
            p, b, decoder_params=decoder_params, draft_params=dp
        )
    )

    def decode(params, draft_params, batch):
        decodes, aux = fn(params, draft_params, batch)
        return decodes, aux["stats"]

    return decode


def spec_decode(module, params, draft, batch, **decoder_params):
    return spec_decoder(module, draft, **decoder_params)(params, draft.params, batch)


def t5_drafts(module, params):
    small = network.Transformer(tiny_config(num_decoder_layers=1, num_encoder_layers=1))
    return {
        "identical": drafts.T5Draft(module, params),
        "perturbed_0.05": drafts.T5Draft(module, perturbed(params, 0.05, 1)),
        "perturbed_0.3": drafts.T5Draft(module, perturbed(params, 0.3, 2)),
        "independent_small": drafts.T5Draft(small, init_params(small, 7)),
        # The embedded drafts' default: weights packed in bfloat16 for the CPU kernel (another q).
        "bfloat16_cpu_weights": drafts.T5Draft(
            module, model_steps.pack_params(module, perturbed(params, 0.05, 1), "bfloat16")
        ),
    }


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_argmax_identity_with_t5_drafts(t5_setup, gamma):
    module, params, batch, greedy = t5_setup
    expected = greedy(params, batch)
    partial = False
    decoders = {}  # one compiled decoder per draft module (the suite's time is compilation)
    for name, draft in t5_drafts(module, params).items():
        if draft.module not in decoders:
            decoders[draft.module] = spec_decoder(module, draft, gamma=gamma, temperature=0.0)
        decodes, st = decoders[draft.module](params, draft.params, batch)
        np.testing.assert_array_equal(decodes, expected, err_msg=f"draft {name}")
        alpha = st.num_accepted.sum() / st.num_draft_tokens.sum()
        if name == "identical":
            assert alpha == 1.0
        partial |= 0.0 < alpha < 1.0
        assert np.all(np.asarray(st.num_iterations) <= np.asarray(st.num_generated))
    assert partial  # at least one pair exercised rejection and rollback


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_argmax_identity_with_ngram_and_source_copy_drafts(t5_setup, gamma):
    module, params, batch, greedy = t5_setup
    expected = greedy(params, batch)
    unigram, bigram = drafts.fit_ngram_drafts(
        [list(r) + [EOS] for r in np.asarray(expected)], vocab_size=32
    )
    for draft in (unigram, bigram, drafts.SourceCopyDraft(32)):
        decodes, _ = spec_decode(module, params, draft, batch, gamma=gamma, temperature=0.0)
        np.testing.assert_array_equal(decodes, expected, err_msg=type(draft).__name__)


@pytest.mark.parametrize("steps", [None, 5])
def test_prompt_and_max_decode_steps_match_baseline(t5_setup, steps):
    module, params, batch, _ = t5_setup
    prompt = jnp.zeros((BATCH, MAX_LEN), jnp.int32).at[:, 1:4].set(jnp.array([5, 9, 7]))
    prompt = prompt.at[1, 2:].set(0)  # row 1: a one-token prompt
    baseline = models.EncoderDecoderModel(module)
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 3))
    spec = models.SpeculativeEncoderDecoderModel(module, draft)
    kw = {"temperature": 0.0, "topk": 0, "max_decode_steps": steps}
    want = jax.jit(
        lambda p, enc: baseline.decode_fn(
            inputs=prompt,
            **dict(
                zip(
                    ("cache", "tokens_to_logits"),
                    _baseline_state(baseline, p, enc),
                    strict=True,
                )
            ),
            eos_id=EOS,
            **kw,
        )[0][:, -1]
    )(params, batch["encoder_input_tokens"])
    got, _ = jax.jit(
        lambda p, enc: spec.decode_fn(
            prompt,
            *_spec_state(spec, module, p, draft, enc),
            EOS,
            gamma=3,
            temperature=0.0,
            max_decode_steps=steps,
        )
    )(params, batch["encoder_input_tokens"])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0, :3], [5, 9, 7])  # the prompt is kept
    assert int(got[1, 0]) == 5


def _baseline_state(model, params, enc):
    cache, step = model.decoder_state(params, enc, MAX_LEN)
    return cache, models.one_token_logits_fn(step)


def _spec_state(spec, module, params, draft, enc):
    target_cache, target_step = spec.decoder_state(params, enc, MAX_LEN)
    draft_cache, draft_step = draft.prepare(draft.params, enc, MAX_LEN)
    return target_cache, target_step, draft_cache, draft_step


def test_batched_rows_equal_rows_decoded_alone(t5_setup):
    module, params, batch, _ = t5_setup
    draft = drafts.T5Draft(module, perturbed(params, 0.1, 4))
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    fn = jax.jit(
        lambda b: model.predict_batch_with_aux(
            params, b, decoder_params={"gamma": 4, "temperature": 0.0}
        )[0]
    )
    together = fn(batch)
    for b in range(BATCH):
        row = fn({k: v[b : b + 1] for k, v in batch.items()})  # one compile for all rows
        np.testing.assert_array_equal(row[0], together[b])


def test_second_call_with_same_shapes_does_not_recompile(t5_setup):
    module, params, batch, _ = t5_setup
    draft = drafts.T5Draft(module, perturbed(params, 0.1, 5))
    model = models.SpeculativeEncoderDecoderModel(module, draft)
    traces = []

    def decode(p, dp, b, rng):
        traces.append(1)
        return model.predict_batch_with_aux(p, b, rng, {"gamma": 3}, draft_params=dp)

    fn = jax.jit(decode)
    for seed in range(3):
        other = perturbed(params, 0.01 * seed, seed)  # new values, same shapes
        out, _ = fn(other, draft.params, batch, jax.random.PRNGKey(seed))
        out.block_until_ready()
    assert len(traces) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=2, temperature=-1.0), "temperature"),
        (dict(gamma=2, topk=-1), "topk"),
        (dict(gamma=2, topp=1.5), "topp"),
        (dict(gamma=2, topk=2, topp=0.5), "topk"),
        (dict(gamma=2, eos=99), "eos_id=99"),
        (dict(gamma=2, draft_vocab=7), "vocabularies differ"),
        (dict(gamma=2, verification="blocks"), "verification='blocks'"),
        (dict(gamma=2, draft_confidence_threshold=1.0), "draft_confidence_threshold=1.0"),
    ],
)
def test_bad_input_raises(kwargs, match):
    p, _ = random_tables(seed=0, vocab=6)
    q = np.zeros((3, 7, 7, kwargs.pop("draft_vocab")), np.float32) if "draft_vocab" in kwargs else p
    eos = kwargs.pop("eos", EOS)
    with pytest.raises(ValueError, match=match):
        speculative.speculative_sample(
            jnp.zeros((1, 3), jnp.int32),
            toy_cache(1, 3),
            toy_step(p),
            toy_cache(1, 3),
            toy_step(q),
            eos,
            **kwargs,
        )


def test_model_refuses_float_tokens_and_a_missing_gamma():
    """`predict_batch_with_aux` names the bad feature / the missing γ instead of failing inside
    the network (`indices must have an integer type`) or in the sampler's signature."""
    from conftest import tiny_spec_pair

    spec, params = tiny_spec_pair()
    enc = encoder_inputs(1, 6, [4], vocab=20)
    good = {"encoder_input_tokens": enc, "decoder_input_tokens": jnp.zeros((1, 5), jnp.int32)}
    with pytest.raises(
        ValueError, match=r"batch\['encoder_input_tokens'\] must be int32 token ids"
    ):
        spec.predict_batch_with_aux(
            params, {**good, "encoder_input_tokens": enc.astype(jnp.float32)}
        )
    with pytest.raises(ValueError, match=r"batch\['decoder_input_tokens'\] .* got int32 \(5,\)"):
        spec.predict_batch_with_aux(
            params, {**good, "decoder_input_tokens": jnp.zeros(5, jnp.int32)}
        )
    with pytest.raises(ValueError, match="speculative decoding needs gamma"):
        spec.predict_batch_with_aux(params, good, decoder_params={"temperature": 0.0})
    decodes, _ = spec.predict_batch_with_aux(
        params, good, decoder_params={"gamma": 2, "temperature": 0.0}
    )
    assert decodes.shape == (1, 5) and decodes.dtype == jnp.int32
