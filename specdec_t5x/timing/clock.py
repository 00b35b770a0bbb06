"""Interleaved timing, paired ratios, and the timed loops and zero-cost models they run.

Every timed call is jit-compiled once, warmed up, then timed with `block_until_ready` in
interleaved rounds, so that machine noise hits all calls of a round alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import decoding

# A loop's per-step slope is floored here (ms): a slope below the timer's noise can read <= 0.
FLOOR_MS = 1e-6
# The long loop's length in short loops (`step_timer.time_decoder_steps`).
LONG_LOOP = 4
# Rounds `time_interleaved` always times, whatever its time budget.
MIN_ROUNDS = 10


def call_order(names: Sequence[Hashable], index: int, seed: int = 0) -> list:
    """`names` permuted by a generator seeded with (seed, index): who goes first on example
    `index` (>= 0) never correlates with the examples (an order by parity did, on a split that
    alternates short and long examples), and is the same on every process and rerun."""
    perm = np.random.default_rng([seed, index]).permutation(len(names))
    return [names[j] for j in perm]


def time_interleaved(
    calls: Mapping[Hashable, Callable[[], Any]],
    repeats: int,
    warmup: int = 3,
    shuffle: bool = False,
    budget_s: float | None = None,
) -> dict[Hashable, list[float]]:
    """Milliseconds per call: compiled and warmed up first, then rounds in rotating order.

    Args:
      calls: key -> zero-argument function returning arrays (blocked on).
      repeats: timed rounds; each times every call once.
      warmup: untimed rounds after the first (compiling) one.
      shuffle: each round in `call_order` instead of a rotation (in a rotation a call follows the
        same call in all rounds but one, which biases calls that warm the caches for the next).
      budget_s: seconds the timed rounds may take (None: no limit); once `MIN_ROUNDS` rounds are
        done, no round starts after it is spent.

    Returns:
      key -> wall-clock durations, ms: `repeats` of them, or fewer when `budget_s` ran out.
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
    start = time.perf_counter()
    for r in range(repeats):
        spent = time.perf_counter() - start
        if budget_s is not None and r >= MIN_ROUNDS and spent > budget_s:
            break
        order = (
            call_order(names, r) if shuffle else names[r % len(names) :] + names[: r % len(names)]
        )
        for name in order:
            samples[name].append(run(name))
    return samples


def paired_ratio(numerator_ms: Sequence[float], denominator_ms: Sequence[float]) -> float:
    """Median over rounds of numerator / denominator of the same round (what the round's two
    calls share, the machine's clock and load, cancels; a ratio of medians keeps it).

    Args:
      numerator_ms, denominator_ms: float [rounds] durations, round by round.

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
    """n speculative iterations' model calls in one loop: γ draft steps, then a verify call, each
    call's tokens depending on the previous logits (nothing overlaps). Returns `(target_args,
    draft_args, one int32 [batch, 1], block int32 [batch, γ + 1], positions int32 [batch],
    (target_cache, draft_cache), n) -> (float32 [batch], caches)`."""

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


def constant_step(vocab: int, eos_id: int):
    """A zero-cost `steps.BlockStep`: the same logits row at every position (EOS never wins)."""
    row = jax.random.normal(jax.random.PRNGKey(0), (vocab,)) * 3.0
    row = row.at[eos_id].set(-1e9)

    def step(tokens, positions, cache):
        shift = (positions.astype(jnp.float32) * 1e-6)[:, None, None]  # not loop-invariant
        return jnp.broadcast_to(row, tokens.shape + (vocab,)) + shift, cache

    return step


def zero_cost_decode(sampler, gamma: int = 1, *, batch: int, vocab: int, max_decode_len: int,
                     max_decode_steps: int, settings: Mapping[str, Any], eos_id: int,
                     verification: str = "token", baseline_sampler: str = "t5x"):  # fmt: skip
    """A jitted `() -> int32 [batch, max_decode_len]` decode with zero-cost models
    (`constant_step`; PRNG key fixed), to time.

    Args:
      sampler: `speculative.speculative_sample` or a compatible function (`gamma`, `verification`
        apply), or None for `decoding.temperature_sample` (`baseline_sampler`: its draw).
      settings: {'temperature', 'topk', 'topp'}; the rest: decode shapes, tokens and EOS id.
    """
    step = constant_step(vocab, eos_id)
    inputs = jnp.zeros((batch, max_decode_len), jnp.int32)
    cache = jnp.zeros((), jnp.float32)
    common = dict(max_decode_steps=max_decode_steps, **settings)
    if sampler is None:
        one_token = decoding.one_token_logits(step)
        fn = lambda r: decoding.temperature_sample(
            inputs, cache, one_token, eos_id, r, sampler=baseline_sampler, **common
        )
    else:
        fn = lambda r: sampler(inputs, cache, step, cache, step, eos_id, gamma=gamma,
                               decode_rng=r, verification=verification, **common)  # fmt: skip
    jitted = jax.jit(lambda r: fn(r)[0])
    rng = jax.random.PRNGKey(1)
    return lambda: jitted(rng)
