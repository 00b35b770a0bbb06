"""The measurements of `benchmarks.accelerator`: step costs, the weight-streaming floor, end to end.

(a) `step_costs`: T(k) of the target's cached decoder call and each draft's one-token step,
    timed inside a `fori_loop` (`steps_per_call` steps per call) in interleaved rounds
    (`clock.time_interleaved`), medians. T(k) is also the cost of verifying a token tree of k
    nodes: a tree call feeds the same k tokens through the same matmuls, only the attention mask
    differs (`tree.TreeQuery.attention`); on CPU a tree call on N nodes costs an N-token call.
(c) `copy_bandwidth`, `decoder_step_bytes`, `logits_layer_cost`: the weight-streaming floor of one
    decoder step and the cost of T5's 32128-way logits layer against our 8192-way one.
(b) `end_to_end`: baseline vs speculative decoding on real inputs at T = 0 and 1, γ from the cost
    model `cost_model_gamma` (Theorem 3.8 of Leviathan et al., 2022, with the measured verify cost
    T(γ+1)/T(1) instead of 1), and token trees (`speculative.speculative_sample(tree=...)`, one
    target call on all K nodes per iteration) timed in the same runs as the chains.

`s` arguments are a settings dict of `accelerator.SETTINGS`; `budget` an
`accelerator.Budget`. Imports only JAX-side modules (no gin, seqio, TensorFlow).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing as bench_timing
from specdec_t5x import batch_theory, drafts, models, network, steps, theory
from specdec_t5x import tree as tree_lib
from specdec_t5x.timing import clock, step_timer

T5_VOCAB = 32128  # T5's SentencePiece vocabulary, rounded up to a multiple of 128


def param_bytes(params: Any) -> int:
    """Bytes of all leaves (arrays or `jax.ShapeDtypeStruct`s)."""
    leaves = jax.tree_util.tree_leaves(params)
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves))


# ----------------------------------------------------------------------------------------------
# (a) Step costs.


def _chained_call(fn, params, enc, tokens, positions, caches, key):
    """One timed call of a looped step; its cache becomes the next call's (`caches[key]`)."""
    total, caches[key] = fn((params, enc), tokens, positions, caches[key])
    return total


def step_cost_layout(max_decode_len: int, ks: Sequence[int]) -> tuple[int, int]:
    """(position, cache slots) of the timed calls of `step_costs`: position
    `max_decode_len - max(ks) - 1`, at least `max_decode_len // 2`; slots
    `max(max_decode_len, position + max(ks))`, so every call of up to max(ks) tokens fits.

    Raises:
      ValueError: a k < 1 or max_decode_len < 1.
    """
    if max_decode_len < 1 or not ks or min(ks) < 1:
        raise ValueError(f"need max_decode_len >= 1 and ks >= 1, got {max_decode_len}, {ks}")
    position = max(max_decode_len - max(ks) - 1, max_decode_len // 2)
    return position, max(max_decode_len, position + max(ks))


def step_costs(models_, enc_tokens, s, budget) -> dict[str, Any]:
    """T(k) of the target and the one-token step of every draft, per batch size.

    Every call writes k tokens at one position of a cache (`step_cost_layout`): the largest k
    grows the cache past max_decode_len as a tree of k nodes grows its caches
    (`tree.TreeStep.cache_slots`). T(k) is the verify cost of a chain of γ = k - 1 drafts and of a
    token tree of k nodes alike (same tokens through the same matmuls; only the mask differs).

    Args:
      models_: {'target': (config, params), draft name: (config, params), ...}.
      enc_tokens: int32 [n, enc_len] real encoder inputs (rows reused if n < batch).
      s: the settings dict.

    Returns:
      {str(batch): {'target_step_ms': {str(k): ms}, 'verify_cost_ratio': {str(k): T(k)/T(1)},
      'draft_step_ms': {name: ms}, 'c': {name: draft step / T(1)}}}.
    """
    out = {}
    position, max_len = step_cost_layout(s["max_decode_len"], s["ks"])
    for batch in s["batches"]:
        enc = jnp.asarray(np.resize(enc_tokens, (batch, enc_tokens.shape[1])))
        pos = jnp.full((batch,), position, jnp.int32)
        calls, caches = {}, {}
        for name, (config, params) in models_.items():
            module = network.Transformer(config)
            cache = jax.jit(lambda p, e, m=module: steps.prepare_cache(m, p, e, max_len))(
                params, enc
            )
            fn = bench_timing.looped_steps(step_timer.decoder_step(module), s["steps_per_call"])
            for k in s["ks"] if name == "target" else (1,):
                key = f"{name}_k{k}"
                caches[key] = jax.tree_util.tree_map(jnp.copy, cache)
                tokens = jnp.full((batch, k), 5, jnp.int32)

                calls[key] = functools.partial(
                    _chained_call, fn, params, enc, tokens, pos, caches, key
                )
        samples = clock.time_interleaved(calls, s["repeats"], warmup=1)
        ms = {k: statistics.median(v) / s["steps_per_call"] for k, v in samples.items()}
        t1 = ms["target_k1"]
        out[str(batch)] = {
            "target_step_ms": {str(k): ms[f"target_k{k}"] for k in s["ks"]},
            "verify_cost_ratio": {str(k): ms[f"target_k{k}"] / t1 for k in s["ks"]},
            "draft_step_ms": {n: ms[f"{n}_k1"] for n in models_ if n != "target"},
            "c": {n: ms[f"{n}_k1"] / t1 for n in models_ if n != "target"},
        }
        budget.log(f"(a) step costs, batch {batch}")
    return out


# ----------------------------------------------------------------------------------------------
# (c) Weight-streaming floor and the cost of T5's 32128-way logits layer.


def copy_bandwidth(mib: int, repeats: int) -> float:
    """Device memory bandwidth in GB/s from `y = x + 1` on a bfloat16 array of `mib` MiB (reads
    and writes it once: 2 * bytes moved per call)."""
    x = jnp.ones((mib * 2**20 // 2,), jnp.bfloat16)
    fn = jax.jit(lambda x: x + 1)
    samples = clock.time_interleaved({"copy": lambda: fn(x)}, repeats, warmup=2)["copy"]
    return 2 * x.nbytes / (statistics.median(samples) / 1e3) / 1e9


def decoder_step_bytes(params: Any, cache: Any) -> int:
    """Bytes one cached decoder step must read: decoder parameters except the cross-attention
    key/value kernels (used only when the cache is built), and every decoder cache leaf."""

    def used(path, x):
        names = [str(getattr(p, "key", p)) for p in path]
        skip = names[0] != "decoder" or (
            "encoder_decoder_attention" in names and names[-2] in ("key", "value")
        )
        return 0 if skip else param_bytes(x)

    counted = jax.tree_util.tree_map_with_path(used, params)
    return int(sum(jax.tree_util.tree_leaves(counted))) + param_bytes(cache)


def logits_layer_cost(emb_dim: int, batch: int, s) -> dict[str, float]:
    """ms per step of the logits projection x [batch, 1, emb] @ W [emb, V] (bfloat16, float32
    out) for our vocabulary and T5's, random weights, timed in a `fori_loop` like the steps."""
    out = {}
    rng = jax.random.PRNGKey(0)
    calls = {}
    for vocab in (8192, T5_VOCAB):
        w = jax.random.normal(rng, (emb_dim, vocab), jnp.bfloat16)

        def run(x, w):
            def body(_, x):
                logits = jnp.dot(x, w, preferred_element_type=jnp.float32)
                return x + 1e-3 * logits[..., : x.shape[-1]].astype(x.dtype)

            return jax.lax.fori_loop(0, s["steps_per_call"], body, x)

        fn, x = jax.jit(run), jnp.ones((batch, 1, emb_dim), jnp.bfloat16)
        calls[str(vocab)] = lambda fn=fn, x=x, w=w: fn(x, w)
    samples = clock.time_interleaved(calls, s["repeats"], warmup=1)
    for vocab, values in samples.items():
        out[f"logits_{vocab}_ms"] = statistics.median(values) / s["steps_per_call"]
    out["t5_vocab_extra_ms"] = out[f"logits_{T5_VOCAB}_ms"] - out["logits_8192_ms"]
    return out


# ----------------------------------------------------------------------------------------------
# (b) End to end on real inputs.


def verify_ratio(verify: dict[int, float], gamma: int) -> float:
    """T(γ+1)/T(1) from the measured `verify` {k: T(k)/T(1)}, linearly interpolated in k
    (beyond the largest measured k: extrapolated from the last two points, never below the last)."""
    ks, k = sorted(verify), gamma + 1
    if k > ks[-1]:
        k0, k1 = ks[-2], ks[-1]
        return max(verify[k1], verify[k1] + (verify[k1] - verify[k0]) / (k1 - k0) * (k - k1))
    return float(np.interp(k, ks, [verify[x] for x in ks]))


def predicted_speedup(alpha: float, gamma: int, c: float, verify: dict[int, float]) -> float:
    """Theorem 3.8 with the measured verify cost: E(α, γ) / (γ c + T(γ+1)/T(1))."""
    alpha = min(alpha, 1 - 1e-9)
    tokens = float(theory.expected_tokens_per_iteration(alpha, gamma))
    return tokens / (gamma * c + verify_ratio(verify, gamma))


def cost_model_gamma(
    alpha: float, c: float, verify: dict[int, float], candidates: Sequence[int] = range(1, 16)
) -> int:
    """The γ among `candidates` maximising `predicted_speedup` (ties: the smallest)."""
    return max(sorted(candidates), key=lambda g: predicted_speedup(alpha, g, c, verify))


def tree_name(shape: Sequence[int]) -> str:
    """A tree row's name, e.g. 'tree(2,2,2,1)' (the eval job's tree row names, `tree.tree_name`)."""
    return tree_lib.tree_name(shape)


def _stats_summary(stats: list[Any]) -> dict[str, float]:
    total = {k: float(sum(np.sum(getattr(s, k)) for s in stats)) for k in _STAT_KEYS}
    return {
        "alpha": total["beta_sum"] / max(total["num_beta"], 1),
        "alpha_counted": total["num_accepted"] / max(total["num_draft_tokens"], 1),
        "tokens_per_iteration": total["num_generated"] / max(total["num_iterations"], 1),
        "target_calls": total["num_iterations"],
        "generated_tokens": total["num_generated"],
    }


_STAT_KEYS = ("beta_sum", "num_beta", "num_accepted", "num_draft_tokens", "num_generated")
_STAT_KEYS += ("num_iterations",)


def _tree_acceptance(stats: list[Any]) -> dict[str, list[float]]:
    """Acceptance per depth [D] and per rank [k_max] (accepted / tested, summed over the rows and
    examples; per rank also over depths) of a list of `tree.TreeStats`."""

    def total(field, axes):
        return np.sum([np.sum(np.asarray(getattr(s, field)), axis=axes) for s in stats], axis=0)

    def ratio(accepted, tested):
        return (accepted / np.maximum(tested, 1)).tolist()

    return {
        "depth_acceptance": ratio(total("depth_accepted", 0), total("depth_tested", 0)),
        "rank_acceptance": ratio(total("rank_accepted", (0, 1)), total("rank_tested", (0, 1))),
        "depth_tested": total("depth_tested", 0).tolist(),
        "rank_tested": total("rank_tested", (0, 1)).tolist(),
    }


def end_to_end(target, draft, tokens, s, costs, budget) -> dict[str, Any]:
    """Baseline vs speculative on real inputs at T = 0 and 1 (batch 1), see the module docs.

    At each temperature: a pilot run (baseline and γ = `pilot_gamma`), then one run of the
    cost-model γ, the token trees `s['trees']` and (T = 0) the γ sweep, each timed example by
    example with the baseline in a seeded random order (`clock.call_order`). Trees and sweep γs
    are optional: one is skipped (and listed in `cost_model['skipped_for_budget']`) when the
    budget left is under 2.5 times the measured seconds per decoder of a run for all admitted.

    Returns:
      {'rows': chain rows, 'tree_rows': tree rows (name 'tree(2,2,2,1)', nodes K, tokens per
      target call, speed-up over the same run's baseline, identical fraction, acceptance per depth
      and rank from `tree.TreeStats`), 'cost_model', 'num_examples', 'compile_s'}.
    """
    (tcfg, tparams), (dcfg, dparams) = target, draft
    spec = models.SpeculativeEncoderDecoderModel(
        network.Transformer(tcfg), drafts.T5Draft(network.Transformer(dcfg), dparams)
    )
    base = models.EncoderDecoderModel(spec.module)
    n, max_len = min(s["num_examples"], len(tokens)), s["max_decode_len"]
    batches = [
        {
            "encoder_input_tokens": jnp.asarray(tokens[i : i + 1]),
            "decoder_input_tokens": jnp.zeros((1, max_len), jnp.int32),
        }
        for i in range(n)
    ]
    c = costs["1"]["c"][next(iter(s["drafts"]))]
    verify = {int(k): v for k, v in costs["1"]["verify_cost_ratio"].items()}
    trees = [tree_lib.parse_tree(t) for t in s.get("trees", ())]  # bad shapes fail before timing
    rows, tree_rows, compile_s = [], [], {}
    baselines = {}  # one compiled baseline per temperature, shared by its runs

    def label(key):  # γ (int) or a tree's branching factors (tuple)
        return tree_name(key) if isinstance(key, tuple) else str(key)

    def decoders(temperature, keys):
        settings = {"temperature": temperature, "topk": 0, "topp": 0.0}
        if temperature not in baselines:
            baselines[temperature] = jax.jit(
                lambda tp, b, r: base.predict_batch_with_aux(tp, b, r, decoder_params=settings)[0]
            )
        fns = {"baseline": baselines[temperature]}
        for key in keys:
            if isinstance(key, tuple):  # caches get K - 1 extra slots (`models.py`)
                params = {
                    **settings,
                    "tree": key,
                    "tree_rule": s.get("tree_rule", "without_replacement"),
                }
            else:
                params = {**settings, "gamma": key}
            fns[key] = jax.jit(
                lambda tp, dp, b, r, params=params: spec.predict_batch_with_aux(
                    tp, b, r, decoder_params=params, draft_params=dp
                )
            )
        return fns

    def call(fn, key, batch, rng):
        if key == "baseline":
            return fn(tparams, batch, rng), None
        tokens, aux = fn(tparams, dparams, batch, rng)
        return tokens, aux["stats"]

    def run(temperature, keys):
        fns = decoders(temperature, keys)
        for key, fn in fns.items():  # compile (first run) + warm up, excluded from timing
            start = time.perf_counter()
            jax.block_until_ready(call(fn, key, batches[0], jax.random.PRNGKey(0)))
            compile_s.setdefault(
                f"T{temperature:g}_{label(key)}", round(time.perf_counter() - start, 2)
            )
        seconds = {k: 0.0 for k in fns}
        outs = {k: [] for k in fns}
        stats = {k: [] for k in fns}
        for i, batch in enumerate(batches):
            rng = jax.random.PRNGKey(i)
            order = clock.call_order(list(fns), i)
            for key in order:
                start = time.perf_counter()
                out, st = jax.block_until_ready(call(fns[key], key, batch, rng))
                seconds[key] += time.perf_counter() - start
                outs[key].append(np.asarray(out)[0])
                stats[key].append(jax.tree_util.tree_map(np.asarray, st))
        new = []
        for key in keys:
            summary = _stats_summary(stats[key])
            same = [np.array_equal(a, b) for a, b in zip(outs["baseline"], outs[key], strict=True)]
            timing = {
                "baseline_s": seconds["baseline"],
                "speculative_s": seconds[key],
                "speedup": seconds["baseline"] / seconds[key],
                "identical_fraction": float(np.mean(same)),
            }
            if isinstance(key, tuple):
                shape = tree_lib.parse_tree(key)
                row = {
                    "temperature": temperature,
                    "tree": list(key),
                    "name": tree_name(key),
                    "nodes": shape.num_nodes,
                    "depth": len(key),
                    "tree_rule": s.get("tree_rule", "without_replacement"),
                    **summary,
                    **_tree_acceptance(stats[key]),
                    "c": c,
                    "verify_cost_ratio": verify_ratio(verify, shape.num_nodes - 1),
                    **timing,
                }
                tree_rows.append(row)
            else:
                row = {
                    "temperature": temperature,
                    "gamma": key,
                    "nodes": key + 1,
                    **summary,
                    "c": c,
                    "verify_cost_ratio": verify_ratio(verify, key),
                    **timing,
                    "predicted_speedup_thm38": float(
                        theory.walltime_improvement(min(summary["alpha"], 1 - 1e-9), key, c)
                    ),
                    "predicted_speedup_measured_verify": predicted_speedup(
                        summary["alpha"], key, c, verify
                    ),
                }
                rows.append(row)
            new.append(row)
        return new

    chosen = {}
    for temperature in (0.0, 1.0):
        start = time.perf_counter()
        pilot = run(temperature, [s["pilot_gamma"]])[0]
        # Seconds per speculative decoder of a run (compile and its share of the baseline
        # included); until a longer run has been measured, half the pilot's (two decoders).
        budget.phases.setdefault("_e2e_run_s", (time.perf_counter() - start) / 2)
        gamma = cost_model_gamma(pilot["alpha"], c, verify, s["gamma_candidates"])
        chosen[f"{temperature:g}"] = {"gamma": gamma, "pilot_alpha": pilot["alpha"]}
        budget.log(f"(b) T={temperature:g} pilot γ={s['pilot_gamma']} -> cost-model γ={gamma}")
        # The cost-model γ always; then the trees (what an accelerator is for), then the sweep.
        extra = [gamma] if gamma != s["pilot_gamma"] else []
        extra += [shape.spec for shape in trees]
        if temperature == 0.0:
            extra += [g for g in s["gamma_sweep"] if g not in (gamma, s["pilot_gamma"])]
        per_run = max(budget.phases["_e2e_run_s"], 1.0)
        todo = []
        for key in extra:
            if key == gamma or budget.left() > 2.5 * per_run * (len(todo) + 1):
                todo.append(key)
            else:
                chosen.setdefault("skipped_for_budget", []).append([temperature, label(key)])
        if todo:
            start = time.perf_counter()
            run(temperature, todo)
            budget.phases["_e2e_run_s"] = (time.perf_counter() - start) / len(todo)
        budget.log(f"(b) T={temperature:g} γ / trees in {[label(k) for k in todo]}")
    for row in rows:
        row["cost_model_gamma"] = row["gamma"] == chosen[f"{row['temperature']:g}"]["gamma"]
    for row in tree_rows:  # against the cost-model γ's chain of the same temperature
        chain = [
            r for r in rows if r["temperature"] == row["temperature"] and r["cost_model_gamma"]
        ]
        if chain:
            row["tokens_per_call_over_chain"] = (
                row["tokens_per_iteration"] / chain[-1]["tokens_per_iteration"]
            )
    return {
        "rows": rows,
        "tree_rows": tree_rows,
        "cost_model": chosen,
        "num_examples": n,
        "compile_s": compile_s,
    }


# ----------------------------------------------------------------------------------------------
# (d) Batches: the same examples decoded b rows per call, exact per-row acceptance in one loop.


def _row_lengths(tokens: np.ndarray, eos_id: int, max_len: int) -> list[int]:
    """Output length of each row of int [b, max_len] tokens, EOS counted (max_len without)."""
    out = []
    for row in np.asarray(tokens):
        hits = np.flatnonzero(row == eos_id)
        out.append(int(hits[0]) + 1 if hits.size else max_len)
    return out


def batch_sweep(target, draft, tokens, s, budget, gamma: int) -> dict[str, Any]:
    """Baseline vs speculative at T = 0 and γ, the first `batch_examples` examples decoded b rows
    per call (input order, as T5X's infer batches them) for every b in `s['batch_sweep']`.

    Per b: T(b, 1), T(b, γ + 1) and the draft's step d(b) (`step_costs` at that batch), the timed
    calls (baseline and speculative interleaved per call in a seeded order, `clock.call_order`),
    α, tokens per target call per row, loop iterations per call (max over rows) against the mean
    row's, identical fraction, both loops' tokens/s, and the batch cost model's prediction
    (`batch_theory.batch_speedup_from_costs` with the rows' lengths and α; and with a flat T(b, k) =
    T(b, 1), c of batch 1). A batch is skipped (listed in 'skipped_for_budget') when the budget
    left is under twice the seconds its predecessor took.

    Returns:
      {'gamma', 'rows': [...], 'skipped_for_budget': [b, ...]}.
    """
    (tcfg, tparams), (dcfg, dparams) = target, draft
    spec = models.SpeculativeEncoderDecoderModel(
        network.Transformer(tcfg), drafts.T5Draft(network.Transformer(dcfg), dparams)
    )
    base = models.EncoderDecoderModel(spec.module)
    max_len, n = s["max_decode_len"], min(s["batch_examples"], len(tokens))
    settings = {"temperature": 0.0, "topk": 0, "topp": 0.0}
    base_fn = jax.jit(
        lambda tp, b, r: base.predict_batch_with_aux(tp, b, r, decoder_params=settings)[0]
    )
    spec_fn = jax.jit(
        lambda tp, dp, b, r: spec.predict_batch_with_aux(
            tp, b, r, decoder_params={**settings, "gamma": gamma}, draft_params=dp
        )
    )
    rows, skipped, last_s = [], [], 0.0
    c1 = None
    for b in s["batch_sweep"]:
        if rows and budget.left() < 2.0 * last_s:
            skipped.append(b)
            continue
        start = time.perf_counter()
        sub = {**s, "batches": (b,), "ks": tuple(sorted({1, gamma + 1}))}
        cost = step_costs({"target": target, "draft": draft}, np.asarray(tokens), sub, budget)
        cost = cost[str(b)]
        t1, tv = cost["target_step_ms"]["1"], cost["target_step_ms"][str(gamma + 1)]
        d = cost["draft_step_ms"]["draft"]
        c1 = cost["c"]["draft"] if c1 is None else c1  # the first batch's c (batch 1 first)
        calls = [
            {
                "encoder_input_tokens": jnp.asarray(
                    np.resize(tokens[i : i + b], (b, tokens.shape[1]))
                ),
                "decoder_input_tokens": jnp.zeros((b, max_len), jnp.int32),
            }
            for i in range(0, n, b)
        ]
        fns = {
            "baseline": lambda batch, rng: (base_fn(tparams, batch, rng), None),
            "speculative": lambda batch, rng: (
                lambda out: (out[0], out[1]["stats"])
            )(spec_fn(tparams, dparams, batch, rng)),
        }  # fmt: skip
        for fn in fns.values():  # compile + warm up, untimed
            jax.block_until_ready(fn(calls[0], jax.random.PRNGKey(0)))
        seconds = {k: 0.0 for k in fns}
        lengths, iters, same, stats = [], [], [], []
        for i, batch in enumerate(calls):
            outs = {}
            rng = jax.random.PRNGKey(i)
            for key in clock.call_order(list(fns), i):
                t0 = time.perf_counter()
                outs[key] = jax.block_until_ready(fns[key](batch, rng))
                seconds[key] += time.perf_counter() - t0
            rows_here = min(b, n - i)  # a ragged last call repeats rows: count the real ones
            base_tok = np.asarray(outs["baseline"][0])[:rows_here]
            spec_tok = np.asarray(outs["speculative"][0])[:rows_here]
            st = jax.tree_util.tree_map(np.asarray, outs["speculative"][1])
            stats.append(st)
            lengths.append(_row_lengths(base_tok, spec.eos_id, max_len))
            its = np.asarray(st.num_iterations)
            iters.append((int(its.max()), float(its[:rows_here].mean())))
            same += [bool(np.array_equal(x, y)) for x, y in zip(base_tok, spec_tok, strict=True)]
        summary = _stats_summary(stats)
        alpha = min(summary["alpha_counted"], 1.0)
        model = batch_theory.batch_speedup_from_costs(lengths, alpha, gamma, t1, tv, d)
        waste = batch_theory.batch_waste(lengths, alpha, gamma)
        generated = float(sum(sum(x) for x in lengths))
        rows.append(
            {
                "batch": b,
                "num_examples": n,
                "gamma": gamma,
                "baseline_s": seconds["baseline"],
                "speculative_s": seconds["speculative"],
                "speedup": seconds["baseline"] / seconds["speculative"],
                "baseline_tokens_per_s": generated / seconds["baseline"],
                "speculative_tokens_per_s": generated / seconds["speculative"],
                "alpha": summary["alpha_counted"],
                "tokens_per_call_per_row": summary["tokens_per_iteration"],
                "loop_iterations": float(np.mean([m for m, _ in iters])),
                "row_iterations": float(np.mean([r for _, r in iters])),
                "identical_fraction": float(np.mean(same)),
                "T_ms": {"1": t1, str(gamma + 1): tv},
                "draft_step_ms": d,
                "verify_cost_ratio": tv / t1,
                "c": d / t1,
                "predicted_speedup": model["speedup"],
                "predicted_waste": waste["speculative_waste"],
                "baseline_waste": waste["baseline_waste"],
                "predicted_speedup_flat": batch_theory.batch_walltime_improvement(
                    alpha, gamma, c1, 1.0, waste["baseline_waste"], waste["speculative_waste_eq1"]
                ),
            }
        )
        last_s = time.perf_counter() - start
        budget.log(f"(d) batch {b}: {rows[-1]['speedup']:.2f}X")
    return {"gamma": gamma, "rows": rows, "skipped_for_budget": skipped}
