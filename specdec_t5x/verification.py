"""Verification of a draft block: which drafts to keep and the token that follows them.

Pure functions of the draft tokens and the two models' adjusted distributions for one block, so the
acceptance rules are tested on their own (3-token arrays) and the speculative loop
(`speculative.speculative_sample`) only calls one of them. p is always the target, q the draft.

* `greedy_accept`: argmax mode; keep drafts while they equal the target's argmax.
* `token_accept`: Algorithm 1 of Leviathan et al. (2022): keep draft i with probability
  min(1, p_i(d_i) / q_i(d_i)) until the first rejection; then sample norm(max(0, p - q)), or, after
  all drafts, the bonus token from p.
* `block_accept`: block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh,
  "Block Verification Accelerates Speculative Decoding", ICLR 2025, Algorithm 2). It verifies the
  whole block jointly: same drafts, same target call, the target distribution is still preserved
  exactly, and the expected number of accepted drafts is at least Algorithm 1's (optimal among
  valid verifiers).

Every rule returns a `Verdict`: n_accepted (the leading drafts kept), the extra token emitted after
them, and β per position (Def. 3.1; a property of p and q, so it means the same for every rule).

`num_drafts` (int32 [batch], default γ) lets a row verify only its first `num_drafts` drafts (the
others are padding, e.g. after early-exit drafting): acceptance stops there and the extra token is
the bonus from p at that position.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_t5x import sampling

Array = jax.Array

VERIFICATIONS = ("token", "block")


class Verdict(NamedTuple):
    """Outcome of verifying one block.

    Attributes:
      n_accepted: int32 [batch] leading drafts accepted (0..num_drafts).
      extra: int32 [batch] token emitted after the accepted drafts (residual or bonus sample).
      beta: float32 [batch, gamma] β_i = Σ_x min(p_i(x), q_i(x)) per draft position (Def. 3.1).
    """

    n_accepted: Array
    extra: Array
    beta: Array


def _num_drafts(drafts: Array, num_drafts: Array | None) -> Array:
    batch, gamma = drafts.shape
    if num_drafts is None:
        return jnp.full((batch,), gamma, jnp.int32)
    return jnp.asarray(num_drafts, jnp.int32)


def _leading_run(accept: Array) -> Array:
    """Length int32 [batch] of the leading run of True in bool [batch, gamma]."""
    return jnp.sum(jnp.cumprod(accept, axis=1), axis=1).astype(jnp.int32)


def _take(dist: Array, tokens: Array) -> Array:
    """dist[b, i, tokens[b, i]]: float32 [batch, n] from [batch, n, vocab] and int32 [batch, n]."""
    return jnp.take_along_axis(dist, tokens[..., None], axis=-1)[..., 0]


def _sample(uniform: Array, probs: Array) -> Array:
    """One int32 [batch] token from unnormalised float32 [batch, vocab] probabilities with positive
    row sums, by inverse CDF from float32 [batch] uniforms (`sampling.inverse_cdf_sample`)."""
    return sampling.inverse_cdf_sample(uniform, probs)


def greedy_accept(drafts: Array, target_logits: Array, num_drafts: Array | None = None) -> Verdict:
    """Argmax-mode verification: keep drafts while they equal the target's argmax.

    Args:
      drafts: int32 [batch, gamma] draft tokens d_1..d_γ.
      target_logits: float32 [batch, gamma + 1, vocab] target logits after prefixes 0..γ.
      num_drafts: optional int32 [batch] drafts to verify per row (default γ).

    Returns:
      `Verdict`; extra is the target's argmax after the accepted drafts, β = [d_i = argmax p_i]
      (one-hot p and q).
    """
    gamma = drafts.shape[1]
    target_argmax = sampling.first_argmax(target_logits)  # [b, γ + 1]
    match = drafts == target_argmax[:, :gamma]
    usable = jnp.arange(gamma) < _num_drafts(drafts, num_drafts)[:, None]
    n_accepted = _leading_run(match & usable)
    extra = jnp.take_along_axis(target_argmax, n_accepted[:, None], axis=1)[:, 0]
    return Verdict(n_accepted, extra, match.astype(jnp.float32))


def token_accept(
    rng: Array, drafts: Array, q: Array, p: Array, num_drafts: Array | None = None
) -> Verdict:
    """Token-by-token verification (Algorithm 1 of Leviathan et al., 2022).

    Draft i is kept with probability min(1, p_i(d_i) / q_i(d_i)) (tested as r * q < p, no
    division) until the first rejection; the extra token comes from norm(max(0, p - q)) at the
    rejected position, or from p after all drafts were kept.

    Args:
      rng: PRNG key (one draw of γ + 1 uniforms per row: γ acceptance tests, then the extra
        token's inverse-CDF uniform).
      drafts: int32 [batch, gamma] d_1..d_γ, sampled from q.
      q: float32 [batch, gamma, vocab] adjusted draft distributions q_1..q_γ.
      p: float32 [batch, gamma + 1, vocab] adjusted target distributions p_1..p_{γ+1}.
      num_drafts: optional int32 [batch] drafts to verify per row (default γ).

    Returns:
      `Verdict`.
    """
    batch, gamma = drafts.shape
    rows = jnp.arange(batch)
    count = _num_drafts(drafts, num_drafts)
    u = jax.random.uniform(rng, (batch, gamma + 1))
    r = u[:, :gamma]
    accept = (r * _take(q, drafts) < _take(p[:, :gamma], drafts)) & (
        jnp.arange(gamma) < count[:, None]
    )
    n_accepted = _leading_run(accept)
    p_next = p[rows, n_accepted]  # [b, V]
    q_next = jnp.where(
        (n_accepted < count)[:, None], q[rows, jnp.minimum(n_accepted, gamma - 1)], 0.0
    )
    residual = jnp.maximum(p_next - q_next, 0.0)
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_next)
    beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)  # [b, γ]
    return Verdict(n_accepted, _sample(u[:, gamma], residual), beta)


def block_stop_probs(
    drafts: Array, q: Array, p: Array, num_drafts: Array | None = None
) -> tuple[Array, Array]:
    """The quantities of block verification (Sun et al., ICLR 2025, Algorithm 2) for one block.

    With weights w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i)) and residual masses
    S_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)), the stopping probabilities are
    h_0 = 1, h_i = S_i / (S_i + 1 - w_i) for 0 < i < n and h_n = w_n (n = num_drafts; h_i = 0
    beyond n). τ = the largest i with η_i < h_i (η_i i.i.d. uniform) is the number of drafts kept;
    the extra token then comes from p_{n+1} if τ = n, else from norm(max(0, w_τ p_{τ+1} - q_{τ+1})).

    Args:
      drafts: int32 [batch, gamma] d_1..d_γ, sampled from q.
      q: float32 [batch, gamma, vocab] adjusted draft distributions q_1..q_γ.
      p: float32 [batch, gamma + 1, vocab] adjusted target distributions p_1..p_{γ+1}.
      num_drafts: optional int32 [batch] drafts to verify per row (default γ).

    Returns:
      h: float32 [batch, gamma + 1] stopping probabilities h_0..h_γ.
      residual: float32 [batch, gamma + 1, vocab] extra-token distribution if τ = i (normalised).
    """
    batch, gamma = drafts.shape
    count = _num_drafts(drafts, num_drafts)
    ratio = _take(p[:, :gamma], drafts) / jnp.maximum(_take(q, drafts), 1e-30)  # [b, γ]

    def weight(w, r):
        w = jnp.minimum(w * r, 1.0)
        return w, w

    _, w_rest = jax.lax.scan(weight, jnp.ones((batch,)), ratio.T)  # [γ, b]
    w = jnp.concatenate([jnp.ones((batch, 1)), w_rest.T], axis=1)  # [b, γ + 1]: w_0..w_γ
    slots = jnp.arange(gamma + 1)
    # Position i uses p_{i+1} and q_{i+1} (q is zero at i = n: the bonus token comes from p).
    q_pad = jnp.pad(q, ((0, 0), (0, 1), (0, 0)))  # [b, γ + 1, V]
    q_next = jnp.where((slots < count[:, None])[..., None], q_pad, 0.0)
    scaled = jnp.where((slots < count[:, None])[..., None], w[..., None] * p, p)
    residual = jnp.maximum(scaled - q_next, 0.0)  # [b, γ + 1, V]
    mass = jnp.sum(residual, axis=-1)  # S_0..S_γ
    denominator = mass + 1.0 - w
    h = jnp.where(denominator > 0, mass / jnp.where(denominator > 0, denominator, 1.0), 0.0)
    h = jnp.where(slots == count[:, None], w, h)
    h = jnp.where(slots > count[:, None], 0.0, h).at[:, 0].set(1.0)  # τ = 0 is always possible
    residual = jnp.where(mass[..., None] > 0, residual, p)
    return h, residual / jnp.sum(residual, axis=-1, keepdims=True)


def block_accept(
    rng: Array, drafts: Array, q: Array, p: Array, num_drafts: Array | None = None
) -> Verdict:
    """Block verification (Sun et al., ICLR 2025, Algorithm 2): `block_stop_probs`, then sample.

    Args and returns as `token_accept` (same drafts, same target distributions, same `Verdict`).
    """
    batch, gamma = drafts.shape
    h, residual = block_stop_probs(drafts, q, p, num_drafts)
    u = jax.random.uniform(rng, (batch, gamma + 2))  # γ + 1 stop tests, the extra token's uniform
    stop = u[:, : gamma + 1] < h  # h_0 = 1: always one stop
    n_accepted = (gamma - jnp.argmax(stop[:, ::-1], axis=1)).astype(jnp.int32)  # last stop
    extra = _sample(u[:, gamma + 1], residual[jnp.arange(batch), n_accepted])
    beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)  # [b, γ]
    return Verdict(n_accepted, extra, beta)
