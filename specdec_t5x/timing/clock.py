"""Cost of one decoder step: the paper's c and the cost of scoring γ + 1 tokens at once.

Speculative decoding's expected speed-up (Leviathan et al., 2022, Theorem 3.8) depends on

* c = (time of one draft step) / (time of one target step), both one-token cached decoder calls;
* the cost of the target's verify call on γ + 1 tokens relative to its one-token step
  (`verify_cost_ratio`; the paper assumes ~1 when the target is memory bound).

`measure_step_costs` times exactly the calls the samplers make (`steps.make_block_step` on a
cache created by `steps.init_cache`), with random weights, so any two model sizes can be compared
without checkpoints. Each step is jit-compiled once, warmed up, then timed with
`block_until_ready` in interleaved rounds (target, draft, verify, in rotating order) so that
machine noise hits all three alike; the median of the rounds is reported.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import decoding


def call_order(names: Sequence[Hashable], index: int, seed: int = 0) -> list:
    """The order in which to run `names` on example `index`: a permutation seeded by (seed, index).

    Interleaved comparisons run every function once per example; who goes first (after which
    function, with whose weights in the caches) must not correlate with the examples. Alternating
    the order by parity did: the DDTP test split alternates short synopses and long descriptions,
    so "who goes first" was confounded with the example's length (an A/A comparison of the
    baseline with itself read 0.92× in one Table 2 run). A seeded permutation per example gives
    every function every position with equal probability, independent of the examples, and is
    the same on every process and every rerun.

    Args:
      names: the functions' keys.
      index: the example (or batch) index, >= 0.
      seed: run seed.

    Returns:
      list: `names` permuted.
    """
    perm = np.random.default_rng([seed, index]).permutation(len(names))
    return [names[j] for j in perm]


def time_interleaved(
    calls: Mapping[Hashable, Callable[[], Any]],
    repeats: int,
    warmup: int = 3,
    shuffle: bool = False,
) -> dict[Hashable, list[float]]:
    """Milliseconds per call: compiled and warmed up first, then rounds in rotating order.

    Args:
      calls: name (any hashable key) -> zero-argument function returning arrays (blocked on with
        `jax.block_until_ready`).
      repeats: timed rounds; each round times every call once.
      warmup: untimed rounds after the first (compiling) one.
      shuffle: each round in a seeded random order (`call_order`) instead of a rotation. In a
        rotation a call follows the same call in all rounds but one, so a call that warms the
        CPU's caches for the next (a short loop before the same loop made longer) biases their
        difference; a random order gives every call every predecessor alike.

    Returns:
      name -> list of `repeats` wall-clock durations in milliseconds.
    """
    names = list(calls)

    def run(name: Hashable) -> float:
        start = time.perf_counter()
        jax.block_until_ready(calls[name]())
        return (time.perf_counter() - start) * 1e3

    for _ in range(warmup + 1):  # the first round compiles
        for name in names:
            run(name)
    samples: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = (
            call_order(names, r) if shuffle else names[r % len(names) :] + names[: r % len(names)]
        )
        for name in order:
            samples[name].append(run(name))
    return samples


def paired_ratio(numerator_ms: Sequence[float], denominator_ms: Sequence[float]) -> float:
    """Median over rounds of numerator / denominator timed in the same round (dimensionless).

    `time_interleaved` times every call once per round, back to back, so the two calls of a round
    share the machine's state (clock, the other core's load); the ratio within a round cancels
    what they share, where a ratio of two separate medians does not (the same models once read a
    verify ratio of 1.11 in one Table 3 row and 1.36 in the next, the step times' spreads
    overlapping by 30 %).

    Args:
      numerator_ms, denominator_ms: float [rounds] durations of two calls, round by round.

    Returns:
      The median of the per-round ratios.

    Raises:
      ValueError: lengths differ, no rounds, or a denominator <= 0.
    """
    if len(numerator_ms) != len(denominator_ms) or not len(numerator_ms):
        raise ValueError(
            f"paired_ratio needs two equally long, non-empty round lists; got "
            f"{len(numerator_ms)} and {len(denominator_ms)}."
        )
    if min(denominator_ms) <= 0:
        raise ValueError(f"paired_ratio needs positive denominators; got {min(denominator_ms)}.")
    ratios = [a / b for a, b in zip(numerator_ms, denominator_ms, strict=True)]
    return float(statistics.median(ratios))


# A loop's per-step slope is floored here (ms): a step cheaper than the timer's noise (tiny test
# models) can read <= 0 in a round, and the ratios need positive step costs.
FLOOR_MS = 1e-6
# The long loop's length in short loops (`time_decoder_steps`).
LONG_LOOP = 4


def loop(step: Callable[..., Any]) -> Callable[..., Any]:
    """`(args, tokens, positions, cache, n) -> (float32 [batch], cache)`: `step` n times in a
    `lax.fori_loop` with the cache as carry, one logit per step summed to keep the logits live."""

    def run(args, tokens, positions, cache, n):
        def body(_, carry):
            cache, total = carry
            logits, cache = step(*args, tokens, positions, cache)
            return cache, total + logits[:, -1, 0]

        total = jnp.zeros((tokens.shape[0],), jnp.float32)
        cache, total = jax.lax.fori_loop(0, n, body, (cache, total))
        return total, cache

    return run


def iterations(target_step, draft_step, gamma: int) -> Callable[..., Any]:
    """n speculative iterations' model calls in one loop: γ draft steps, then a verify call.

    Each call's tokens depend on the previous call's logits (as in the decode loop, where the
    draft reads the last accepted token and the target reads the draft's tokens), so nothing
    overlaps. Returns `(target_args, draft_args, one int32 [batch, 1], block int32 [batch, γ + 1],
    positions int32 [batch], (target_cache, draft_cache), n) -> (float32 [batch], caches)`.
    """

    def run(target_args, draft_args, one, block, positions, caches, n):
        def body(_, carry):
            (target_cache, draft_cache), total = carry
            for j in range(gamma):
                dep = (total > 1e30).astype(jnp.int32)[:, None]  # never true; orders the calls
                logits, draft_cache = draft_step(*draft_args, one + dep, positions + j, draft_cache)
                total = total + logits[:, -1, 0]
            dep = (total > 1e30).astype(jnp.int32)[:, None]
            logits, target_cache = target_step(*target_args, block + dep, positions, target_cache)
            return (target_cache, draft_cache), total + logits[:, -1, 0]

        total = jnp.zeros((one.shape[0],), jnp.float32)
        return jax.lax.fori_loop(0, n, body, (caches, total))[::-1]

    return run


def looped_steps(step: Callable[..., Any], steps_per_call: int) -> Callable[..., Any]:
    """`step` run `steps_per_call` times in one jitted `lax.fori_loop`, the cache as loop carry.

    Args:
      step: `(*args, tokens int32 [batch, k], positions int32 [batch], cache) -> (logits float32
        [batch, k, vocab], cache)`.
      steps_per_call: loop length.

    Returns:
      jitted `(args tuple, tokens, positions, cache) -> (float32 [batch] sum of one logit per step,
      which keeps the logits live, cache)`; the cache argument is donated.
    """
    run = loop(step)
    return jax.jit(lambda a, t, p, c: run(a, t, p, c, steps_per_call), donate_argnums=(3,))


@contextlib.contextmanager
def paused(pid_file: str | os.PathLike | None) -> Iterator[None]:
    """SIGSTOPs the process whose id is in `pid_file` (e.g. a background training job) inside the
    block and SIGCONTs it after, whatever happens; does nothing when `pid_file` is None."""
    pid = int(pathlib.Path(pid_file).read_text().strip()) if pid_file else None
    if pid:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)


def one_token_logits(block_step) -> decoding.TokensToLogits:
    """A `steps.BlockStep` as T5X's `tokens_to_logits(DecodingState) -> ([B, vocab], cache)` (the
    timing loops' copy of `models.one_token_logits_fn`: the instruments stay below the models)."""

    def tokens_to_logits(state: decoding.DecodingState):
        logits, cache = block_step(state.cur_token, state.cur_index, state.cache)
        return logits[:, 0], cache  # [B, 1, V] -> [B, V]

    return tokens_to_logits


def constant_step(vocab: int, eos_id: int):
    """A zero-cost `steps.BlockStep`: the same logits row at every position (EOS never wins)."""
    row = jax.random.normal(jax.random.PRNGKey(0), (vocab,)) * 3.0
    row = row.at[eos_id].set(-1e9)

    def step(tokens, positions, cache):
        shift = (positions.astype(jnp.float32) * 1e-6)[:, None, None]  # not loop-invariant
        return jnp.broadcast_to(row, tokens.shape + (vocab,)) + shift, cache

    return step


def zero_cost_decode(
    sampler,
    gamma: int = 1,
    *,
    batch: int,
    vocab: int,
    max_decode_len: int,
    max_decode_steps: int,
    settings: Mapping[str, Any],
    eos_id: int,
    verification: str = "token",
    baseline_sampler: str = "t5x",
):
    """A jitted zero-argument decode call with zero-cost models (`constant_step`), to time.

    Args:
      sampler: a `speculative.speculative_sample`-compatible function (target and draft both the
        constant step, `gamma` drafts), or None for the baseline `decoding.temperature_sample`.
      gamma: γ (speculative only); batch, vocab, max_decode_len: decode shapes;
      max_decode_steps: tokens to generate; settings: {'temperature', 'topk', 'topp'}; eos_id;
      verification: 'token' or 'block' (speculative only).
      baseline_sampler: the baseline's draw (`decoding.SAMPLERS`; baseline only).

    Returns:
      () -> int32 [batch, max_decode_len] decodes (PRNG key fixed).
    """
    step = constant_step(vocab, eos_id)
    inputs = jnp.zeros((batch, max_decode_len), jnp.int32)
    cache = jnp.zeros((), jnp.float32)
    common = dict(max_decode_steps=max_decode_steps, **settings)
    if sampler is None:
        one_token = one_token_logits(step)
        fn = lambda r: decoding.temperature_sample(
            inputs, cache, one_token, eos_id, r, sampler=baseline_sampler, **common
        )
    else:
        fn = lambda r: sampler(
            inputs,
            cache,
            step,
            cache,
            step,
            eos_id,
            gamma=gamma,
            decode_rng=r,
            verification=verification,
            **common,
        )
    jitted = jax.jit(lambda r: fn(r)[0])
    rng = jax.random.PRNGKey(1)
    return lambda: jitted(rng)
