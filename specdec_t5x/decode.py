"""Decode one sentence: `python -m specdec_t5x.decode --gin_file=... "translate English to German: ..."`.

For trying a model pair: loads the target and draft an eval gin file configures (e.g.
`gin/experiments/embedded_ende_model_t0.gin`; `--gin.KEY=VALUE` bindings as in the eval job),
decodes each text with speculative decoding at GAMMA, TEMPERATURE, TOPK, TOPP, and prints the
input, the output, the tokens per target call and the time (the second call: the first
compiles). At T = 0 the baseline's output (the target alone, greedy) and its time are printed
beside it, with whether the two are identical (they must be: `speculative.speculative_sample` in
argmax mode). An empty text is skipped with a warning.

Inputs are padded as the eval job pads them: to INPUT_LEN tokens, the encoder running at the
shortest length bucket that holds the text (`steps.bucketed`, inside the one compiled program),
so texts of any length up to INPUT_LEN share one program; a longer text is padded to INPUT_LEN
times a power of two (`input_width`), one more program per doubling. Compiled programs are kept
in JAX's persistent compilation cache (`eval.cli.use_compilation_cache`), so the next run loads
them. An error prints one line, `error: ...` (exit status 1; `--verbose`: the traceback).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import gin
import jax
import numpy as np

from specdec_t5x import gin_utils, inputs, models, sampling

USAGE = """usage: python -m specdec_t5x.decode --gin_file=FILE [--gin.KEY=VALUE ...] "TEXT" ["TEXT" ...]
                                    [--verbose] [--compilation_cache_dir=DIR | --no_compilation_cache]

Decodes each TEXT with the target and draft FILE configures (an eval experiment, e.g.
gin/experiments/embedded_ende_model_t0.gin), at GAMMA / TEMPERATURE / TOPK / TOPP; at T = 0 the
target's greedy output is printed beside it. Prefix the text as the task does (the shipped En→De
pair: "translate English to German: ..."). Texts up to INPUT_LEN tokens share one compiled
program; compiled programs are cached as the eval job's are (--compilation_cache_dir=DIR,
--no_compilation_cache; see python -m specdec_t5x.eval --help). --verbose: on an error, the
traceback beside the one-line message."""
FLAGS = ("--gin_file=", "--gin.", "--compilation_cache_dir=", "--no_compilation_cache", "--verbose")


def _timed_twice(fn, *args):
    """(result, seconds of the second call): the first call compiles."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def input_width(num_tokens: int, input_len: int) -> int:
    """The encoder width a text of `num_tokens` tokens (EOS included) is padded to.

    INPUT_LEN, as the eval job pads every source (the encoder then runs at the length bucket
    that holds the text, `steps.bucketed`); beyond it, INPUT_LEN times the smallest power of two
    that holds the text: 64 -> 64, 65 -> 128, 200 -> 256 for INPUT_LEN 64. So the compiled
    programs are one per doubling, not one per length.
    """
    width = input_len
    while width < num_tokens:
        width *= 2
    return width


def decode(argv: Sequence[str]) -> list[dict]:
    """Decodes the texts in argv; returns one record per non-empty text (also printed).

    Returns:
      [{'input', 'output', 'tokens', 'tokens_per_target_call', 'ms', 'baseline' (T = 0 only:
      {'output', 'ms', 'identical'})}].

    Raises:
      ValueError: no --gin_file, no text (or only empty ones), an unknown flag, or GAMMA =
        'auto' (a fixed γ decodes one text; the eval job chooses γ over many).
    """
    from specdec_t5x.eval import cli  # the eval job's gin route, checks included

    files = [a.split("=", 1)[1] for a in argv if a.startswith("--gin_file=")]
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    cache_dirs = [a.split("=", 1)[1] for a in argv if a.startswith("--compilation_cache_dir=")]
    texts = [a for a in argv if not a.startswith("--")]
    unknown = [a for a in argv if a.startswith("--") and not a.startswith(FLAGS)]
    if unknown or not files or not texts:
        raise ValueError(
            f"{'unknown flag(s) ' + ', '.join(unknown) + '; ' if unknown else ''}expected "
            "--gin_file=FILE [--gin.KEY=VALUE ...] and at least one text.\n" + USAGE
        )
    for i, text in enumerate(texts):
        if not text.strip():
            print(f"warning: text {i + 1} of {len(texts)} is empty; skipped.", file=sys.stderr)
    numbered = [(i, text) for i, text in enumerate(texts) if text.strip()]
    if not numbered:
        raise ValueError(f"every text given is empty ({len(texts)}); nothing to decode.")
    cli.use_compilation_cache(
        cli.compilation_cache_dir(
            cache_dirs[-1] if cache_dirs else None, "--no_compilation_cache" in argv
        )
    )
    cli.parse_config(files, bindings, finalize=False)
    gin.parse_config(
        [
            "decode_model/gin_utils.build.obj = %SPEC_MODEL",
            "decode_params/gin_utils.build.obj = @packed_target/steps.pack_params()",
        ]
    )
    with gin.config_scope("decode_model"):
        spec_model = gin_utils.build()
    with gin.config_scope("decode_params"):
        target_params = gin_utils.build()
    gamma = gin.query_parameter("%GAMMA")
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"decode takes a fixed GAMMA >= 1 (e.g. --gin.GAMMA=3); got {gamma!r}.")
    settings = sampling.SamplingSettings(
        *(gin.query_parameter(f"%{k}") for k in ("TEMPERATURE", "TOPK", "TOPP"))
    )
    target_len = gin.query_parameter("%TARGET_LEN")
    vocab = spec_model.input_vocabulary
    target_params = spec_model.pack_params(target_params)
    draft_params = spec_model.draft.params
    pack = getattr(spec_model.draft, "pack_params", None)
    draft_params = draft_params if pack is None else pack(draft_params)
    params = {**settings.decoder_params(), "gamma": gamma}
    speculative = jax.jit(
        lambda tp, dp, b, rng: spec_model.predict_batch_with_aux(
            tp, b, rng, decoder_params=params, draft_params=dp
        )
    )
    baseline_model = models.EncoderDecoderModel(
        spec_model.module, vocab, vocab, cpu_weight_dtype=spec_model.cpu_weight_dtype
    )
    baseline = jax.jit(
        lambda tp, b, rng: baseline_model.predict_batch_with_aux(
            tp, b, rng, decoder_params=settings.decoder_params()
        )[0]
    )
    records = []
    rng = jax.random.PRNGKey(gin.query_parameter("%SEED"))
    input_len = gin.query_parameter("%INPUT_LEN")
    for i, text in numbered:
        tokens = list(vocab.encode(text)) + [spec_model.eos_id]
        width = input_width(len(tokens), input_len)
        batch = inputs.decode_batch([tokens], width, target_len)
        (out, aux), seconds = _timed_twice(speculative, target_params, draft_params, batch, rng)
        stats = jax.tree_util.tree_map(np.asarray, aux["stats"])
        record = {
            "input": text,
            "output": _text(vocab, out[0], spec_model.eos_id),
            "tokens": int(stats.num_generated[0]),
            "tokens_per_target_call": float(stats.num_generated[0] / stats.num_iterations[0]),
            "ms": 1e3 * seconds,
        }
        line = (
            f"input {i + 1} of {len(texts)} ({len(tokens)} tokens): {text}\n"
            f"speculative (γ = {gamma}, T = {settings.temperature:g}): {record['output']}\n"
            f"  {record['tokens']} tokens, {record['tokens_per_target_call']:.2f} per target call, "
            f"{record['ms']:.1f} ms"
        )
        if settings.greedy:
            base, base_s = _timed_twice(baseline, target_params, batch, rng)
            identical = bool(np.array_equal(np.asarray(base[0]), np.asarray(out[0])))
            record["baseline"] = {
                "output": _text(vocab, base[0], spec_model.eos_id),
                "ms": 1e3 * base_s,
                "identical": identical,
            }
            line += (
                f"\nbaseline (the target alone, greedy): {record['baseline']['output']}\n"
                f"  {record['baseline']['ms']:.1f} ms; identical: {identical}; speed-up "
                f"{base_s / seconds:.2f}X"
            )
        print(line)
        records.append(record)
    return records


def _text(vocab, tokens, eos_id: int) -> str:
    from specdec_t5x import metrics

    return metrics.decode_text(vocab, np.asarray(tokens), eos_id)


def main(argv: Sequence[str] | None = None) -> list[dict] | None:
    """Entry point; `--help` prints `USAGE`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or "--help" in argv or "-h" in argv:
        print(USAGE)
        return None
    try:
        return decode(argv)
    finally:
        gin.clear_config(clear_constants=True)


def run(argv: Sequence[str] | None = None) -> None:
    """`main` for the command line: an error as one line, `error: ...`, and exit status 1."""
    from specdec_t5x.eval import cli

    cli.run_command(main, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run()
