"""The eval job's self-checks in argmax mode (temperature 0), where tokens must agree exactly.

* `near_ties`: each example whose speculative tokens differ from the baseline's gets a near-tie
  report (`reports.near_tie_report`: first differing position, the target's top-2 logit gap there).
  Speculative decoding in argmax mode returns the target's greedy tokens (Leviathan et al., 2022,
  §2.3), so a difference can only come from floating-point near ties between two numerically
  different but equivalent computations (one k-token verify call vs k one-token calls).
* `weight_flips`: with bfloat16-stored CPU weights, the greedy baseline is decoded again with the
  float32 weights (untimed) and every token the rounding flipped is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import models, reports


def near_ties(
    module, target_params, inputs: np.ndarray, baseline_tokens: Sequence, speculative_tokens
) -> list[dict[str, Any]]:
    """`{'example': index, **reports.near_tie_report(...)}` per example whose tokens differ.

    Args:
      module: the target network; target_params: its parameters (raw or packed).
      inputs: int32 [num_examples, enc_len] encoder inputs, zero-padded.
      baseline_tokens, speculative_tokens: int32 [max_decode_len] decodes per example.
    """
    return [
        {"example": idx, **reports.near_tie_report(module, target_params, inputs[idx], b, s)}
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
      `reports.weight_flip_report` per differing example, with its index}.
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
            **reports.weight_flip_report(
                module, float32_params, bfloat16_params, inputs[idx], a, b
            ),
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
