"""The measurements of `bench.accelerator`: step costs, the weight-streaming floor, end to end.

(a) `step_costs`: T(k) of the target's cached decoder call and each draft's one-token step,
    timed inside a `fori_loop` (`steps_per_call` steps per call) in interleaved rounds
    (`clock.time_interleaved`), medians.
(c) `copy_bandwidth`, `decoder_step_bytes`, `logits_layer_cost`: the weight-streaming floor of one
    decoder step and the cost of T5's 32128-way logits layer against our 8192-way one.
(b) `end_to_end`: baseline vs speculative decoding on real inputs at T = 0 and 1, γ from the cost
    model `cost_model_gamma` (Theorem 3.8 of Leviathan et al., 2022, with the measured verify cost
    T(γ+1)/T(1) instead of 1).

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

from specdec_t5x import drafts, models, network, steps, theory
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


def step_costs(models_, enc_tokens, s, budget) -> dict[str, Any]:
    """T(k) of the target and the one-token step of every draft, per batch size.

    Args:
      models_: {'target': (config, params), draft name: (config, params), ...}.
      enc_tokens: int32 [n, enc_len] real encoder inputs (rows reused if n < batch).
      s: the settings dict.
    """
    out = {}
    max_len = s["max_decode_len"]
    position = max_len - max(s["ks"]) - 1
    for batch in s["batches"]:
        enc = jnp.asarray(np.resize(enc_tokens, (batch, enc_tokens.shape[1])))
        pos = jnp.full((batch,), position, jnp.int32)
        calls, caches = {}, {}
        for name, (config, params) in models_.items():
            module = network.Transformer(config)
            cache = jax.jit(lambda p, e, m=module: steps.prepare_cache(m, p, e, max_len))(
                params, enc
            )
            fn = clock.looped_steps(step_timer.decoder_step(module), s["steps_per_call"])
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


def end_to_end(target, draft, tokens, s, costs, budget) -> dict[str, Any]:
    """Baseline vs speculative on real inputs at T = 0 and 1 (batch 1), see the module docs."""
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
    rows, compile_s = [], {}

    def decoders(temperature, gammas):
        settings = {"temperature": temperature, "topk": 0, "topp": 0.0}
        fns = {
            "baseline": jax.jit(
                lambda tp, b, r: base.predict_batch_with_aux(tp, b, r, decoder_params=settings)[0]
            )
        }
        for g in gammas:
            fns[g] = jax.jit(
                lambda tp, dp, b, r, g=g: spec.predict_batch_with_aux(
                    tp, b, r, decoder_params={**settings, "gamma": g}, draft_params=dp
                )
            )
        return fns

    def call(fn, key, batch, rng):
        if key == "baseline":
            return fn(tparams, batch, rng), None
        tokens, aux = fn(tparams, dparams, batch, rng)
        return tokens, aux["stats"]

    def run(temperature, gammas):
        fns = decoders(temperature, gammas)
        for key, fn in fns.items():  # compile + warm up, excluded from timing
            start = time.perf_counter()
            jax.block_until_ready(call(fn, key, batches[0], jax.random.PRNGKey(0)))
            compile_s[f"T{temperature:g}_{key}"] = round(time.perf_counter() - start, 2)
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
                stats[key].append(st)
        for g in gammas:
            summary = _stats_summary(stats[g])
            same = [np.array_equal(a, b) for a, b in zip(outs["baseline"], outs[g], strict=True)]
            rows.append(
                {
                    "temperature": temperature,
                    "gamma": g,
                    **summary,
                    "c": c,
                    "verify_cost_ratio": verify_ratio(verify, g),
                    "baseline_s": seconds["baseline"],
                    "speculative_s": seconds[g],
                    "speedup": seconds["baseline"] / seconds[g],
                    "predicted_speedup_thm38": float(
                        theory.walltime_improvement(min(summary["alpha"], 1 - 1e-9), g, c)
                    ),
                    "predicted_speedup_measured_verify": predicted_speedup(
                        summary["alpha"], g, c, verify
                    ),
                    "identical_fraction": float(np.mean(same)),
                }
            )
        return rows[-len(gammas) :]

    chosen = {}
    for temperature in (0.0, 1.0):
        pilot = run(temperature, [s["pilot_gamma"]])[0]
        gamma = cost_model_gamma(pilot["alpha"], c, verify, s["gamma_candidates"])
        chosen[f"{temperature:g}"] = {"gamma": gamma, "pilot_alpha": pilot["alpha"]}
        budget.log(f"(b) T={temperature:g} pilot γ={s['pilot_gamma']} -> cost-model γ={gamma}")
        extra = [gamma] if gamma != s["pilot_gamma"] else []
        if temperature == 0.0:
            extra += [g for g in s["gamma_sweep"] if g not in (gamma, s["pilot_gamma"])]
        per_run = max(budget.phases.get("_e2e_run_s", 0.0), 1.0)
        todo = []
        for g in extra:
            if g == gamma or budget.left() > 2.5 * per_run * (len(todo) + 1):
                todo.append(g)
            else:
                chosen.setdefault("skipped_for_budget", []).append([temperature, g])
        if todo:
            start = time.perf_counter()
            run(temperature, todo)
            budget.phases["_e2e_run_s"] = (time.perf_counter() - start) / len(todo)
        budget.log(f"(b) T={temperature:g} γ in {todo}")
    for row in rows:
        row["cost_model_gamma"] = row["gamma"] == chosen[f"{row['temperature']:g}"]["gamma"]
    return {"rows": rows, "cost_model": chosen, "num_examples": n, "compile_s": compile_s}
