"""The step timer: each cached decoder call timed in a loop of its own, as a slope in its length.

The decode loops pay more than these lone loops (`timing.loops`); the eval job reports the loops'
figures when it has them and keeps the timer's beside them ('step_timer', 'c_alone').
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
    """`steps.make_block_step` of `module` taking its parameters as arguments (not jit constants):
    `(params, encoder_input_tokens int32 [b, enc_len], tokens int32 [b, k], positions int32 [b],
    cache) -> (logits float32 [b, k, vocab], cache)`."""

    def step(params, encoder_input_tokens, tokens, positions, cache):
        return steps.make_block_step(module, params, encoder_input_tokens)(tokens, positions, cache)

    return step


def time_decoder_steps(target_step, target_args, target_cache, draft_step, draft_args,
                       draft_cache, *, batch: int, position: int, gamma: int, repeats: int = 30,
                       warmup: int = 3, steps_per_call: int = 8, block_sizes: Sequence[int] = (),
                       make_caches: Callable[..., Any] | None = None,
                       budget_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """c and the verify-cost ratio of two decoder steps, each timed inside loops, in one program.

    Each loop (the target's one-token step, the draft's step, the γ + 1-token verify call, a
    k-token call per `block_sizes`, and one iteration's model calls: γ draft steps then the verify
    call) runs `steps_per_call` and `LONG_LOOP` times as many steps in the same shuffled round;
    per step = the slope between them, so a call's fixed cost (dispatch, ~one target step on the
    2-core CPU) cancels. The draft's cost between verify calls (evicted from the CPU's caches by
    the target's weights) is the iteration's: `c` = (iteration - verify) / (γ T(1)), `c_alone` the
    draft's lone loop, `interference_ms` = iteration - verify - γ lone draft steps.

    Args:
      target_step, draft_step: `(*args, tokens int32 [batch, k], positions int32 [batch], cache)
        -> (logits float32 [batch, k, vocab], cache)`, traceable.
      target_args, draft_args: their leading arguments; target_cache, draft_cache: the caches
        (unused with `make_caches`: `(target_args, draft_args) -> caches`, traced into the probe).
      batch: rows; position: decoder position of the timed steps; gamma: γ >= 1.
      repeats, warmup, budget_s: `clock.time_interleaved`'s (rounds timed: 'repeats' in the
        result); steps_per_call: the short loop, >= 1.
      block_sizes: target block sizes k also timed (the cost curve's T(k)).

    Returns:
      {'target_step_ms', 'draft_step_ms', 'verify_step_ms', 'iteration_ms' (median ms per step),
      '*_step_ms_iqr' ([p25, p75] ms), 'fixed_call_ms' {loop: ms}, 'interference_ms' (ms per
      iteration), 'c', 'c_alone', 'verify_cost_ratio' (`clock.paired_ratio`s against the target
      step), 'steps_per_call', 'block_step_ms' {k: ms}}.

    Raises:
      ValueError: gamma < 1 or steps_per_call < 1.
    """
    if gamma < 1 or steps_per_call < 1:
        raise ValueError(f"need gamma >= 1 and steps_per_call >= 1; got {gamma}, {steps_per_call}.")
    pos = jnp.full((batch,), position, jnp.int32)
    one = jnp.full((batch, 1), 5, jnp.int32)
    block = lambda k: jnp.full((batch, k), 5, jnp.int32)
    # Every loop's tokens (the iteration's: `one` and the verify block).
    tokens = {"target": one, "draft": one, "verify": block(gamma + 1)}
    tokens.update({f"block_{k}": block(k) for k in block_sizes})
    names = [*tokens, "iteration"]
    program = _probe_program(target_step, draft_step, gamma, names, make_caches)
    lengths = {"short": steps_per_call, "long": clock.LONG_LOOP * steps_per_call}
    caches = None if make_caches is not None else (target_cache, draft_cache)

    def call(name, length):
        counts = jnp.asarray([lengths[length] if n == name else 0 for n in names], jnp.int32)
        return lambda: program(target_args, draft_args, caches, tokens, pos, counts)

    calls = {(n, length): call(n, length) for n in names for length in lengths}
    samples = clock.time_interleaved(calls, repeats, warmup, shuffle=True, budget_s=budget_s)
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
        "repeats": len(samples[names[0], "long"]),
        "block_step_ms": {k: median[f"block_{k}"] for k in block_sizes},
    }
    for name in ("target", "draft", "verify"):
        result[f"{name}_step_ms"] = median[name]
        result[f"{name}_step_ms_iqr"] = [float(np.percentile(per_step[name], q)) for q in (25, 75)]
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


def step_costs(spec_model, target_params, draft_params, encoder_input_tokens: Array,
               max_decode_len: int, gamma: int, *, position: int = 8, repeats: int = 30,
               block_sizes=(), budget_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """`time_decoder_steps` of a `models.SpeculativeEncoderDecoderModel` pair (parameters raw or
    packed), caches built inside the probe from `encoder_input_tokens` (int32 [batch, enc_len]),
    steps at `position` (moved down so that the largest block fits in `max_decode_len`)."""
    enc = jnp.asarray(encoder_input_tokens)
    target_params, draft_params = packed(spec_model, target_params, draft_params)  # no-op if so
    module, draft = spec_model.module, spec_model.draft

    def draft_step(dp, e, tokens, pos, cache):
        return draft.make_step(dp, e)(tokens, pos, cache)

    largest = max([gamma + 1, *block_sizes])
    return time_decoder_steps(
        decoder_step(module), (target_params, enc), None, draft_step, (draft_params, enc), None,
        batch=enc.shape[0], position=max(0, min(position, max_decode_len - largest)),
        gamma=gamma, repeats=repeats, block_sizes=tuple(block_sizes),
        make_caches=cache_builder(spec_model, max_decode_len), budget_s=budget_s,
    )  # fmt: skip
