"""Acceptance rules on hand-made 3-token blocks, and block verification's exactness by enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import verification

V = 4  # vocabulary of the hand-made blocks


def one_hot(tokens):
    return jax.nn.one_hot(jnp.asarray(tokens), V, dtype=jnp.float32)


def test_greedy_accept_keeps_the_matching_prefix():
    drafts = jnp.array([[2, 3, 1], [2, 3, 1], [0, 0, 0]], jnp.int32)
    target_argmax = jnp.array([[2, 3, 1, 3], [2, 0, 1, 3], [1, 0, 0, 2]], jnp.int32)
    verdict = verification.greedy_accept(drafts, one_hot(target_argmax) * 5.0)
    np.testing.assert_array_equal(verdict.n_accepted, [3, 1, 0])
    np.testing.assert_array_equal(verdict.extra, [3, 0, 1])  # bonus, then corrections
    np.testing.assert_array_equal(verdict.beta, [[1, 1, 1], [1, 0, 1], [0, 1, 1]])
    # num_drafts cuts the block: the extra token is the target's argmax at the cut.
    verdict = verification.greedy_accept(drafts, one_hot(target_argmax) * 5.0, jnp.array([1, 3, 0]))
    np.testing.assert_array_equal(verdict.n_accepted, [1, 1, 0])
    np.testing.assert_array_equal(verdict.extra, [3, 0, 1])


@pytest.mark.parametrize("accept_fn", [verification.token_accept, verification.block_accept])
def test_sampled_accept_with_one_hot_p_and_q_is_greedy(accept_fn):
    drafts = jnp.array([[2, 3, 1], [2, 3, 1], [0, 0, 0]], jnp.int32)
    target_argmax = jnp.array([[2, 3, 1, 3], [2, 0, 1, 3], [1, 0, 0, 2]], jnp.int32)
    verdict = accept_fn(jax.random.PRNGKey(0), drafts, one_hot(drafts), one_hot(target_argmax))
    np.testing.assert_array_equal(verdict.n_accepted, [3, 1, 0])
    np.testing.assert_array_equal(verdict.extra, [3, 0, 1])


@pytest.mark.parametrize("accept_fn", [verification.token_accept, verification.block_accept])
def test_sampled_accept_q_equal_p_accepts_all_and_samples_the_bonus_from_p(accept_fn):
    probs = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (1, 4, V)))
    n = 4000
    p = jnp.broadcast_to(probs, (n, 4, V))
    drafts = jnp.broadcast_to(jnp.array([[1, 2, 3]], jnp.int32), (n, 3))
    verdict = accept_fn(jax.random.PRNGKey(2), drafts, p[:, :3], p)
    np.testing.assert_array_equal(verdict.n_accepted, 3)
    np.testing.assert_allclose(verdict.beta, 1.0, rtol=1e-6)
    freq = np.bincount(np.asarray(verdict.extra), minlength=V) / n
    np.testing.assert_allclose(freq, probs[0, 3], atol=4 * np.sqrt(0.25 / n))


def test_token_accept_rejects_what_p_excludes_and_corrects_from_the_residual():
    # d_1 = 1 has p/q = 1.2 (kept surely); p_2 gives d_2 = 2 no mass (rejected surely) and the
    # residual max(0, p_2 - q_2) is all on token 3.
    p = jnp.array([[[0.0, 0.6, 0.4, 0.0], [0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4]])
    q = jnp.array([[[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0], [0.25] * 4]])
    verdict = verification.token_accept(jax.random.PRNGKey(0), jnp.array([[1, 2, 0]]), q, p)
    assert int(verdict.n_accepted[0]) == 1 and int(verdict.extra[0]) == 3
    np.testing.assert_allclose(verdict.beta, [[0.9, 0.0, 1.0]], rtol=1e-6)


def test_block_accept_uses_the_whole_block():
    # Paper §1 example (two context-free models, vocab {a, b}): target (1/3, 2/3), draft (2/3, 1/3).
    # γ = 2: token verification keeps 10/9 drafts per block on average, block verification 11/9.
    p_row, q_row = jnp.array([1 / 3, 2 / 3]), jnp.array([2 / 3, 1 / 3])
    n = 60000
    drafts = jax.random.categorical(jax.random.PRNGKey(3), jnp.log(q_row), shape=(n, 2))
    p = jnp.broadcast_to(p_row, (n, 3, 2))
    q = jnp.broadcast_to(q_row, (n, 2, 2))
    for fn, want in ((verification.token_accept, 10 / 9), (verification.block_accept, 11 / 9)):
        mean = float(jnp.mean(fn(jax.random.PRNGKey(4), drafts.astype(jnp.int32), q, p).n_accepted))
        assert abs(mean - want) < 0.02, (fn.__name__, mean, want)
    h, _ = verification.block_stop_probs(jnp.array([[0, 0], [1, 0]]), q[:2], p[:2])
    np.testing.assert_allclose(h, [[1, 0, 0.25], [1, 1, 0.5]], atol=1e-6)


def _cond(table, prefix):
    """Distribution float64 [V] after `prefix` in a context-dependent toy model."""
    return table[len(prefix), prefix[-1] if prefix else 0]


@pytest.mark.parametrize("gamma, cut", [(2, None), (3, None), (3, 2), (3, "prefix")])
def test_block_verification_output_is_exactly_the_target_by_enumeration(gamma, cut):
    """Sum over every draft block, stop point τ and extra token: the emitted prefix continued by
    the target must have the target's exact distribution over length-(γ + 1) sequences.

    cut: None (all γ drafts verified), a fixed number of drafts, or "prefix": the block ends
    after the first draft equal to 2 (a stopping rule that looks only at the drafted prefix, as
    early-exit drafting does)."""
    vocab = 3
    rng = np.random.RandomState(gamma)
    p_table = rng.dirichlet(np.ones(vocab) * 0.7, size=(gamma + 1, vocab))  # [pos, prev, V]
    q_table = rng.dirichlet(np.ones(vocab) * 0.7, size=(gamma + 1, vocab))
    blocks = list(itertools.product(range(vocab), repeat=gamma))
    p = np.array([[_cond(p_table, b[:i]) for i in range(gamma + 1)] for b in blocks])
    q = np.array([[_cond(q_table, b[:i]) for i in range(gamma)] for b in blocks])
    if cut == "prefix":
        count = jnp.array([b.index(2) + 1 if 2 in b else gamma for b in blocks], jnp.int32)
    else:
        count = None if cut is None else jnp.full((len(blocks),), cut, jnp.int32)
    h, residual = verification.block_stop_probs(
        jnp.array(blocks, jnp.int32),
        jnp.asarray(q, jnp.float32),
        jnp.asarray(p, jnp.float32),
        count,
    )
    h, residual = np.asarray(h, np.float64), np.asarray(residual, np.float64)
    got = {}
    for b, block in enumerate(blocks):
        q_block = np.prod([q[b, i, block[i]] for i in range(gamma)])
        for tau in range(gamma + 1):
            p_tau = h[b, tau] * np.prod(1 - h[b, tau + 1 :])
            for y in range(vocab):
                prefix = tuple(block[:tau]) + (y,)
                mass = q_block * p_tau * residual[b, tau, y]
                for rest in itertools.product(range(vocab), repeat=gamma - tau):
                    seq = prefix + rest
                    cont = np.prod(
                        [_cond(p_table, seq[:i])[seq[i]] for i in range(tau + 1, gamma + 1)]
                    )
                    got[seq] = got.get(seq, 0.0) + mass * cont
    for seq, value in got.items():
        want = np.prod([_cond(p_table, seq[:i])[seq[i]] for i in range(gamma + 1)])
        np.testing.assert_allclose(value, want, atol=1e-5, err_msg=str(seq))
    if isinstance(cut, int):
        assert np.all(h[:, cut + 1 :] == 0)
