"""The eval job's self-checks in argmax mode (temperature 0), where tokens must agree exactly.

* `near_ties`: each example whose speculative tokens differ from the baseline's gets a near-tie
  report (`near_tie_report`: first differing position, the target's top-2 logit gap there).
  Speculative decoding in argmax mode returns the target's greedy tokens (Leviathan et al., 2022,
  §2.3), so a difference can only come from floating-point near ties between two numerically
  different but equivalent computations (one k-token verify call vs k one-token calls).
* `weight_flips`: with bfloat16-stored CPU weights, the greedy baseline is decoded again with the
  float32 weights (untimed) and every token the rounding flipped is reported.

Checks run by scripts: `greedy_flip_report` / `flip_table` (bfloat16 activations,
`scripts/bf16_near_ties.py`) and `kernel_greedy_identity` (CPU kernel on/off,
`scripts/check_cpu_kernel.py`).
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


def _decode_batch(examples, input_len: int, target_len: int) -> dict[str, Any]:
    """One batch of all `examples` (encoder inputs zero-padded/cut to input_len)."""
    enc = np.zeros((len(examples), input_len), np.int32)
    for i, ex in enumerate(examples):
        inputs = np.asarray(ex["inputs"])[:input_len]
        enc[i, : len(inputs)] = inputs
    return {
        "encoder_input_tokens": jnp.asarray(enc),
        "decoder_input_tokens": jnp.zeros((len(examples), target_len), jnp.int32),
    }


def greedy_flip_report(spec_model, target_params, gamma: int, examples, input_len, target_len):
    """Greedy baseline vs greedy speculative decodes of `examples` in one batch, and what differs.

    Used with bfloat16 activations (`scripts/bf16_near_ties.py`): each differing example gets a
    `near_tie_report` plus the bfloat16 spacing at the top logit there.

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel` (its draft's own params are used).
      target_params: target parameters; gamma: γ.
      examples: dicts with 'inputs' (int32 token ids); input_len, target_len: batch shapes.

    Returns:
      {'identical_fraction', 'num_differing', 'largest_flipped_top2_gap', 'flips'}.
    """
    baseline_model = models.EncoderDecoderModel(spec_model.module)
    batch = _decode_batch(examples, input_len, target_len)
    enc = np.asarray(batch["encoder_input_tokens"])
    greedy = {"temperature": 0.0}
    baseline = jax.jit(
        lambda p, b: baseline_model.predict_batch_with_aux(p, b, decoder_params=greedy)[0]
    )(target_params, batch)
    spec = jax.jit(
        lambda p, dp, b: spec_model.predict_batch_with_aux(
            p, b, decoder_params={**greedy, "gamma": int(gamma)}, draft_params=dp
        )[0]
    )(target_params, spec_model.draft.params, batch)
    baseline, spec = np.asarray(baseline), np.asarray(spec)
    flips = []
    for i in np.flatnonzero((baseline != spec).any(-1)):
        report = near_tie_report(spec_model.module, target_params, enc[i], baseline[i], spec[i])
        logits = spec_model.module.apply(
            {"params": target_params},
            enc[i : i + 1],
            np.pad(baseline[i : i + 1, :-1], ((0, 0), (1, 0))),
            np.ones_like(baseline[i : i + 1]),
            enable_dropout=False,
        )[0, report["position"]]
        top = float(jnp.max(logits))
        report["bf16_spacing_at_top_logit"] = float(2.0 ** (np.floor(np.log2(abs(top))) - 7))
        flips.append({"example": int(i), **report})
    return {
        "identical_fraction": float(np.mean((baseline == spec).all(-1))),
        "num_differing": len(flips),
        "largest_flipped_top2_gap": max((f["top2_logit_gap"] for f in flips), default=None),
        "flips": flips,
    }


def flip_table(result) -> str:
    """Markdown table of `{'settings': {name: greedy_flip_report(...)}, provenance...}`."""
    lines = [
        "| setting | identical | differing | largest flipped top-2 gap |",
        "|---|---|---|---|",
    ]
    for name, r in result["settings"].items():
        gap = r["largest_flipped_top2_gap"]
        lines.append(
            f"| {name} | {r['identical_fraction']:.3f} | {r['num_differing']} | "
            f"{'-' if gap is None else f'{gap:.4f}'} |"
        )
    lines += ["", f"command: `{result['command']}`", f"commit: {result['commit']}"]
    lines += [f"date: {result['date']}", f"hardware: {result['hardware']}"]
    return "\n".join(lines) + "\n"


def kernel_greedy_identity(spec_model, raw_params, examples, gamma: int) -> dict[str, Any]:
    """Greedy decodes with and without the CPU matmul kernel, against the kernel-off baseline.

    Variants (batch 1, input/target length 64): 'xla' (`SPECDEC_CPU_KERNEL=0`, the reference),
    'kernel_float32', 'kernel_bfloat16' (packed weights) and 'kernel_speculative' (float32 panels,
    the packed draft, γ = gamma).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`; raw_params: unpacked target params.
      examples: dicts with 'inputs'; gamma: γ of the speculative variant.

    Returns:
      {'num_examples', 'variants': {name: {'identical', 'differing': [{'example',
      'first_position'}]}}}.
    """
    from specdec_t5x import cpu_kernel  # local: the kernel package loads its extension

    base = models.EncoderDecoderModel(spec_model.module)
    greedy = {"temperature": 0.0, "topk": 0}
    variants = {"xla": (raw_params, None)}
    for dtype in ("float32", "bfloat16"):
        packed = models.pack_params(spec_model.module, raw_params, dtype)
        variants[f"kernel_{dtype}"] = (packed, None)
    draft_params = spec_model.draft.pack_params(spec_model.draft.params)
    variants["kernel_speculative"] = (variants["kernel_float32"][0], draft_params)
    base_fn = jax.jit(lambda tp, b: base.predict_batch_with_aux(tp, b, decoder_params=greedy)[0])
    spec_fn = jax.jit(
        lambda tp, dp, b: spec_model.predict_batch_with_aux(
            tp, b, decoder_params={**greedy, "gamma": gamma}, draft_params=dp
        )[0]
    )
    tokens = {name: [] for name in variants}
    for ex in examples:
        batch = _decode_batch([ex], 64, 64)
        for name, (tp, dp) in variants.items():
            with cpu_kernel.env_setting(name != "xla"):  # jit traces under this setting
                out = base_fn(tp, batch) if dp is None else spec_fn(tp, dp, batch)
            tokens[name].append(np.asarray(out)[0])
    ref = tokens["xla"]
    result = {"num_examples": len(examples), "variants": {}}
    for name, toks in tokens.items():
        diffs = [
            {"example": i, "first_position": int(np.nonzero(a != b)[0][0])}
            for i, (a, b) in enumerate(zip(toks, ref, strict=True))
            if not np.array_equal(a, b)
        ]
        result["variants"][name] = {"identical": len(toks) - len(diffs), "differing": diffs}
    return result


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
