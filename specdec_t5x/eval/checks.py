"""The eval job's self-checks in argmax mode (temperature 0), where tokens must agree exactly.

* `near_ties`: each example whose speculative tokens differ from the baseline's gets a near-tie
  report (`near_tie_report`: first differing position, the target's top-2 logit gap there).
  Speculative decoding in argmax mode returns the target's greedy tokens (Leviathan et al., 2022,
  §2.3), so a difference can only come from floating-point near ties between two numerically
  different but equivalent computations (one k-token verify call vs k one-token calls).
* `weight_flips`: with bfloat16-stored CPU weights, the greedy baseline is decoded again with the
  float32 weights (untimed) and every token the rounding flipped is reported.

The same comparisons with bfloat16 activations and with the CPU kernel on and off were one-off
studies: experiments/bf16_near_ties and experiments/cpu_kernel_greedy_identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import models


def near_ties(
    module, target_params, inputs: np.ndarray, baseline_tokens: Sequence, speculative_tokens
) -> list[dict[str, Any]]:
    """`{'example': index, **near_tie_report(...)}` per example whose tokens differ.

    Args:
      module: the target network; target_params: its parameters (raw or packed).
      inputs: int32 [num_examples, enc_len] encoder inputs, zero-padded.
      baseline_tokens, speculative_tokens: int32 [max_decode_len] decodes per example.
    """
    return [
        {"example": idx, **near_tie_report(module, target_params, inputs[idx], b, s)}
        for idx, (b, s) in enumerate(zip(baseline_tokens, speculative_tokens, strict=True))
        if not np.array_equal(b, s)
    ]


def weight_flips(module, settings, float32_params, bfloat16_params, batches, tokens, inputs, rng):
    """The bfloat16-weight run's greedy baseline against float32 weights (untimed decodes).

    Args:
      module: target network; settings: the run's (greedy) decoder params.
      float32_params, bfloat16_params: the target with float32 / bfloat16 packed panels.
      batches: the job's `(n, batch)` list; tokens: the run's baseline tokens per example.
      inputs: int32 [enc_len] encoder inputs per example; rng: the job's base key.

    Returns:
      {'identical_fraction_vs_float32', 'num_flipped', 'max_float32_logit_gap', 'flips': one
      `weight_flip_report` per differing example, with its index}.
    """
    float32_model = models.EncoderDecoderModel(module, cpu_weight_dtype="float32")
    base_fn = jax.jit(
        lambda tp, b, r: float32_model.predict_batch_with_aux(tp, b, r, decoder_params=settings)[0]
    )
    reference = []
    for i, (n, batch) in enumerate(batches):
        out = base_fn(float32_params, batch, jax.random.fold_in(rng, i))
        reference += list(np.asarray(out)[:n])
    flips = [
        {
            "example": idx,
            **weight_flip_report(module, float32_params, bfloat16_params, inputs[idx], a, b),
        }
        for idx, (a, b) in enumerate(zip(reference, tokens, strict=True))
        if not np.array_equal(a, b)
    ]
    return {
        "identical_fraction_vs_float32": 1.0 - len(flips) / len(tokens),
        "num_flipped": len(flips),
        "max_float32_logit_gap": max((f["float32_logit_gap"] for f in flips), default=None),
        "flips": flips,
    }


def _teacher_forced_logits(module, params, encoder_input_tokens, tokens) -> np.ndarray:
    """float32 [len, vocab] logits of the full forward on int32 [len] `tokens` (shifted right)."""
    targets = jnp.asarray(tokens)[None]  # [1, len]
    dec_in = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # shifted right: start token 0
    return np.asarray(
        module.apply(
            {"params": params},
            jnp.asarray(encoder_input_tokens)[None],
            dec_in,
            jnp.ones_like(targets),
            enable_dropout=False,
        )[0]
    )


def near_tie_report(module, target_params, encoder_input_tokens, baseline, speculative_tokens):
    """Where greedy outputs differ: the first differing position and the target's top-2 gap there.

    Args:
      module: target network.
      target_params: its parameters.
      encoder_input_tokens: int32 [enc_len].
      baseline: int32 [max_decode_len] baseline greedy tokens.
      speculative_tokens: int32 [max_decode_len] speculative tokens (differing somewhere).

    Returns:
      dict with `position`, `baseline_token`, `speculative_token`, `top2_logit_gap` (float, logits
      units, computed with the teacher-forced full forward on the baseline prefix) and
      `speculative_is_runner_up`.
    """
    diff = np.nonzero(np.asarray(baseline) != np.asarray(speculative_tokens))[0]
    t = int(diff[0])
    logits = _teacher_forced_logits(module, target_params, encoder_input_tokens, baseline)[t]
    order = np.argsort(logits)
    top2 = logits[order[-2:]]
    return {
        "position": t,
        "baseline_token": int(baseline[t]),
        "speculative_token": int(speculative_tokens[t]),
        "top2_logit_gap": float(top2[1] - top2[0]),
        "speculative_is_runner_up": int(order[-2]) == int(speculative_tokens[t]),
    }


def weight_flip_report(
    module, float32_params, bfloat16_params, encoder_input_tokens, float32_tokens, bfloat16_tokens
):
    """What bfloat16-stored CPU weights flipped in a greedy decode (`CPU_WEIGHT_DTYPE='bfloat16'`).

    Both decodes share the prefix before the first differing position t; there the float32-weight
    model chose token a and the bfloat16-weight model token b. Each model's logits come from the
    teacher-forced full forward on its own decode.

    Args:
      module: target network.
      float32_params, bfloat16_params: its parameters with float32 / bfloat16 packed panels.
      encoder_input_tokens: int32 [enc_len].
      float32_tokens, bfloat16_tokens: int32 [max_decode_len] greedy decodes (differing somewhere).

    Returns:
      dict with `position` t, `float32_token` a, `bfloat16_token` b, `float32_logit_gap`
      (l32[a] - l32[b] >= 0: how far from a tie the float32 model was, logits units),
      `bfloat16_logit_gap` (l16[b] - l16[a] >= 0) and `bfloat16_is_float32_runner_up`.
    """
    diff = np.nonzero(np.asarray(float32_tokens) != np.asarray(bfloat16_tokens))[0]
    t = int(diff[0])
    a, b = int(float32_tokens[t]), int(bfloat16_tokens[t])
    l32 = _teacher_forced_logits(module, float32_params, encoder_input_tokens, float32_tokens)[t]
    l16 = _teacher_forced_logits(module, bfloat16_params, encoder_input_tokens, bfloat16_tokens)[t]
    return {
        "position": t,
        "float32_token": a,
        "bfloat16_token": b,
        "float32_logit_gap": float(l32[a] - l32[b]),
        "bfloat16_logit_gap": float(l16[b] - l16[a]),
        "bfloat16_is_float32_runner_up": int(np.argsort(l32)[-2]) == b,
    }
