"""What is not a model call: the per-call set-up (encoder pass, cache set-up) and the decode
loops' own work (sampling, acceptance, bookkeeping), timed with zero-cost models (`clock.zero_cost_decode`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x import speculative, steps
from specdec_t5x.timing import clock

Array = jax.Array


def measure_setup_ms(spec_model, target_params, draft_params, encoder_input_tokens: Array,
                     max_decode_len: int, repeats: int = 20) -> dict[str, float]:  # fmt: skip
    """Medians (ms) of the target's and the draft's encoder pass + cache set-up, one call each
    (whole batch), at the input's length bucket (`steps.bucketed`).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel` (a draft sharing the target's encoder
        is timed from the target's encoder output); target_params, draft_params: as timed.
      encoder_input_tokens: int32 [batch, enc_len]; max_decode_len: cache length; repeats:
        `clock.time_interleaved` rounds.

    Returns:
      {'target_setup_ms', 'draft_setup_ms'}.
    """
    enc = jnp.asarray(encoder_input_tokens)
    target = jax.jit(lambda tp, e: spec_model.decoder_state(tp, e, max_decode_len)[0])
    calls = {"target": lambda: target(target_params, enc)}
    if getattr(spec_model.draft, "shares_target_encoder", False):
        # The draft's set-up is its cache from the target's encoder output (computed anyway).
        x = jax.jit(lambda tp, e: steps.encode(spec_model.module, tp, e))(target_params, enc)
        draft = jax.jit(lambda dp, e, x: spec_model.draft.prepare(dp, e, max_decode_len, x)[0])
        calls["draft"] = lambda: draft(draft_params, enc, x)
    else:
        draft = jax.jit(lambda dp, e: spec_model.draft.prepare(dp, e, max_decode_len)[0])
        calls["draft"] = lambda: draft(draft_params, enc)
    samples = clock.time_interleaved(calls, repeats)
    return {f"{k}_setup_ms": statistics.median(v) for k, v in samples.items()}


def measure_loop_ms(batch: int, vocab: int, max_decode_len: int, gamma: int,
                    settings: Mapping[str, Any], eos_id: int, repeats: int = 20,
                    verification: str = "token", baseline_sampler: str = "t5x") -> dict[str, float]:  # fmt: skip
    """The decode loops' own work (sampling, acceptance, bookkeeping; no model cost), in ms.

    `decoding.temperature_sample` and `speculative.speculative_sample` with zero-cost models
    (`clock.zero_cost_decode`: every draft accepted, no EOS) for max_decode_len and half as many
    tokens: the slope is the work per token / iteration, the intercept the fixed part per call.

    Args:
      batch, vocab, max_decode_len: decode shapes; gamma: γ; settings: {'temperature', 'topk',
        'topp'}; eos_id; repeats: interleaved rounds; verification: 'token' or 'block';
        baseline_sampler: the baseline's draw (`decoding.SAMPLERS`).

    Returns:
      {'baseline_per_token_ms', 'baseline_fixed_ms', 'speculative_per_iteration_ms',
      'speculative_fixed_ms'}.
    """
    lengths = (max_decode_len, max(1, max_decode_len // 2))
    shapes = dict(batch=batch, vocab=vocab, max_decode_len=max_decode_len, eos_id=eos_id)
    base = lambda n: clock.zero_cost_decode(
        None, max_decode_steps=n, settings=settings, baseline_sampler=baseline_sampler, **shapes
    )
    spec = lambda n: clock.zero_cost_decode(
        speculative.speculative_sample, gamma, max_decode_steps=n, settings=settings,
        verification=verification, **shapes,
    )  # fmt: skip

    calls = {("base", n): base(n) for n in lengths} | {("spec", n): spec(n) for n in lengths}
    ms = {k: statistics.median(v) for k, v in clock.time_interleaved(calls, repeats).items()}
    units = {"base": {n: n for n in lengths}, "spec": {n: -(-n // (gamma + 1)) for n in lengths}}
    out = {}  # all drafts accepted: a call of n tokens takes ceil(n / (γ + 1)) iterations
    for name, slope_key, fixed_key in (
        ("base", "baseline_per_token_ms", "baseline_fixed_ms"),
        ("spec", "speculative_per_iteration_ms", "speculative_fixed_ms"),
    ):
        (n1, n2), u = lengths, units[name]
        slope = max((ms[(name, n1)] - ms[(name, n2)]) / max(u[n1] - u[n2], 1), 0.0)
        out[slope_key] = slope
        out[fixed_key] = max(ms[(name, n1)] - slope * u[n1], 0.0)
    return out
