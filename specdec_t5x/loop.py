"""What the chain loop (`speculative`) and the tree loop (`tree_decoding`) share.

The carry (`LoopState`), the statistics both keep (`LoopStats`), the argument checks, the start
(forced prompt prefilled, limits, the iteration bound to its arguments), the draft's first call of an iteration (catching up on the token it never consumed), emitting an
iteration's tokens (cut at EOS and at the row's length limit) and running the `lax.while_loop`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import steps

Array = jax.Array


@flax.struct.dataclass
class LoopState:
    """Carry of a speculative loop (chain or tree).

    Attributes:
      buffer: int32 [batch, max_decode_len + depth + 2] decoder inputs by absolute position
        (depth: γ, or the tree's depth).
      length: int32 [batch] valid positions in `buffer` (start token included).
      draft_behind: bool [batch] the draft cache lacks the entry at position length - 2.
      done: bool [batch] row ended (EOS) or reached its length limit.
      target_cache, draft_cache: the steps' caches.
      rng: PRNG key.
      stats: `speculative.SpeculativeStats` or `tree.TreeStats` of [batch] arrays.
    """

    buffer: Array
    length: Array
    draft_behind: Array
    done: Array
    target_cache: Any
    draft_cache: Any
    rng: Array
    stats: Any


@flax.struct.dataclass
class LoopStats:
    """The per-row statistics both loops keep (only iterations before a row ended count).

    `speculative.SpeculativeStats` and `tree.TreeStats` extend it (a "draft test" is one draft of
    the chain, or one depth of the tree: α_counted = num_accepted / num_draft_tokens).

    Attributes:
      num_iterations: int32 [batch] target verify calls (iterations).
      num_draft_tokens: int32 [batch] draft tests that ran: min(n_accepted + 1, γ) per iteration
        for a chain, the depths whose child tests ran for a tree (fewer when EOS or the length
        limit cut the iteration).
      num_accepted: int32 [batch] accepted drafts (depths); each test is a Bernoulli(β) trial
        (Def. 3.1).
      accept_histogram: int32 [batch, depth + 1] iterations that accepted n drafts (depths).
      beta_sum: float32 [batch] Σ β over the tests (Corollary 3.6 estimator of α).
      num_beta: int32 [batch] number of β terms in `beta_sum`.
      num_generated: int32 [batch] tokens written by the loop (forced prompt excluded, EOS
        included); tokens per iteration = num_generated / num_iterations.
      num_proposed: int32 [batch] draft tokens (tree nodes) proposed (γ or K - 1 per iteration;
        fewer with early exit or near the length limit).
    """

    num_iterations: Array
    num_draft_tokens: Array
    num_accepted: Array
    accept_histogram: Array
    beta_sum: Array
    num_beta: Array
    num_generated: Array
    num_proposed: Array

    @classmethod
    def start(cls, batch: int, depth: int, **extra: Array):
        """The statistics before the first iteration for `batch` rows and `depth` (γ, or the
        tree's depth): every count zero, the subclass's own fields from `extra`."""
        zeros = lambda *shape: jnp.zeros((batch,) + shape, jnp.int32)
        return cls(
            num_iterations=zeros(),
            num_draft_tokens=zeros(),
            num_accepted=zeros(),
            accept_histogram=zeros(depth + 1),
            beta_sum=jnp.zeros((batch,), jnp.float32),
            num_beta=zeros(),
            num_generated=zeros(),
            num_proposed=zeros(),
            **extra,
        )

    def count(self, active, tested, accepted, beta, num_new, proposed):
        """These statistics (of the same class) with one iteration's counts added.

        Args:
          active: bool [batch] rows still decoding at the iteration's start (others add nothing
            to `num_iterations`, `accept_histogram` and `num_proposed`; their other counts must
            be zero).
          tested: int32 [batch] draft tests counted; accepted: int32 [batch] accepted drafts
            (0..depth).
          beta: float32 [batch] Σ β over the counted tests.
          num_new: int32 [batch] tokens written.
          proposed: int32 [batch] drafts (nodes) proposed.
        """
        return self.replace(
            num_iterations=self.num_iterations + active,
            num_draft_tokens=self.num_draft_tokens + tested,
            num_accepted=self.num_accepted + accepted,
            accept_histogram=self.accept_histogram
            + jax.nn.one_hot(accepted, self.accept_histogram.shape[1], dtype=jnp.int32)
            * active[:, None],
            beta_sum=self.beta_sum + beta,
            num_beta=self.num_beta + tested,
            num_generated=self.num_generated + num_new,
            num_proposed=self.num_proposed + jnp.where(active, proposed, 0),
        )


def check(inputs: Array, max_decode_steps, target, draft, eos_id: int) -> tuple[int, int]:
    """`(batch, max_decode_len)` of `inputs` int32 [batch, max_decode_len] after the checks.

    Args:
      inputs: int32 [batch, max_decode_len].
      max_decode_steps: None, an int, or an int32 scalar array (may be traced; not checked).
      target, draft: (block step, cache) each.
      eos_id: end-of-sequence id.

    Raises:
      ValueError: inputs not 2-D, max_decode_steps outside [0, max_decode_len], target and draft
        vocabularies of different size, or eos_id outside the vocabulary.
    """
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be int32 [batch, max_decode_len]; got shape {inputs.shape}.")
    batch, max_len = inputs.shape
    concrete = isinstance(max_decode_steps, int | np.integer)  # else a (traced) int32 scalar
    if concrete and not 0 <= int(max_decode_steps) <= max_len:
        raise ValueError(
            f"max_decode_steps must be in [0, max_decode_len={max_len}]; got {max_decode_steps}."
        )
    steps.check_vocab(target[0], target[1], draft[0], draft[1], batch, eos_id)
    return batch, max_len


def start(
    iteration: Callable[..., LoopState],
    inputs: Array,
    max_decode_steps,
    depth: int,
    target,
    draft,
    eos_id: int,
    rng,
    stats,
    **settings: Any,
) -> tuple[LoopState, Callable[[LoopState], LoopState]]:
    """The loop state before the first iteration, and the loop's body.

    Args:
      iteration: `iteration(state, *, target_fn, draft_fn, eos_id, limit, **settings) -> state`,
        one iteration for every row (`limit`: int32 [batch], a row is full when length - 1
        reaches it).
      inputs, max_decode_steps: as `check`.
      depth: static, the most drafts one iteration can accept (γ, or the tree's depth).
      target, draft: (block step, cache) each.
      eos_id: end-of-sequence id.
      rng: PRNG key (None: `PRNGKey(0)`).
      stats: the statistics' zeros (`speculative.SpeculativeStats`, `tree.TreeStats`).
      **settings: further keywords of `iteration`.

    Returns:
      (`LoopState`, body: `iteration` with every argument but the state bound).
    """
    buffer, length, limit, target_cache, draft_cache = steps.start_loop(
        inputs, max_decode_steps, depth, target, draft
    )
    state = LoopState(
        buffer=buffer,
        length=length,
        draft_behind=jnp.zeros((inputs.shape[0],), bool),
        done=length - 1 >= limit,
        target_cache=target_cache,
        draft_cache=draft_cache,
        rng=jax.random.PRNGKey(0) if rng is None else rng,
        stats=stats,
    )
    body = functools.partial(
        iteration, target_fn=target[0], draft_fn=draft[0], eos_id=eos_id, limit=limit, **settings
    )
    return state, body


def run(body, init: LoopState, max_len: int) -> tuple[Array, Any]:
    """Runs `body(state) -> state` until every row is done: (decodes int32 [batch, max_len],
    stats)."""
    final = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, init)
    return final.buffer[:, 1 : max_len + 1], final.stats


def draft_root_logits(draft_fn, state: LoopState, active: Array) -> tuple[Array, Any]:
    """The draft's logits after the last emitted token (at position length - 1).

    Rows whose draft cache is behind (`draft_behind`: the previous iteration accepted every draft,
    so the draft never consumed its last one) feed (d_γ, bonus) at length - 2, length - 1; the
    others then feed (last, last) at length - 1, length and use column 0 (their slot at length is
    overwritten before it is ever read). Without such rows one token is fed.

    Args:
      draft_fn: the draft's `steps.BlockStep`.
      state: the `LoopState` (buffer, length, draft_behind, draft_cache).
      active: bool [batch] rows still decoding.

    Returns:
      (logits float32 [batch, vocab], the draft cache).
    """
    n, behind = state.length, state.draft_behind
    rows = jnp.arange(n.shape[0])
    last = state.buffer[rows, n - 1]

    def one_token(dc):
        logits, dc = draft_fn(last[:, None], n - 1, dc)
        return logits[:, 0], dc

    def two_tokens(dc):
        prev = state.buffer[rows, jnp.maximum(n - 2, 0)]
        tokens = jnp.stack([jnp.where(behind, prev, last), last], axis=1)  # [b, 2]
        logits, dc = draft_fn(tokens, n - 1 - behind, dc)
        return jnp.where(behind[:, None], logits[:, 1], logits[:, 0]), dc

    return jax.lax.cond(jnp.any(behind & active), two_tokens, one_token, state.draft_cache)


class Emitted(NamedTuple):
    """An iteration's output tokens, written.

    Attributes:
      tokens: int32 [batch, depth + 1] the accepted drafts, then the extra token, then padding.
      num_new: int32 [batch] tokens written (0 for rows already done).
      buffer: int32 [batch, ...] the buffer with them.
      length: int32 [batch] the new lengths.
      ended: bool [batch] rows that wrote EOS or reached their limit in this iteration.
    """

    tokens: Array
    num_new: Array
    buffer: Array
    length: Array
    ended: Array


def emit(state, accepted, n_accepted, extra, eos_id: int, limit, active) -> Emitted:
    """Writes d_1..d_{n_accepted}, t after each row's tokens, cut at EOS and at the length limit.

    Args:
      state: the `LoopState` (buffer, length).
      accepted: int32 [batch, depth] the drafts in order (a chain's drafts, a tree's path);
        entries past n_accepted are ignored.
      n_accepted: int32 [batch] leading drafts accepted (0..depth).
      extra: int32 [batch] the token after them (residual sample or bonus).
      eos_id: end-of-sequence id.
      limit: int32 [batch] length limits (`start`).
      active: bool [batch] rows still decoding (others write nothing).

    Returns:
      `Emitted`.
    """
    n, depth = state.length, accepted.shape[1]
    slots = jnp.arange(depth + 1)
    tokens = jnp.pad(accepted, ((0, 0), (0, 1)))
    tokens = jnp.where(slots == n_accepted[:, None], extra[:, None], tokens)
    is_eos = (tokens == eos_id) & (slots <= n_accepted[:, None])
    first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), depth + 1)
    num_new = jnp.minimum(jnp.minimum(n_accepted + 1, first_eos + 1), limit - (n - 1))
    num_new = jnp.where(active, num_new, 0)

    def write(row_buffer, row_new, at, count):
        window = jax.lax.dynamic_slice(row_buffer, (at,), (depth + 1,))
        window = jnp.where(slots < count, row_new, window)
        return jax.lax.dynamic_update_slice(row_buffer, window, (at,))

    buffer = jax.vmap(write)(state.buffer, tokens, n, num_new)
    length = n + num_new
    ended = active & ((first_eos < num_new) | (length - 1 >= limit))
    return Emitted(tokens, num_new, buffer, length, ended)
