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
import dataclasses
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

from specdec_t5x import network, steps


@dataclasses.dataclass
class _Decoder:
    """A randomly initialised model, its encoder inputs, a fresh cache and its jitted step."""

    params: Any
    encoder_input_tokens: jax.Array  # int32 [batch, enc_len]
    cache: Any
    step: Any  # (params, enc_tokens, tokens [b, k], positions [b], cache) -> (logits, cache)


def _random_decoder(config: network.T5Config, batch: int, enc_len: int, max_len: int, seed: int):
    module = network.Transformer(config)
    params = steps.pack_params(module, random_params(module, seed))  # CPU kernel: pack once
    key = jax.random.PRNGKey(seed + 1)
    tokens = jax.random.randint(key, (batch, enc_len), 2, config.vocab_size).astype(jnp.int32)

    def new_cache(params, tokens):
        return steps.prepare_cache(module, params, tokens, max_len)

    cache = jax.jit(new_cache)(params, tokens)
    return _Decoder(params, tokens, cache, jax.jit(decoder_step(module), donate_argnums=(4,)))


def decoder_step(module: network.Transformer) -> Callable[..., Any]:
    """`steps.make_block_step` of `module` with the parameters and encoder tokens as arguments:
    `(params, encoder_input_tokens int32 [b, enc_len], tokens int32 [b, k], positions int32 [b],
    cache) -> (logits float32 [b, k, vocab], cache)`, so timed jitted calls take them as inputs
    rather than baking them in as constants."""

    def step(params, encoder_input_tokens, tokens, positions, cache):
        return steps.make_block_step(module, params, encoder_input_tokens)(tokens, positions, cache)

    return step


def random_params(module: network.Transformer, seed: int = 0) -> Any:
    """Parameters of `module` drawn with NumPy: N(0, 1/fan_in) matrices, unit norm scales.

    Cheaper than `module.init` (whose jitted initialisers take seconds to compile even for tiny
    models with T5's 32k vocabulary); timings do not depend on the values.
    """
    ones = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    init = lambda e, d: module.init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False)
    shapes = jax.eval_shape(init, ones, ones)["params"]
    rng = np.random.default_rng(seed)

    def draw(leaf):
        if len(leaf.shape) == 1:
            return jnp.ones(leaf.shape, leaf.dtype)
        values = rng.standard_normal(leaf.shape, np.float32) / np.sqrt(leaf.shape[0])
        return jnp.asarray(values, leaf.dtype)

    return jax.tree_util.tree_map(draw, shapes)


def count_params(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def config_dict(config: network.T5Config) -> dict[str, Any]:
    """`config` as JSON-ready values (dtype by name, activations as a list)."""
    out = dataclasses.asdict(config)
    out["dtype"] = jnp.dtype(config.dtype).name
    out["mlp_activations"] = list(config.mlp_activations)
    return out


def measure_step_costs(
    target_config: network.T5Config,
    draft_config: network.T5Config,
    batch: int = 1,
    enc_len: int = 64,
    max_len: int = 128,
    gamma: int = 5,
    repeats: int = 30,
    warmup: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Median wall time of target, draft and verify decoder steps, and the ratios c and verify.

    Args:
      target_config, draft_config: the two models (random weights).
      batch: decode batch size.
      enc_len: encoder input length (all tokens valid).
      max_len: decoder cache length; steps run at position max_len // 2 (attention reads the whole
        position-masked cache anyway).
      gamma: draft tokens per iteration; the verify step scores γ + 1 tokens.
      repeats: timed rounds (each times all three steps once).
      warmup: untimed rounds after compilation.
      seed: PRNG seed of weights and inputs.

    Returns:
      dict with `target_step_ms`, `draft_step_ms`, `verify_step_ms` (medians), their
      `*_ms_iqr` ([p25, p75]), `c` = draft / target, `verify_cost_ratio` = verify / target,
      the settings, both configs and parameter counts, and `jax_backend`.

    Raises:
      ValueError: γ < 1, repeats < 1, or max_len too short for the verify block.
    """
    if gamma < 1 or repeats < 1 or max_len < gamma + 2:
        raise ValueError(
            f"need gamma >= 1, repeats >= 1, max_len >= gamma + 2; got {gamma}, {repeats}, {max_len}."
        )
    target = _random_decoder(target_config, batch, enc_len, max_len, seed)
    draft = _random_decoder(draft_config, batch, enc_len, max_len, seed + 2)
    result = time_decoder_steps(
        target.step,
        (target.params, target.encoder_input_tokens),
        target.cache,
        draft.step,
        (draft.params, draft.encoder_input_tokens),
        draft.cache,
        batch=batch,
        position=min(max_len // 2, max_len - gamma - 1),
        gamma=gamma,
        repeats=repeats,
        warmup=warmup,
    )
    result.update(
        batch=batch,
        enc_len=enc_len,
        max_len=max_len,
        gamma=gamma,
        repeats=repeats,
        warmup=warmup,
        target_params=count_params(target.params),
        draft_params=count_params(draft.params),
        target_config=config_dict(target_config),
        draft_config=config_dict(draft_config),
        jax_backend=jax.default_backend(),
    )
    return result


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
    what they share, where a ratio of two separate medians does not (session 11: the same models
    read a verify ratio of 1.11 in one Table 3 row and 1.36 in the next, the step times' spreads
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
_FLOOR_MS = 1e-6
# The long loop's length in short loops (`time_decoder_steps`).
LONG_LOOP = 4


def _loop(step: Callable[..., Any]) -> Callable[..., Any]:
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


def _looped(step: Callable[..., Any]) -> Callable[..., Any]:
    """`step` run n times (n a traced int32 argument) in one jitted loop, the cache as carry.

    Returns jitted `(args, tokens, positions, cache, n) -> (float32 [batch], cache)`; the cache is
    donated. One compilation serves every n.
    """
    return jax.jit(_loop(step), donate_argnums=(3,))


def _iteration_loop(target_step, draft_step, gamma: int) -> Callable[..., Any]:
    """n speculative iterations' model calls in one jitted loop: γ draft steps, then a verify call.

    Each call's tokens depend on the previous call's logits (as in the decode loop, where the
    draft reads the last accepted token and the target reads the draft's tokens), so nothing
    overlaps. Returns jitted `(target_args, draft_args, one int32 [batch, 1], block int32
    [batch, γ + 1], positions int32 [batch], (target_cache, draft_cache), n) -> (float32 [batch],
    caches)`; the caches are donated.
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

    return jax.jit(run, donate_argnums=(5,))


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
    run = _loop(step)
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


def time_decoder_steps(
    target_step,
    target_args,
    target_cache,
    draft_step,
    draft_args,
    draft_cache,
    *,
    batch: int,
    position: int,
    gamma: int,
    repeats: int = 30,
    warmup: int = 3,
    steps_per_call: int = 8,
    block_sizes: Sequence[int] = (),
) -> dict[str, Any]:
    """c and the verify-cost ratio of two decoder steps, timed side by side *inside loops*.

    Every cost is the slope of a loop's time in its length: each loop (the target's one-token
    step, the draft's step, the γ + 1-token verify call, a k-token call per `block_sizes`, and one
    speculative iteration's model calls: γ draft steps then the verify call) runs as one jitted
    loop with the caches as the carry, once with `steps_per_call` steps and once with `LONG_LOOP` (4)
    times as many, in the same round (rounds in random order: `time_interleaved`'s `shuffle`); per
    step = (long - short) / (3 * steps_per_call). A call's fixed cost
    (dispatching a jitted call over the parameter tree, 0.4-0.9 ms on the 2-core CPU, about one
    target step) cancels; dividing one call's time by its steps did not remove it, and charged
    ~0.09 ms to every step of an 8-step loop, which overstated T(1) against the decode loops and
    with it every predicted speedup.

    The draft's cost is also taken *between verify calls*: in the decode loop the target's weight
    stream evicts the draft from the CPU's caches every iteration (results/verify_cost/
    loop_interference.md: the draft's γ = 2 steps cost 0.045 ms alone and 0.147 ms after a 24 MiB
    sweep), a cost no loop of one model sees. `interference_ms` = iteration - verify - γ draft,
    per iteration, and `c` = (iteration - verify) / (γ T(1)): the draft's cost per step as the
    decode loop pays it (the paper's c, "the time for a single run of M_q" divided by M_p's, taken
    where the runs happen). `c_alone` is the draft's loop on its own.

    Args:
      target_step, draft_step: `(*args, tokens int32 [batch, k], positions int32 [batch], cache)
        -> (logits, cache)` (traceable; may already be jitted).
      target_args, draft_args: leading arguments (e.g. params, encoder tokens).
      target_cache, draft_cache: caches to start from (copied; each loop chains its own).
      batch: rows; position: decoder position of the timed steps (the draft's j-th step of an
        iteration at position + j); gamma: verify block is γ + 1, γ >= 1.
      repeats, warmup: see `time_interleaved`.
      steps_per_call: steps of the short loop (the long one runs `LONG_LOOP` times as many), >= 1.
      block_sizes: extra target block sizes k to time in the same rounds (the cost curve T(k)).

    Returns:
      dict with `target_step_ms`, `draft_step_ms` (alone), `verify_step_ms`, `iteration_ms` (γ
      draft steps + verify, in one loop) (medians per step of the slopes, ms), `*_step_ms_iqr`
      ([p25, p75]), `fixed_call_ms` {loop: median fixed cost of one call, ms}, `interference_ms`
      (per iteration, ms), `c` (in the loop, as above), `c_alone` = draft / target and
      `verify_cost_ratio` = verify / target (each the median over rounds of the ratio within a
      round: `paired_ratio`), `steps_per_call`, and `block_step_ms` {k: median ms of a k-token
      target call}.

    Raises:
      ValueError: gamma < 1 or steps_per_call < 1.
    """
    if gamma < 1 or steps_per_call < 1:
        raise ValueError(f"need gamma >= 1 and steps_per_call >= 1; got {gamma}, {steps_per_call}.")
    target_loop, draft_loop = _looped(target_step), _looped(draft_step)
    iteration_loop = _iteration_loop(target_step, draft_step, gamma)
    pos = jnp.full((batch,), position, jnp.int32)
    one = jnp.full((batch, 1), 5, jnp.int32)
    block = jnp.full((batch, gamma + 1), 5, jnp.int32)
    loops = {
        "target": (target_loop, target_args, one, target_cache),
        "draft": (draft_loop, draft_args, one, draft_cache),
        "verify": (target_loop, target_args, block, target_cache),
        **{
            f"block_{k}": (
                target_loop,
                target_args,
                jnp.full((batch, k), 5, jnp.int32),
                target_cache,
            )
            for k in block_sizes
        },
    }
    lengths = {"short": steps_per_call, "long": LONG_LOOP * steps_per_call}
    caches = {
        (name, length): jax.tree_util.tree_map(jnp.copy, spec[3])
        for name, spec in loops.items()
        for length in lengths
    }
    for length in lengths:
        caches[("iteration", length)] = jax.tree_util.tree_map(
            jnp.copy, (target_cache, draft_cache)
        )

    def call(name, length):
        key, n = (name, length), jnp.int32(lengths[length])
        if name == "iteration":

            def run():
                total, caches[key] = iteration_loop(
                    target_args, draft_args, one, block, pos, caches[key], n
                )
                return total, caches[key]

            return run
        loop, args, tokens, _ = loops[name]

        def run():
            total, caches[key] = loop(args, tokens, pos, caches[key], n)
            return total, caches[key]

        return run

    names = [*loops, "iteration"]
    samples = time_interleaved({k: call(*k) for k in caches}, repeats, warmup, shuffle=True)
    span = lengths["long"] - lengths["short"]
    per_step = {
        name: [
            max((lo - sh) / span, _FLOOR_MS)
            for lo, sh in zip(samples[(name, "long")], samples[(name, "short")], strict=True)
        ]
        for name in names
    }
    fixed = {
        name: statistics.median(
            sh - lengths["short"] * p
            for sh, p in zip(samples[(name, "short")], per_step[name], strict=True)
        )
        for name in names
    }
    median = {name: statistics.median(values) for name, values in per_step.items()}
    # Per round: the iteration's drafting (>= 0) and what it costs beyond γ lone draft steps.
    drafting = [
        max(i - v, 0.0) for i, v in zip(per_step["iteration"], per_step["verify"], strict=True)
    ]
    interference = [d - gamma * s for d, s in zip(drafting, per_step["draft"], strict=True)]
    result: dict[str, Any] = {
        "c": paired_ratio([d / gamma for d in drafting], per_step["target"]),
        "c_alone": paired_ratio(per_step["draft"], per_step["target"]),
        "verify_cost_ratio": paired_ratio(per_step["verify"], per_step["target"]),
        "interference_ms": statistics.median(interference),
        "iteration_ms": median["iteration"],
        "fixed_call_ms": fixed,
        "steps_per_call": steps_per_call,
        "block_step_ms": {k: median[f"block_{k}"] for k in block_sizes},
    }
    for name in ("target", "draft", "verify"):
        result[f"{name}_step_ms"] = median[name]
        result[f"{name}_step_ms_iqr"] = [
            float(np.percentile(per_step[name], 25)),
            float(np.percentile(per_step[name], 75)),
        ]
    return result
