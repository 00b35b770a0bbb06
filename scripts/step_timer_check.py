"""What the eval job's step timer measures: per-step cost by two loop lengths vs per 8-step call.

  python scripts/step_timer_check.py --rounds 40   # -> results/verify_cost/step_timer.{json,md}

`step_timer.time_decoder_steps` (c and verify/step in every eval job) times 8 steps of one model
inside one jitted `fori_loop` call and divides by 8. Here the same harness (`clock.looped_steps`,
caches built once, target / draft / verify calls interleaved by `clock.time_interleaved`) runs
each step at two loop lengths, and the difference of the two call times, divided by the difference
of the lengths, is the marginal cost of one step inside a loop: what a call costs beyond its steps
(dispatch of the parameters, the donated cache, waking the intra-op threads) drops out. Uses the
experiment's target and draft (default: the shipped En→De pair), one DDTP test input, batch 1, the
verify block γ + 1 tokens, source and cache length 64, the block at decoder position 8 (as the
eval job).

Writes command, commit, hardware, date and load with the table. `--pause_pid_file` SIGSTOPs a
background job (e.g. training) while timing.
"""

import argparse
import pathlib
import shlex
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import gin_utils, inputs, models, provenance, steps
from specdec_t5x.timing import clock, step_timer


def measure(
    gin_file: str, gamma: int, short: int, long: int, rounds: int, input_len=64, target_len=64
) -> dict:
    """{'target' | 'draft' | 'verify': per-length call ms percentiles and the per-step costs}."""
    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK)"
    gin_utils.parse([gin_file], [what], finalize=False)
    spec_model, target_params, task = gin_utils.build()
    examples, _ = inputs.load_examples(
        task, "test", 1, input_len, target_len, spec_model.output_vocabulary
    )
    batch = inputs.example_batches(examples, 1, input_len, target_len)[0][1]
    enc = batch["encoder_input_tokens"]
    module, draft = spec_model.module, spec_model.draft
    target_params = models.pack_params(module, target_params)
    draft_params = (
        draft.pack_params(draft.params) if hasattr(draft, "pack_params") else draft.params
    )
    target_cache = jax.jit(lambda p, e: steps.prepare_cache(module, p, e, target_len))(
        target_params, enc
    )
    encoded = None
    if getattr(draft, "shares_target_encoder", False):  # its cache reads the target's encoding
        encoded = jax.jit(lambda p, e: steps.encode(module, p, e))(target_params, enc)
    draft_cache = jax.jit(lambda p, e, x: draft.init_cache(p, e, target_len, x))(
        draft_params, enc, encoded
    )

    def draft_step(p, e, tokens, pos, cache):
        return draft.make_step(p, e)(tokens, pos, cache)

    target_step = step_timer.decoder_step(module)
    pos = jnp.full((1,), 8, jnp.int32)
    one, block = jnp.full((1, 1), 5, jnp.int32), jnp.full((1, gamma + 1), 5, jnp.int32)
    setups = {
        "target": (target_step, (target_params, enc), one, target_cache),
        "draft": (draft_step, (draft_params, enc), one, draft_cache),
        "verify": (target_step, (target_params, enc), block, target_cache),
    }
    calls, caches = {}, {}
    for name, (step, args, tokens, cache) in setups.items():
        for n in (short, long):
            fn, key = clock.looped_steps(step, n), (name, n)
            caches[key] = jax.tree_util.tree_map(jnp.copy, cache)

            def run(fn=fn, args=args, tokens=tokens, key=key):
                total, caches[key] = fn(args, tokens, pos, caches[key])
                return total

            calls[key] = run
    samples = clock.time_interleaved(calls, rounds, warmup=2)
    out = {}
    for name in setups:
        a, b = np.asarray(samples[(name, short)]), np.asarray(samples[(name, long)])
        per_step = (b - a) / (long - short)  # same round: drift hits both lengths alike
        out[name] = {
            f"call_{short}_ms_p10_p50_p90": np.percentile(a, [10, 50, 90]).tolist(),
            f"call_{long}_ms_p10_p50_p90": np.percentile(b, [10, 50, 90]).tolist(),
            f"per_step_ms_by_{short}_step_call": float(np.median(a)) / short,
            "per_step_ms_by_difference": float(np.median(per_step)),
            "per_step_ms_by_difference_iqr": np.percentile(per_step, [25, 75]).tolist(),
            "per_call_ms": float(np.median(a - short * per_step)),
        }
    return out


def table(result: dict) -> str:
    s, n = result["short"], result["long"]
    lines = [
        "# The eval job's step timer: per 8-step call vs by two loop lengths",
        "",
        f"| step | {s}-step call ms (p10/p50/p90) | {n}-step call ms (p10/p50/p90) | "
        f"ms/step by {s}-step call (eval job) | ms/step by difference (IQR) | per-call ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in result["steps"].items():
        fmt = lambda v: "/".join(f"{x:.2f}" for x in v)  # noqa: E731
        lo, hi = m["per_step_ms_by_difference_iqr"]
        lines.append(
            f"| {name} | {fmt(m[f'call_{s}_ms_p10_p50_p90'])} | {fmt(m[f'call_{n}_ms_p10_p50_p90'])}"
            f" | {m[f'per_step_ms_by_{s}_step_call']:.3f} | {m['per_step_ms_by_difference']:.3f}"
            f" ({lo:.3f}–{hi:.3f}) | {m['per_call_ms']:.2f} |"
        )
    st = result["steps"]
    ratio = lambda key: st["draft"][key] / st["target"][key]  # noqa: E731
    vratio = lambda key: st["verify"][key] / st["target"][key]  # noqa: E731
    by_call, by_diff = f"per_step_ms_by_{s}_step_call", "per_step_ms_by_difference"
    lines += [
        "",
        f"- c (draft / target): {ratio(by_call):.3f} by {s}-step call, {ratio(by_diff):.3f} by "
        f"difference; verify (k = {result['gamma'] + 1}) / target: {vratio(by_call):.2f} by call, "
        f"{vratio(by_diff):.2f} by difference.",
        f"- {result['rounds']} interleaved rounds; gin file `{result['gin_file']}`; batch 1, block "
        "at decoder position 8.",
        f"- conditions: {result['note']}",
    ]
    lines += [f"- {line}" for line in provenance.markdown_lines(result)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", default="gin/experiments/embedded_ende_model_t0.gin")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--pause_pid_file", default=None)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default="results/verify_cost")
    args = parser.parse_args(argv)
    if not 1 <= args.short < args.long:
        raise ValueError(f"need 1 <= --short < --long; got {args.short}, {args.long}.")
    with clock.paused(args.pause_pid_file):
        result = measure(args.gin_file, args.gamma, args.short, args.long, args.rounds)
    result = {
        "steps": result,
        **{k: getattr(args, k) for k in ("gin_file", "gamma", "short", "long", "rounds", "note")},
    }
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "scripts/step_timer_check.py", *argv])
    path = provenance.write_results(result, args.out, "step_timer", command, table)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
