"""Side by side with Hugging Face assisted generation (needs torch + transformers, the [hf] extra).

`scripts/bench_vs_hf.py` runs `compare_with_hf` and writes `tables.hf_comparison_table`. Per
implementation (HF `generate`, our samplers) one greedy baseline and its accelerated decoders:

* HF prompt lookup (`generate(prompt_lookup_num_tokens=γ)`, `PromptLookupCandidateGenerator`),
  always; HF with `assistant_model` where the experiment's draft is a T5 model;
* ours: speculative decoding (Algorithm 1) with the experiment's draft (T5, source copy, aligned
  copy, ...).

What HF's prompt lookup proposes for an encoder-decoder model (`PROMPT_LOOKUP_SOURCE`): its
`get_candidates(input_ids)` matches the last n-gram of `input_ids` inside `input_ids` and proposes
what followed; `_assisted_decoding` passes it the sequence being generated, and for an
encoder-decoder model `generate` sets that to the decoder's own prefix (decoder start token plus
the output so far). The encoder input is never searched: on a copy task it proposes only repeats
of its own output. `compare_with_hf` measures it: the length of `input_ids` at each example's first
lookup (1, the start token) and the drafts it proposes per target call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pathlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from benchmarks import random_pair
from specdec_t5x import inputs as inputs_lib
from specdec_t5x import metrics, models, steps
from specdec_t5x.timing import clock

PROMPT_LOOKUP_SOURCE = (
    "transformers/generation/candidate_generator.py, "
    "`PromptLookupCandidateGenerator.get_candidates` (n-gram windows over `input_ids`, "
    "candidates `input_ids[0, start_idx:end_idx]`), called as `get_candidates(input_ids)` from "
    "transformers/generation/utils.py `_assisted_decoding`, whose `input_ids` `generate` sets "
    "for an encoder-decoder model with `_prepare_decoder_input_ids_for_generation` (the decoder "
    "start token), then extends with the accepted output"
)


@dataclasses.dataclass(frozen=True)
class Method:
    """One decoder of the comparison.

    Attributes:
      name: result key, e.g. 'hf_prompt_lookup'.
      library: 'hf' or 'ours'.
      label: what it runs, for the table (e.g. 'prompt lookup, γ = 8, n-gram ≤ 3').
      baseline: `name` of the same library's greedy baseline; '' for a baseline itself.
    """

    name: str
    library: str
    label: str
    baseline: str = ""


def summarize(
    methods: Sequence[Method],
    seconds: Mapping[str, Sequence[float]],
    outputs: Mapping[str, Sequence[Sequence[int]]],
    target_calls: Mapping[str, Sequence[int]],
    proposed: Mapping[str, Sequence[int]],
    accepted: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    """Per-method totals, speed-ups against the method's own baseline and output equality.

    Args:
      methods: the decoders; every non-empty `baseline` names one of them.
      seconds: per method, seconds per example (float, one per example).
      outputs: per method, generated tokens per example up to and including EOS.
      target_calls: per method, target forward (decoder) calls per example.
      proposed: per method, draft tokens proposed per example (0 for a baseline).
      accepted: per method, draft tokens accepted per example.

    Returns:
      {'methods': [one dict per method: name, library, label, baseline, total_s,
      s_per_example, speedup (its baseline's total_s / its total_s; 1.0 for a baseline),
      target_calls, generated_tokens, tokens_per_target_call, proposed_per_call (draft tokens
      proposed per target call), acceptance (accepted / proposed, None when nothing was
      proposed), equals_baseline (examples whose output equals its baseline's)],
      'equal': {name: {other name: examples with equal outputs}}, 'num_examples'}.

    Raises:
      ValueError: an unknown baseline, a missing method, or lists of different lengths.
    """
    names = [m.name for m in methods]
    for m in methods:
        if m.baseline and m.baseline not in names:
            raise ValueError(f"method {m.name!r} has baseline {m.baseline!r}; known: {names}.")
    counts = {"seconds": seconds, "outputs": outputs, "target_calls": target_calls}
    counts.update(proposed=proposed, accepted=accepted)
    lengths = set()
    for field, values in counts.items():
        for name in names:
            if name not in values:
                raise ValueError(f"{field} has no entry for method {name!r}.")
            lengths.add(len(values[name]))
    if len(lengths) != 1:
        raise ValueError(f"every method needs one value per example; got lengths {lengths}.")
    (num_examples,) = lengths
    same = lambda a, b: sum(list(x) == list(y) for x, y in zip(outputs[a], outputs[b], strict=True))  # noqa: E731
    total_s = {name: float(sum(seconds[name])) for name in names}
    rows = []
    for m in methods:
        calls = int(sum(target_calls[m.name]))
        generated = int(sum(len(t) for t in outputs[m.name]))
        n_proposed, n_accepted = int(sum(proposed[m.name])), int(sum(accepted[m.name]))
        base = m.baseline or m.name
        rows.append(
            {
                **dataclasses.asdict(m),
                "total_s": total_s[m.name],
                "s_per_example": total_s[m.name] / max(num_examples, 1),
                "speedup": total_s[base] / total_s[m.name] if total_s[m.name] > 0 else None,
                "target_calls": calls,
                "generated_tokens": generated,
                "tokens_per_target_call": generated / calls if calls else None,
                "proposed_per_call": n_proposed / calls if calls else None,
                "acceptance": n_accepted / n_proposed if n_proposed else None,
                "equals_baseline": same(m.name, base),
            }
        )
    equal = {a: {b: same(a, b) for b in names} for a in names}
    return {"methods": rows, "equal": equal, "num_examples": num_examples}


@dataclasses.dataclass
class _HFCounts:
    """What the hooks count during one HF `generate` call."""

    target_calls: int = 0
    proposed: int = 0
    searched_lens: list[int] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _count_hf(hf_target, counts: list[_HFCounts]) -> Iterator[None]:
    """Counts `hf_target`'s forward calls and the candidates of HF's candidate generators into
    `counts[-1]` (append a fresh `_HFCounts` before each call). The encoder runs through
    `get_encoder()`, not the model's forward: one forward = one decoder (target) call."""
    from transformers.generation import candidate_generator as hf_candidates

    def on_forward(*_):
        counts[-1].target_calls += 1

    def counting(method):
        @functools.wraps(method)
        def wrapped(self, input_ids, *args, **kwargs):
            candidate_ids, candidate_logits = method(self, input_ids, *args, **kwargs)
            counts[-1].proposed += int(candidate_ids.shape[1] - input_ids.shape[1])
            counts[-1].searched_lens.append(int(input_ids.shape[1]))
            return candidate_ids, candidate_logits

        return wrapped

    classes = (
        hf_candidates.PromptLookupCandidateGenerator,
        hf_candidates.AssistedCandidateGenerator,
    )
    originals = [cls.__dict__["get_candidates"] for cls in classes]
    handle = hf_target.register_forward_pre_hook(on_forward)
    try:
        for cls, original in zip(classes, originals, strict=True):
            cls.get_candidates = counting(original)
        yield
    finally:
        handle.remove()
        for cls, original in zip(classes, originals, strict=True):
            cls.get_candidates = original


def compare_with_hf(
    spec_model,
    target_params: Any,
    encoder_inputs: Sequence[np.ndarray],
    max_decode_len: int,
    gamma: int,
    work_dir: str | os.PathLike,
    draft_params: Any = None,
    draft_name: str | None = None,
    prompt_lookup_max_ngram: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Greedy decoding side by side: HF `generate` (alone, prompt lookup, T5 assistant) vs ours.

    The target (and a T5 draft) are exported with `hf.export_hf` and loaded back with
    `hf.load_torch_model`, so both implementations decode the very same weights and inputs
    (batch 1: HF's assisted generation supports no more). Per example every decoder runs once,
    in an order drawn by `clock.call_order` (load from other processes hits all alike); each
    accelerated decoder is compared with its own library's greedy baseline (speed-up =
    baseline time / its time). HF's prompt lookup gets `prompt_lookup_num_tokens=γ` and
    `max_matching_ngram_size` = `prompt_lookup_max_ngram`; HF's assistant
    `num_assistant_tokens=γ`, a constant schedule and `assistant_confidence_threshold=0` (always
    γ drafts, like ours). Assisted calls get `decoder_attention_mask=ones((1, 1))`, the workaround
    for transformers 5.x re-feeding the assistant's decoder sequence. One warm-up pass per
    decoder (compilation for ours) and one per encoder length bucket are excluded.

    Counted per call: HF target calls by a forward pre-hook on the target (the encoder runs
    outside its forward), HF drafts proposed by wrapping the candidate generators'
    `get_candidates`; HF drafts accepted = generated tokens - target calls (each call adds the
    accepted drafts plus one token of the target's). Ours: `speculative.SpeculativeStats`
    (`num_iterations`, `num_proposed`, `num_accepted`); our baseline makes one target call per
    generated token (it is not counted).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel` (any draft; a `drafts.T5Draft` also
        runs HF's `assistant_model`).
      target_params: target parameters.
      encoder_inputs: int32 [enc_len_i] token arrays (EOS-terminated, unpadded).
      max_decode_len: generated-token budget (ours: decoder length; HF: max_new_tokens).
      gamma: draft tokens per iteration (HF: `prompt_lookup_num_tokens` and
        `num_assistant_tokens`).
      work_dir: where the HF folders `target_hf/` and `draft_hf/` are written.
      draft_params: draft parameters (default `spec_model.draft.params`).
      draft_name: label of our draft (default its class name).
      prompt_lookup_max_ngram: HF's `max_matching_ngram_size` (default: the draft's
        `max_ngram` if it has one, else HF's default 2).
      seed: seed of the call order.

    Returns:
      `summarize`'s dict plus `gamma`, `max_decode_len`, `prompt_lookup_max_ngram`,
      `num_generated_tokens` and `num_without_eos` (our baseline's outputs that reached
      `max_decode_len` without EOS), `encoder_len_mean`, `hf_lookup_first_searched_len`
      (distinct `input_ids` lengths at each example's first prompt lookup), `per_example_s`
      ({method: seconds per example, in example order}), `prompt_lookup_source`,
      versions, thread count and parameter counts.

    Raises:
      ValueError: gamma < 1, no encoder inputs, or a bad `prompt_lookup_max_ngram`.
      ImportError: torch or transformers missing.
    """
    import torch  # optional dependencies (the [hf] extra)
    import transformers

    from specdec_t5x import hf  # local: only this function needs it

    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1; got {gamma!r}.")
    if not encoder_inputs:
        raise ValueError("encoder_inputs is empty; need at least one example.")
    draft = spec_model.draft
    draft_params = draft.params if draft_params is None else draft_params
    ngram = prompt_lookup_max_ngram or getattr(draft, "max_ngram", None) or 2
    if int(ngram) != ngram or ngram < 1:
        raise ValueError(f"prompt_lookup_max_ngram must be an int >= 1; got {ngram!r}.")
    has_t5_draft = hasattr(draft, "module")
    draft_name = draft_name or type(draft).__name__
    work = pathlib.Path(work_dir)
    hf.export_hf(target_params, spec_model.module.config, work / "target_hf")
    hf_target = hf.load_torch_model(work / "target_hf")
    hf_draft = None
    if has_t5_draft:
        hf.export_hf(draft_params, draft.module.config, work / "draft_hf")
        hf_draft = hf.load_torch_model(work / "draft_hf")
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
        )
    )
    enc_len = max(len(x) for x in encoder_inputs)
    # Packed once for the CPU kernel, as the eval job does (unchanged when it is off).
    packed, packed_draft = spec_model.pack_params(target_params), draft.pack_params(draft_params)

    def batch_of(tokens):
        return inputs_lib.decode_batch([tokens], enc_len, max_decode_len)

    counts: list[_HFCounts] = [_HFCounts()]

    def hf_generate(tokens, **extra):
        ids = torch.tensor(np.asarray(tokens, np.int64)[None])
        with torch.inference_mode():
            out = hf_target.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_decode_len,
                do_sample=False,
                num_beams=1,
                **extra,
            )
        c = counts[-1]
        tokens_out = metrics.until_eos(out[0, 1:].tolist(), eos)  # start token dropped
        return tokens_out, c.target_calls, c.proposed, max(len(tokens_out) - c.target_calls, 0)

    def ours_baseline(tokens):
        out = metrics.until_eos(np.asarray(ours_base(packed, batch_of(tokens)))[0], eos)
        return out, len(out), 0, 0

    def ours_speculative(tokens):
        decodes, aux = ours_spec(packed, packed_draft, batch_of(tokens))
        out, stats = metrics.until_eos(np.asarray(decodes)[0], eos), jax.device_get(aux["stats"])
        calls, n_proposed = int(stats.num_iterations[0]), int(stats.num_proposed[0])
        return out, calls, n_proposed, int(stats.num_accepted[0])

    lookup = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": int(ngram)}
    methods = [
        Method("hf_baseline", "hf", "greedy"),
        Method(
            "hf_prompt_lookup", "hf", f"prompt lookup, γ = {gamma}, n-gram ≤ {ngram}", "hf_baseline"
        ),
    ]
    runs = {"hf_baseline": hf_generate, "hf_prompt_lookup": lambda t: hf_generate(t, **lookup)}
    if has_t5_draft:
        methods.append(
            Method(
                "hf_assisted", "hf", f"assistant_model ({draft_name}), γ = {gamma}", "hf_baseline"
            )
        )
        mask = torch.ones((1, 1), dtype=torch.long)
        runs["hf_assisted"] = lambda t: hf_generate(
            t, assistant_model=hf_draft, decoder_attention_mask=mask
        )
    methods += [
        Method("ours_baseline", "ours", "greedy"),
        Method(
            "ours_speculative", "ours", f"speculative, {draft_name}, γ = {gamma}", "ours_baseline"
        ),
    ]
    runs.update(ours_baseline=ours_baseline, ours_speculative=ours_speculative)

    names = [m.name for m in methods]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[list[int]]] = {name: [] for name in names}
    calls: dict[str, list[int]] = {name: [] for name in names}
    proposed: dict[str, list[int]] = {name: [] for name in names}
    accepted: dict[str, list[int]] = {name: [] for name in names}
    first_searched: set[int] = set()
    with _count_hf(hf_target, counts):
        for fn in runs.values():  # warm-up: compilation, first-call allocations
            fn(encoder_inputs[0])
        first = batch_of(encoder_inputs[0])
        for enc in steps.warmup_sources(packed, first["encoder_input_tokens"]):  # each bucket
            warm = {**first, "encoder_input_tokens": enc}
            jax.block_until_ready((ours_base(packed, warm), ours_spec(packed, packed_draft, warm)))
        for i, example in enumerate(encoder_inputs):
            for name in clock.call_order(names, i, seed=seed):
                counts.append(_HFCounts())
                start = time.perf_counter()
                out, n_calls, n_proposed, n_accepted = runs[name](example)
                seconds[name].append(time.perf_counter() - start)
                outputs[name].append(out)
                calls[name].append(n_calls)
                proposed[name].append(n_proposed)
                accepted[name].append(n_accepted)
                if name == "hf_prompt_lookup" and counts[-1].searched_lens:
                    first_searched.add(counts[-1].searched_lens[0])
    result = summarize(methods, seconds, outputs, calls, proposed, accepted)
    return {
        **result,
        "gamma": int(gamma),
        "max_decode_len": max_decode_len,
        "prompt_lookup_max_ngram": int(ngram),
        "draft_name": draft_name,
        "num_generated_tokens": sum(len(t) for t in outputs["ours_baseline"]),
        "num_without_eos": sum(eos not in t for t in outputs["ours_baseline"]),
        "encoder_len_mean": float(np.mean([len(x) for x in encoder_inputs])),
        "hf_lookup_first_searched_len": sorted(first_searched),
        "per_example_s": seconds,
        "prompt_lookup_source": PROMPT_LOOKUP_SOURCE,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "target_params": random_pair.count_params(target_params),
        "draft_params": random_pair.count_params(draft_params),
    }
