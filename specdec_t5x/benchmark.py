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

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import models, network, steps


@dataclasses.dataclass
class _Decoder:
    """A randomly initialised model, its encoder inputs, a fresh cache and its jitted step."""

    params: Any
    encoder_input_tokens: jax.Array  # int32 [batch, enc_len]
    cache: Any
    step: Any  # (params, enc_tokens, tokens [b, k], positions [b], cache) -> (logits, cache)


def _random_decoder(config: network.T5Config, batch: int, enc_len: int, max_len: int, seed: int):
    module = network.Transformer(config)
    params = random_params(module, seed)
    key = jax.random.PRNGKey(seed + 1)
    tokens = jax.random.randint(key, (batch, enc_len), 2, config.vocab_size).astype(jnp.int32)

    def new_cache(params, tokens):
        return steps.prepare_cache(module, params, tokens, max_len)

    def step(params, encoder_input_tokens, tokens, positions, cache):
        return steps.make_block_step(module, params, encoder_input_tokens)(tokens, positions, cache)

    cache = jax.jit(new_cache)(params, tokens)
    return _Decoder(params, tokens, cache, jax.jit(step, donate_argnums=(4,)))


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


def _config_dict(config: network.T5Config) -> dict[str, Any]:
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
        target_config=_config_dict(target_config),
        draft_config=_config_dict(draft_config),
        jax_backend=jax.default_backend(),
    )
    return result


def time_interleaved(
    calls: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Milliseconds per call: compiled and warmed up first, then rounds in rotating order.

    Args:
      calls: name -> zero-argument function returning arrays (blocked on with
        `jax.block_until_ready`).
      repeats: timed rounds; each round times every call once.
      warmup: untimed rounds after the first (compiling) one.

    Returns:
      name -> list of `repeats` wall-clock durations in milliseconds.
    """
    names = list(calls)

    def run(name: str) -> float:
        start = time.perf_counter()
        jax.block_until_ready(calls[name]())
        return (time.perf_counter() - start) * 1e3

    for _ in range(warmup + 1):  # the first round compiles
        for name in names:
            run(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(run(name))
    return samples


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
    """c and the verify-cost ratio of two decoder steps, timed side by side *inside a loop*.

    Each timed call runs `steps_per_call` steps in one jitted `lax.fori_loop` with the cache as
    the loop carry, as in the decode loops; the per-step time is the call's time divided by
    `steps_per_call`. (Timing one jitted call per step adds a fixed dispatch overhead of ~0.7 ms
    on CPU, which biases c up and the verify ratio down; see results/verify_cost/.)

    Args:
      target_step, draft_step: `(*args, tokens int32 [batch, k], positions int32 [batch], cache)
        -> (logits, cache)` (traceable; may already be jitted).
      target_args, draft_args: leading arguments (e.g. params, encoder tokens).
      target_cache, draft_cache: caches to start from (copied; each timed call chains its own).
      batch: rows; position: decoder position of the timed steps; gamma: verify block is γ + 1.
      repeats, warmup: see `time_interleaved`.
      steps_per_call: steps per timed call.
      block_sizes: extra target block sizes k to time in the same rounds (the cost curve T(k)).

    Returns:
      dict with `target_step_ms`, `draft_step_ms`, `verify_step_ms` (medians per step),
      `*_step_ms_iqr` ([p25, p75]), `c` = draft / target, `verify_cost_ratio` = verify / target,
      `steps_per_call`, and `block_step_ms` {k: median ms of a k-token target call}.
    """

    def looped(step):
        def run(args, tokens, positions, cache):
            def body(_, carry):
                cache, total = carry
                logits, cache = step(*args, tokens, positions, cache)
                return cache, total + logits[:, -1, 0]  # keeps the logits live

            total = jnp.zeros((tokens.shape[0],), jnp.float32)
            cache, total = jax.lax.fori_loop(0, steps_per_call, body, (cache, total))
            return total, cache

        return jax.jit(run, donate_argnums=(3,))

    target_step, draft_step = looped(target_step), looped(draft_step)
    pos = jnp.full((batch,), position, jnp.int32)
    one = jnp.full((batch, 1), 5, jnp.int32)
    block = jnp.full((batch, gamma + 1), 5, jnp.int32)
    setups = {
        "target": (target_step, target_args, one, target_cache),
        "draft": (draft_step, draft_args, one, draft_cache),
        "verify": (target_step, target_args, block, target_cache),
        **{
            f"block_{k}": (
                target_step,
                target_args,
                jnp.full((batch, k), 5, jnp.int32),
                target_cache,
            )
            for k in block_sizes
        },
    }
    caches = {k: jax.tree_util.tree_map(jnp.copy, v[3]) for k, v in setups.items()}

    def call(name):
        step, args, tokens, _ = setups[name]

        def run():
            total, caches[name] = step(args, tokens, pos, caches[name])
            return total, caches[name]

        return run

    samples = time_interleaved({k: call(k) for k in setups}, repeats, warmup)
    samples = {k: [v / steps_per_call for v in values] for k, values in samples.items()}
    median = {name: statistics.median(values) for name, values in samples.items()}
    result: dict[str, Any] = {
        "c": median["draft"] / median["target"],
        "verify_cost_ratio": median["verify"] / median["target"],
        "steps_per_call": steps_per_call,
        "block_step_ms": {k: median[f"block_{k}"] for k in block_sizes},
    }
    for name, values in samples.items():
        if name.startswith("block_"):
            continue
        result[f"{name}_step_ms"] = median[name]
        result[f"{name}_step_ms_iqr"] = [
            float(np.percentile(values, 25)),
            float(np.percentile(values, 75)),
        ]
    return result


# ----------------------------------------------------------------------------------------------
# Provenance and output.


def git_commit(repo: str | os.PathLike = ".") -> str:
    """HEAD commit, with '-dirty' when tracked files outside `results/` and `runs/` (the outputs
    of runs) have changes; 'unknown' outside git."""
    try:
        run = lambda *args: subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        commit = run("rev-parse", "HEAD")
        changed = run(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)results",
            ":(exclude)runs",
        )
        return commit + ("-dirty" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hardware_info() -> dict[str, Any]:
    """CPU model (lscpu), core count (nproc), JAX devices, platform, load average at the time."""
    cpu = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),  # other work on the machine skews timings
    }


def _provenance_lines(result: dict[str, Any]) -> list[str]:
    notes = [f"{key}: `{result[key]}`" for key in ("command", "commit", "date") if key in result]
    if "hardware" in result:
        hw = result["hardware"]
        notes.append(
            f"hardware: {hw['cpu_model']}, nproc {hw['nproc']}, jax {hw['jax_devices']}, "
            f"load average {', '.join(f'{x:.1f}' for x in hw.get('load_average', []))}"
        )
    return notes


def markdown_table(result: dict[str, Any]) -> str:
    """One-row markdown table of a `measure_step_costs` result (plus provenance lines)."""
    target, draft = result.get("target", "target"), result.get("draft", "draft")
    header = (
        "| target | draft | dtype | batch | γ | target step ms | draft step ms | verify (γ+1) ms "
        "| c | verify_cost_ratio |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    row = (
        f"| {target} ({result['target_params'] / 1e6:.1f}M) "
        f"| {draft} ({result['draft_params'] / 1e6:.1f}M) | {result['target_config']['dtype']} "
        f"| {result['batch']} | {result['gamma']} | {result['target_step_ms']:.3f} "
        f"| {result['draft_step_ms']:.3f} | {result['verify_step_ms']:.3f} | {result['c']:.3f} "
        f"| {result['verify_cost_ratio']:.3f} |\n"
    )
    notes = [
        f"enc_len {result['enc_len']}, cache length {result['max_len']}, median of "
        f"{result['repeats']} interleaved rounds after {result['warmup']} warm-up rounds; "
        "random weights.",
        *_provenance_lines(result),
    ]
    return header + row + "\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def write_results(
    result: dict[str, Any],
    out_dir: str | os.PathLike,
    name: str,
    command: str,
    table: Callable[[dict[str, Any]], str] = markdown_table,
) -> pathlib.Path:
    """Writes `<name>.json` and `<name>.md` (`table(result)`) with command, commit, hardware, date.

    Returns:
      The JSON path.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        **result,
        "command": command,
        "commit": git_commit(pathlib.Path(__file__).resolve().parents[1]),
        "hardware": hardware_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(table(result))
    return path


# ----------------------------------------------------------------------------------------------
# Side by side with Hugging Face assisted generation (needs torch + transformers, the [hf] extra).


def _until_eos(tokens: Sequence[int], eos_id: int) -> list[int]:
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


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
    generation supports no more). Per example the four decoders run in turn; each pair is compared
    with its own baseline (speed-up = baseline time / accelerated time). HF's assistant uses
    `num_assistant_tokens=gamma` with a constant schedule and `assistant_confidence_threshold=0`
    (always γ drafts, like ours), and `generate` gets `decoder_attention_mask=ones((1, 1))`, the
    workaround for transformers 5.x re-feeding the assistant's decoder sequence (docs §7). One
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

    def batch_of(tokens):
        enc = np.zeros((1, enc_len), np.int32)
        enc[0, : len(tokens)] = tokens
        return {
            "encoder_input_tokens": enc,
            "decoder_input_tokens": np.zeros((1, max_decode_len), np.int32),
        }

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
        "ours_baseline": lambda t: np.asarray(ours_base(target_params, batch_of(t)))[0].tolist(),
        "ours_speculative": lambda t: np.asarray(
            ours_spec(target_params, draft_params, batch_of(t))
        )[0].tolist(),
    }
    for fn in runs.values():  # warm-up: compilation, first-call allocations
        fn(encoder_inputs[0])
    seconds = dict.fromkeys(runs, 0.0)
    tokens: dict[str, list[list[int]]] = {name: [] for name in runs}
    for example in encoder_inputs:
        for name, fn in runs.items():
            start = time.perf_counter()
            out = fn(example)
            seconds[name] += time.perf_counter() - start
            tokens[name].append(_until_eos(out, eos))
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
        "target_params": count_params(target_params),
        "draft_params": count_params(draft_params),
    }


def hf_comparison_table(result: dict[str, Any]) -> str:
    """Markdown table of a `compare_with_hf` result (plus provenance lines)."""
    n = result["num_examples"]
    rows = [
        "| implementation | baseline s | speculative s | speed-up | speculative == greedy |",
        "|---|---|---|---|---|",
        f"| HF transformers {result['transformers_version']} (torch {result['torch_version']}) "
        f"| {result['hf_baseline_s']:.3f} | {result['hf_assisted_s']:.3f} "
        f"| {result['hf_speedup']:.2f}x | {result['hf_assisted_equals_greedy']}/{n} |",
        f"| ours (JAX {jax.__version__}) | {result['ours_baseline_s']:.3f} "
        f"| {result['ours_speculative_s']:.3f} | {result['ours_speedup']:.2f}x "
        f"| {result['ours_speculative_equals_greedy']}/{n} |",
    ]
    notes = [
        f"greedy, batch 1, γ = {result['gamma']}, {n} examples, "
        f"{result['num_generated_tokens']} tokens; ours == HF greedy on {result['ours_equals_hf']}/{n}.",
        *_provenance_lines(result),
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {x}" for x in notes) + "\n"
