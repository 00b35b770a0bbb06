"""The step timer: one cached decoder step timed in a loop of its own, as a slope in its length.

`time_decoder_steps` times the target's one-token step, the draft's step, the γ + 1-token verify
call and one speculative iteration's calls at a fixed decoder position, each as the slope between
a short and a long loop of steps (so the call's fixed cost cancels), interleaved round by round
(`clock.time_interleaved`). `step_costs` does it for a `models.SpeculativeEncoderDecoderModel` on
real inputs (caches built from the encoder inputs). The decode loops themselves pay more than
these lone loops (`timing.loops`); the eval job reports the loops' figures and keeps these beside
them ('step_timer', 'c_alone').
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import network, steps
from specdec_t5x.timing import clock

Array = jax.Array


def decoder_step(module: network.Transformer) -> Callable[..., Any]:
    """`steps.make_block_step` of `module` with the parameters and encoder tokens as arguments:
    `(params, encoder_input_tokens int32 [b, enc_len], tokens int32 [b, k], positions int32 [b],
    cache) -> (logits float32 [b, k, vocab], cache)`, so timed jitted calls take them as inputs
    rather than baking them in as constants."""

    def step(params, encoder_input_tokens, tokens, positions, cache):
        return steps.make_block_step(module, params, encoder_input_tokens)(tokens, positions, cache)

    return step


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
    make_caches: Callable[..., Any] | None = None,
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
      make_caches: `(target_args, draft_args) -> (target_cache, draft_cache)`, traced into the
        probe (each call builds its caches, a fixed cost the slopes remove; `target_cache` and
        `draft_cache` are then unused): no compilation besides the probe's own.

    Every loop is one branch of a single jitted probe (`_probe_program`: each loop's trip count
    an argument, all but one zero per call), so the timer compiles once.

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
    pos = jnp.full((batch,), position, jnp.int32)
    one = jnp.full((batch, 1), 5, jnp.int32)
    # Every loop's tokens: the target's and the draft's one-token steps, the verify block, the
    # k-token blocks; the iteration's are `one` and the verify block.
    tokens = {
        "target": one,
        "draft": one,
        "verify": jnp.full((batch, gamma + 1), 5, jnp.int32),
        **{f"block_{k}": jnp.full((batch, k), 5, jnp.int32) for k in block_sizes},
    }
    names = [*tokens, "iteration"]
    program = _probe_program(target_step, draft_step, gamma, names, make_caches)
    lengths = {"short": steps_per_call, "long": clock.LONG_LOOP * steps_per_call}
    caches = None if make_caches is not None else (target_cache, draft_cache)

    def call(name, length):
        counts = jnp.asarray([lengths[length] if n == name else 0 for n in names], jnp.int32)
        return lambda: program(target_args, draft_args, caches, tokens, pos, counts)

    samples = clock.time_interleaved(
        {(n, length): call(n, length) for n in names for length in lengths},
        repeats,
        warmup,
        shuffle=True,
    )
    span = lengths["long"] - lengths["short"]
    per_step = {
        name: [
            max((lo - sh) / span, clock.FLOOR_MS)
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
        "c": clock.paired_ratio([d / gamma for d in drafting], per_step["target"]),
        "c_alone": clock.paired_ratio(per_step["draft"], per_step["target"]),
        "verify_cost_ratio": clock.paired_ratio(per_step["verify"], per_step["target"]),
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


def _probe_program(target_step, draft_step, gamma: int, names, make_caches):
    """Jitted `(target_args, draft_args, caches, tokens, positions, counts int32 [len(names)]) ->
    float32 [batch]`: each loop of `names` run `counts[i]` times on its own copy of the caches
    (built by `make_caches` when given), one logit per step summed to keep the logits live."""
    target_loop, draft_loop = clock.loop(target_step), clock.loop(draft_step)
    iteration = clock.iterations(target_step, draft_step, gamma)

    def run(target_args, draft_args, caches, tokens, positions, counts):
        if make_caches is not None:
            caches = make_caches(target_args, draft_args)
        target_cache, draft_cache = caches
        total = jnp.zeros((positions.shape[0],), jnp.float32)
        for i, name in enumerate(names):
            if name == "iteration":
                out = iteration(
                    target_args, draft_args, tokens["target"], tokens["verify"], positions,
                    caches, counts[i],
                )[0]  # fmt: skip
            elif name == "draft":
                out = draft_loop(draft_args, tokens[name], positions, draft_cache, counts[i])[0]
            else:
                out = target_loop(target_args, tokens[name], positions, target_cache, counts[i])[0]
            total = total + out
        return total

    return jax.jit(run)


def packed(spec_model, target_params, draft_params):
    """(target params, draft params) packed for the CPU kernel (no-op when off or packed)."""
    weight_dtype = getattr(spec_model, "cpu_weight_dtype", "float32")
    target_params = steps.pack_params(spec_model.module, target_params, weight_dtype)
    draft = spec_model.draft
    if hasattr(draft, "pack_params"):
        draft_params = draft.pack_params(draft_params)
    return target_params, draft_params


def cache_builder(spec_model, max_decode_len: int) -> Callable[..., Any]:
    """Traceable `((target_params, enc), (draft_params, enc)) -> (target cache, draft cache)`."""
    module, draft = spec_model.module, spec_model.draft
    shares = getattr(draft, "shares_target_encoder", False)  # its cache reads the target's encoding

    def build(target_args, draft_args):
        (tp, enc), (dp, _) = target_args, draft_args
        encoded = steps.encode(module, tp, enc) if shares else None
        target_cache = steps.prepare_cache(module, tp, enc, max_decode_len)
        return target_cache, draft.init_cache(dp, enc, max_decode_len, encoded)

    return build


def caches(spec_model, target_params, draft_params, enc, max_decode_len):
    """(target cache, draft cache) of packed parameters for int32 [batch, enc_len] sources."""
    build = jax.jit(cache_builder(spec_model, max_decode_len))
    return build((target_params, enc), (draft_params, enc))


def step_costs(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array,
    max_decode_len: int,
    gamma: int,
    *,
    position: int = 8,
    repeats: int = 30,
    block_sizes=(),
) -> dict[str, Any]:
    """c, the verify-cost ratio and T(k) of a model pair, in one compiled probe.

    One cached target step, one draft step, one γ + 1 verify step and one target call per k in
    `block_sizes`, at decoder position `position`, caches built inside the probe from
    `encoder_input_tokens` (int32 [batch, enc_len]; a fixed cost per call, which the slopes
    remove); timed by `time_decoder_steps`.

    Returns:
      `time_decoder_steps`'s dict (`c`, `verify_cost_ratio`, `*_step_ms`,
      `block_step_ms`).
    """
    enc = jnp.asarray(encoder_input_tokens)
    target_params, draft_params = packed(spec_model, target_params, draft_params)  # no-op if so
    module, draft = spec_model.module, spec_model.draft

    def draft_step(dp, e, tokens, pos, cache):
        return draft.make_step(dp, e)(tokens, pos, cache)

    largest = max([gamma + 1, *block_sizes])
    return time_decoder_steps(
        decoder_step(module),
        (target_params, enc),
        None,
        draft_step,
        (draft_params, enc),
        None,
        batch=enc.shape[0],
        position=max(0, min(position, max_decode_len - largest)),
        gamma=gamma,
        repeats=repeats,
        block_sizes=tuple(block_sizes),
        make_caches=cache_builder(spec_model, max_decode_len),
    )
