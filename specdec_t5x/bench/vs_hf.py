"""Side by side with Hugging Face assisted generation (needs torch + transformers, the [hf] extra).

`scripts/bench_vs_hf.py` runs `compare_with_hf` and writes `tables.hf_comparison_table`.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from specdec_t5x import inputs as inputs_lib
from specdec_t5x import metrics, models, steps
from specdec_t5x.bench import random_pair


def compare_with_hf(
    spec_model,
    target_params: Any,
    encoder_inputs: Sequence[np.ndarray],
    max_decode_len: int,
    gamma: int,
    work_dir: str | os.PathLike,
    draft_params: Any = None,
) -> dict[str, Any]:
    """Greedy decoding times: HF `generate` alone / with `assistant_model` vs ours alone / speculative.

    Both models are exported with `hf.export_hf` and loaded back with `hf.load_torch_model`, so
    the two implementations decode the very same weights and inputs (batch 1: HF's assisted
    generation supports no more). Per example the four decoders run in turn, the order rotating
    from one example to the next (load hits all alike); each pair is compared
    with its own baseline (speed-up = baseline time / accelerated time). HF's assistant uses
    `num_assistant_tokens=gamma` with a constant schedule and `assistant_confidence_threshold=0`
    (always γ drafts, like ours), and `generate` gets `decoder_attention_mask=ones((1, 1))`, the
    workaround for transformers 5.x re-feeding the assistant's decoder sequence. One
    warm-up pass (compilation for ours) is excluded.

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel` whose draft is a `drafts.T5Draft`.
      target_params: target parameters.
      encoder_inputs: int32 [enc_len_i] token arrays (EOS-terminated, unpadded).
      max_decode_len: generated-token budget (ours: decoder length; HF: max_new_tokens).
      gamma: draft tokens per iteration.
      work_dir: where the HF folders `target_hf/` and `draft_hf/` are written.
      draft_params: draft parameters (default `spec_model.draft.params`).

    Returns:
      dict: `hf_baseline_s`, `hf_assisted_s`, `ours_baseline_s`, `ours_speculative_s` (totals),
      `hf_speedup`, `ours_speedup`, token counts, exactness counts (`hf_assisted_equals_greedy`,
      `ours_speculative_equals_greedy`, `ours_equals_hf`), versions and thread counts.

    Raises:
      ValueError: the draft is not a T5 model.
      ImportError: torch or transformers missing.
    """
    import torch  # optional dependencies (the [hf] extra)
    import transformers

    from specdec_t5x import hf  # local: only this function needs it

    draft = spec_model.draft
    if not hasattr(draft, "module"):
        raise ValueError(f"HF assisted generation needs a T5 draft; got {type(draft).__name__}.")
    draft_params = draft.params if draft_params is None else draft_params
    work = pathlib.Path(work_dir)
    hf.export_hf(target_params, spec_model.module.config, work / "target_hf")
    hf.export_hf(draft_params, draft.module.config, work / "draft_hf")
    hf_target, hf_draft = (
        hf.load_torch_model(work / "target_hf"),
        hf.load_torch_model(work / "draft_hf"),
    )
    hf_draft.generation_config.num_assistant_tokens = gamma
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_draft.generation_config.assistant_confidence_threshold = 0.0
    eos = spec_model.eos_id

    greedy = {"temperature": 0.0, "topk": 0}
    base_model = models.EncoderDecoderModel(spec_model.module)
    ours_base = jax.jit(lambda p, b: base_model.predict_batch(p, b, decoder_params=greedy))
    ours_spec = jax.jit(
        lambda p, d, b: spec_model.predict_batch_with_aux(
            p, b, decoder_params={"gamma": gamma, "temperature": 0.0}, draft_params=d
        )[0]
    )
    enc_len = max(len(x) for x in encoder_inputs)
    # Packed once for the CPU kernel, as the eval job does (unchanged when it is off).
    packed, packed_draft = spec_model.pack_params(target_params), draft.pack_params(draft_params)

    def batch_of(tokens):
        return inputs_lib.decode_batch([tokens], enc_len, max_decode_len)

    def hf_generate(tokens, assisted: bool):
        ids = torch.tensor(np.asarray(tokens, np.int64)[None])
        extra = {
            "assistant_model": hf_draft,
            "decoder_attention_mask": torch.ones((1, 1), dtype=torch.long),
        }
        with torch.inference_mode():
            out = hf_target.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_decode_len,
                do_sample=False,
                num_beams=1,
                **(extra if assisted else {}),
            )
        return out[0, 1:].tolist()  # drop the decoder start token

    runs = {
        "hf_baseline": lambda t: hf_generate(t, False),
        "hf_assisted": lambda t: hf_generate(t, True),
        "ours_baseline": lambda t: np.asarray(ours_base(packed, batch_of(t)))[0].tolist(),
        "ours_speculative": lambda t: np.asarray(ours_spec(packed, packed_draft, batch_of(t)))[
            0
        ].tolist(),
    }
    for fn in runs.values():  # warm-up: compilation, first-call allocations
        fn(encoder_inputs[0])
    first = batch_of(encoder_inputs[0])
    for enc in steps.warmup_sources(packed, first["encoder_input_tokens"]):  # each length bucket
        warm = {**first, "encoder_input_tokens": enc}
        jax.block_until_ready((ours_base(packed, warm), ours_spec(packed, packed_draft, warm)))
    seconds = dict.fromkeys(runs, 0.0)
    tokens: dict[str, list[list[int]]] = {name: [] for name in runs}
    names = list(runs)
    # Interleaved example by example, the order rotating (HF first, then ours first, ...), so load
    # from other processes hits both implementations alike.
    for i, example in enumerate(encoder_inputs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            out = runs[name](example)
            seconds[name] += time.perf_counter() - start
            tokens[name].append(metrics.until_eos(out, eos))
    same = lambda a, b: sum(x == y for x, y in zip(tokens[a], tokens[b], strict=True))
    return {
        **{f"{name}_s": value for name, value in seconds.items()},
        "hf_speedup": seconds["hf_baseline"] / seconds["hf_assisted"],
        "ours_speedup": seconds["ours_baseline"] / seconds["ours_speculative"],
        "num_examples": len(encoder_inputs),
        "num_generated_tokens": sum(len(t) for t in tokens["ours_baseline"]),
        "hf_assisted_equals_greedy": same("hf_baseline", "hf_assisted"),
        "ours_speculative_equals_greedy": same("ours_baseline", "ours_speculative"),
        "ours_equals_hf": same("ours_baseline", "hf_baseline"),
        "gamma": gamma,
        "max_decode_len": max_decode_len,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "target_params": random_pair.count_params(target_params),
        "draft_params": random_pair.count_params(draft_params),
    }
