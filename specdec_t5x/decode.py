"""`python -m specdec_t5x.decode --gin_file=FILE [--gin.KEY=VALUE ...] "TEXT" ...`: each text through
the eval job's rows (the chain at GAMMA; at T = 0 the baseline beside it) on the pair FILE builds
(`eval.pairs.load_pair_from_gin`); empty texts skipped with a warning; widths `input_width`."""

import argparse
import sys
import time
from collections.abc import Sequence

import gin
import jax

from specdec_t5x import inputs, metrics, sampling
from specdec_t5x.eval import cli, config, lineup, pairs

input_width = inputs.input_width  # INPUT_LEN, then its doublings: one program per doubling
USAGE = "expected --gin_file=FILE [--gin.KEY=VALUE ...] and at least one text."
PARSER = argparse.ArgumentParser("python -m specdec_t5x.decode", add_help=False)
cli.add_cache_flags(PARSER).add_argument("--gin_file", action="append", default=[], metavar="FILE")


def _timed_twice(fn, *args):
    """(result, seconds of the second call): the first call compiles."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    return jax.block_until_ready(fn(*args)), time.perf_counter() - start


def decode(argv: Sequence[str]) -> list[dict]:
    """Per non-empty text (printed): {'input', 'output', 'tokens', 'ms', 'tokens_per_target_call',
    'baseline' (T = 0)}. ValueError: no --gin_file or text, an unknown flag, a GAMMA not >= 1."""
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    texts = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--") and not a.startswith("--gin.")]
    args, unknown = PARSER.parse_known_args(flags)
    if unknown or not args.gin_file or not texts:
        raise ValueError(f"unknown flag(s) {', '.join(unknown)}; {USAGE}" if unknown else USAGE)
    for i in (i for i, text in enumerate(texts) if not text.strip()):
        print(f"warning: text {i + 1} of {len(texts)} is empty; skipped.", file=sys.stderr)
    if not any(t.strip() for t in texts):
        raise ValueError(f"every text given is empty ({len(texts)}); nothing to decode.")
    cli.use_cache_flags(args)  # JAX's persistent compilation cache, as the eval job's
    spec_model, target_params, draft_params = pairs.load_pair_from_gin(args.gin_file, bindings)
    macro = lambda name: gin.query_parameter(f"%{name}")  # noqa: E731
    gamma = macro("GAMMA")
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"decode takes a fixed GAMMA >= 1 (e.g. --gin.GAMMA=3); got {gamma!r}.")
    settings = sampling.SamplingSettings(*(macro(k) for k in ("TEMPERATURE", "TOPK", "TOPP")))
    rows = lineup.build(  # the eval job's: at T = 0 the baseline first, the chain at γ last
        spec_model, target_params, draft_params, settings,
        config.SpeculationConfig(gamma), config.MeasureConfig(),
    )  # fmt: skip
    vocab, eos, rng, records = spec_model.input_vocabulary, spec_model.eos_id, macro("SEED"), []
    text_of = lambda tokens: metrics.decode_text(vocab, jax.device_get(tokens), eos)  # noqa: E731
    for i, text in ((i, t) for i, t in enumerate(texts) if t.strip()):
        tokens = [*vocab.encode(text), eos]
        width = input_width(len(tokens), macro("INPUT_LEN"))  # of one doubling of INPUT_LEN
        batch = inputs.decode_batch([tokens], width, macro("TARGET_LEN"))
        (out, stats), seconds = _timed_twice(rows[-1].decode, batch, jax.random.PRNGKey(rng))
        n, calls, ms = int(stats.num_generated[0]), int(stats.num_iterations[0]), 1e3 * seconds
        record = dict(input=text, output=text_of(out[0]), tokens=n, ms=ms)
        record["tokens_per_target_call"] = n / calls
        line = (
            f"input {i + 1} of {len(texts)} ({len(tokens)} tokens): {text}\nspeculative (γ = "
            f"{gamma}, T = {settings.temperature:g}): {record['output']}\n  {n} tokens, "
            f"{n / calls:.2f} per target call, {ms:.1f} ms"
        )
        if settings.greedy:
            (base, _), base_s = _timed_twice(rows[0].decode, batch, jax.random.PRNGKey(rng))
            same = bool((jax.device_get(base[0]) == jax.device_get(out[0])).all())
            record["baseline"] = dict(output=text_of(base[0]), ms=1e3 * base_s, identical=same)
            line += (
                f"\nbaseline (the target alone, greedy): {record['baseline']['output']}\n  "
                f"{1e3 * base_s:.1f} ms; identical: {same}; speed-up {base_s / seconds:.2f}X"
            )
        print(line)
        records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> list[dict] | None:
    """Entry point; `--help` prints the usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or "--help" in argv or "-h" in argv:
        print(PARSER.format_help() + "\n" + (__doc__ or "") + "\n" + USAGE)
        return None
    try:
        return decode(argv)
    finally:
        gin.clear_config(clear_constants=True)


def run(argv: Sequence[str] | None = None) -> None:
    """`main` for the command line: an error as one line, `error: ...`, and exit status 1."""
    cli.run_command(main, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run()
