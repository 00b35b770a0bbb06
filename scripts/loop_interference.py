"""Where the speculative loop's time goes when both models are real, and the draft's output shortlist.

    python scripts/loop_interference.py --out results/verify_cost

Part 1 (En→De, the shipped pair, draft without shortlist): the real `speculative_sample` loop,
set-up excluded (caches built once, outside the timed call), run with each model real (R) or
replaced by a zero-cost constant-logits step (F, `clock._constant_step`):

* RR both real; RF real target, free draft; FR free target, real draft; FF both free (loop work);
* SR / SF: a free target that instead sums a 24 MiB float32 buffer every call (a memory sweep the
  size of the target's decoder weights), with the real / the free draft.

Per iteration, RR − RF − FR + FF is what the two models cost together beyond their costs alone
(interference); SR − SF against FR − FF is what the draft's γ steps cost after 24 MiB of other
data went through the caches. Part 2: the loop with the draft's output shortlist
(`drafts.shortlist_params`) of each size, against the baseline loop (`decoding.temperature_sample`,
T5X's sampler) on the same caches, per task. Every call is checked token-equal to the baseline.
All variants of one example are timed interleaved (seeded random order per round); medians per
example are summed. Writes <out>/loop_interference.{json,md} with command, commit, hardware, date.
"""

import argparse
import statistics
import sys
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import decoding, drafts, gin_utils, models, provenance, speculative, steps
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.timing import clock

TASKS = {
    "ddtp_ende": ("models/embedded_ende_target.gin", "models/embedded_ende_draft.gin", 64),
    "debian_summarize": ("models/embedded_sum_target.gin", "models/embedded_sum_draft_te.gin", 256),
}
SWEEP_MIB = 24


def _build(task: str):
    gin.clear_config(clear_constants=True)
    target_gin, draft_gin, enc_len = TASKS[task]
    gin_utils.parse(
        [target_gin, "decoding/speculative.gin", draft_gin],
        ["DRAFT_SHORTLIST = None", "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS)"],
    )
    model, params = gin_utils.build()
    return model, model.pack_params(params), enc_len


def _time(fns: dict, rounds: int) -> dict:
    for f, a in fns.values():
        jax.block_until_ready(f(*a))
    samples = {k: [] for k in fns}
    for r in range(rounds):
        for k in np.random.default_rng(r).permutation(list(fns)):
            f, a = fns[k]
            t0 = time.perf_counter()
            jax.block_until_ready(f(*a))
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def run(task: str, examples: int, rounds: int, gamma: int, sizes, decompose: bool) -> dict:
    model, params, enc_len = _build(task)
    draft = model.draft
    inputs = jnp.zeros((1, 64), jnp.int32)
    vocab, eos = model.module.config.vocab_size, model.eos_id
    free, free_cache = clock._constant_step(vocab, eos), jnp.zeros((), jnp.float32)
    row = jax.random.normal(jax.random.PRNGKey(0), (vocab,)).at[eos].set(-1e9)
    sweep_buffer = jnp.asarray(np.random.default_rng(0).random(SWEEP_MIB * 2**18, np.float32))
    asset = "ngram_ende" if task == "ddtp_ende" else "ngram_sum"
    shortlisted = {
        s: drafts.shortlist_params(draft.module, draft.params, drafts.ngram_shortlist(s, asset))
        for s in sizes
    }

    def sweep(tokens, positions, cache):  # a free target that reads 24 MiB per call
        total = jnp.sum(cache * (1.0 + positions[0].astype(jnp.float32)))
        shift = positions.astype(jnp.float32) * 1e-6 + total * 1e-30
        return jnp.broadcast_to(row, tokens.shape + (vocab,)) + shift[:, None, None], cache

    def target(p, enc):
        return steps.make_block_step(model.module, p, enc)

    def draft_step(p, enc):
        return draft.make_step(p, enc)

    def spec(make_target, make_draft):  # compiled once: params and inputs are arguments
        def fn(tp, dp, enc, tc, dc):
            ts, ds = make_target(tp, enc), make_draft(dp, enc)
            return speculative.speculative_sample(
                inputs, tc, ts, dc, ds, eos, gamma=gamma, temperature=0.0
            )

        return jax.jit(fn)

    def freely(step):
        return lambda p, enc: step

    base = jax.jit(
        lambda tp, enc, tc: decoding.temperature_sample(
            inputs, tc, models.one_token_logits_fn(target(tp, enc)), eos, temperature=0.0
        )[0]
    )
    variants = {"RR": spec(target, draft_step)}
    if decompose:
        variants.update(
            RF=spec(target, freely(free)),
            FR=spec(freely(free), draft_step),
            FF=spec(freely(free), freely(free)),
            SR=spec(freely(sweep), draft_step),
            SF=spec(freely(sweep), freely(free)),
        )
    for s in shortlisted:
        variants[f"shortlist {s}"] = variants["RR"]

    exs, _ = inputs_lib.load_examples(task, "validation", examples, enc_len, 64)
    ms, counts = {}, {}
    for e in exs:
        enc = jnp.asarray(inputs_lib.pad_rows([e["inputs"]], enc_len))
        (tc, _), (dc, _) = model.states(params, draft.params, enc, 64)
        caches = {"R": tc, "F": free_cache, "S": sweep_buffer}
        draft_caches = {"R": dc, "F": free_cache}
        fns = {"baseline": (base, (params, enc, tc))}
        for k, fn in variants.items():
            dp = shortlisted[int(k.split()[1])] if k.startswith("shortlist") else draft.params
            t, d = ("R", "R") if k.startswith("shortlist") else (k[0], k[1])
            fns[k] = (fn, (params, dp, enc, caches[t], draft_caches[d]))
        reference = np.asarray(base(params, enc, tc)).reshape(-1)[:64]
        for k, (f, a) in fns.items():
            out = f(*a)
            if k == "baseline":
                n = int((reference != 0).sum())
            else:
                n = int(out[1].num_iterations[0])
                if k == "RR" or k.startswith("shortlist"):
                    got = np.asarray(out[0]).reshape(-1)[:64]
                    if not (got == reference).all():
                        raise AssertionError(f"{task}: {k} differs from the greedy baseline")
            counts[k] = counts.get(k, 0) + n
        for k, v in _time(fns, rounds).items():
            ms[k] = ms.get(k, 0.0) + v
    per = {k: ms[k] / max(counts[k], 1) for k in ms}
    out = {"task": task, "gamma": gamma, "examples": examples, "rounds": rounds, "ms": ms}
    out["counts"] = counts
    out["ms_per_unit"] = per  # baseline: per token; others: per iteration
    if decompose:
        out["interference_ms_per_iteration"] = per["RR"] - per["RF"] - per["FR"] + per["FF"]
        out["draft_ms_per_iteration"] = per["FR"] - per["FF"]
        out["draft_ms_per_iteration_after_sweep"] = per["SR"] - per["SF"]
        out["verify_ms_per_iteration"] = per["RF"] - per["FF"]
    out["loop_speedup"] = {
        k: ms["baseline"] / ms[k] for k in ms if k == "RR" or k.startswith("shortlist")
    }
    out["tokens_per_iteration"] = {k: counts["baseline"] / counts[k] for k in out["loop_speedup"]}
    return out


def _markdown(result: dict) -> str:
    lines = ["# The speculative loop with both models real, and the draft's output shortlist", ""]
    for r in result["tasks"]:
        p = r["ms_per_unit"]
        lines += [
            f"## {r['task']} (γ = {r['gamma']}, {r['examples']} validation sources, "
            f"{r['rounds']} interleaved rounds, T = 0, set-up excluded)",
            "",
        ]
        if "interference_ms_per_iteration" in r:
            lines += [
                "| loop | ms per iteration |",
                "|---|---|",
                *(f"| {k} | {p[k]:.3f} |" for k in ("RR", "RF", "FR", "FF", "SR", "SF")),
                f"| baseline (per token) | {p['baseline']:.3f} |",
                "",
                f"- RR − RF − FR + FF (both real, beyond each alone): "
                f"**{r['interference_ms_per_iteration']:.3f} ms** per iteration",
                f"- the draft's γ steps: {r['draft_ms_per_iteration']:.3f} ms alone (FR − FF), "
                f"**{r['draft_ms_per_iteration_after_sweep']:.3f} ms** after a {SWEEP_MIB} MiB "
                "sweep (SR − SF)",
                f"- the verify call in the loop (RF − FF): {r['verify_ms_per_iteration']:.3f} ms",
                "",
            ]
        lines += [
            "| draft | loop speed-up over the baseline loop | tokens per iteration "
            "| ms per iteration |",
            "|---|---|---|---|",
        ]
        for k, v in r["loop_speedup"].items():
            name = "full vocabulary (8192)" if k == "RR" else k
            lines.append(f"| {name} | {v:.3f} | {r['tokens_per_iteration'][k]:.3f} | {p[k]:.3f} |")
        lines.append("")
    lines += [f"- {note}" for note in provenance.markdown_lines(result)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/verify_cost")
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--gamma", type=int, default=2)
    parser.add_argument("--sizes", default="4096,2048,1024")
    parser.add_argument("--tasks", default="ddtp_ende,debian_summarize")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    tasks = [t for t in args.tasks.split(",") if t]
    result = {"tasks": []}
    for i, task in enumerate(tasks):
        r = run(task, args.examples, args.rounds, args.gamma, sizes, decompose=i == 0)
        print(r, flush=True)
        result["tasks"].append(r)
    command = "python scripts/loop_interference.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    path = provenance.write_results(result, args.out, "loop_interference", command, _markdown)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
