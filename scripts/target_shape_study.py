"""Would a bigger En→De target pay? Step costs, set-up and training cost per target shape.

  python scripts/target_shape_study.py            # -> results/training/session15/target_shapes.{json,md}

Issue 10 asks to keep the target's shape "unless a bigger target pays in measured speed-up per
CPU-hour (a bigger target lowers c but costs training time: measure before deciding)". Timings do
not depend on the weights, so this measures, for the shipped target shape and three bigger ones,
and for the shipped draft shape and three bigger ones (random weights; the CPU kernel on, as the
eval job runs; draft weights stored in bfloat16, as shipped), on this machine, each (target,
draft) pair as the eval job measures its own (`pair_costs_once`: only the two models, interleaved
rounds), all pairs --passes times in alternating order, medians over passes (`measure_pairs`):

* the target's k-token calls T(k), k = 1..8, and the draft's step, in-loop (8 steps per jitted
  `fori_loop`, as in the decode loops), so c = draft / T(1) and verify = T(γ + 1) / T(1);
* the set-up of one example (`steps.prepare_cache` on a --enc_len source: encoder pass + cache),
  which the baseline and speculative decoding both pay (the draft's only speculative decoding);
* one training step per target shape (forward, backward, Adafactor update; batch 24, 64 + 64
  tokens, T5X's loss), the shapes interleaved.

From these and a given α it predicts the speed-up two ways, at the best γ in 1..7:
`thm38_measured_verify` = E(α, γ) / (γc + T(γ+1)/T(1)) (`theory.measured_walltime_improvement`),
and `with_setup`, the same with each example's set-up added to both sides for a decode of
--tokens tokens (the DDTP test mean of the demo). Finally `break_even_alpha`: the α a shape needs
for its `with_setup` prediction to equal the shipped shape's at --alpha, and `train_hours` = the
shipped target's steps to its plateau (--plateau_steps, sessions 1–14) × the shape's step time, a
lower bound (a bigger model needs at least as many steps on the same 38.7k pairs).
"""

import argparse
import pathlib
import shlex
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import models, network, provenance, steps, theory
from specdec_t5x.bench import random_pair
from specdec_t5x.timing import clock, step_timer
from specdec_t5x.training import train

SHAPES = {
    "shipped (d 256, 4+4)": dict(
        emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=4, num_decoder_layers=4
    ),
    "deeper (d 256, 6+6)": dict(
        emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=6, num_decoder_layers=6
    ),
    "wider (d 384, 4+4)": dict(
        emb_dim=384, num_heads=6, mlp_dim=1536, num_encoder_layers=4, num_decoder_layers=4
    ),
    "T5 v1.1 small (d 512, 8+8)": dict(
        emb_dim=512, num_heads=6, mlp_dim=1024, num_encoder_layers=8, num_decoder_layers=8
    ),
}
DRAFT = dict(emb_dim=128, num_heads=2, mlp_dim=256, num_encoder_layers=2, num_decoder_layers=1)
# Bigger drafts for the shipped target (the other lever sessions 4-14 left open).
DRAFTS = {
    "shipped (d 128, 2+1)": DRAFT,
    "wider (d 192, 2+1)": dict(
        emb_dim=192, num_heads=3, mlp_dim=512, num_encoder_layers=2, num_decoder_layers=1
    ),
    "target width (d 256, 2+1)": dict(
        emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=2, num_decoder_layers=1
    ),
    "target width (d 256, 2+2)": dict(
        emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=2, num_decoder_layers=2
    ),
}
GAMMAS = range(1, 8)
STEPS_PER_CALL = 8


def config(**shape) -> network.T5Config:
    """An embedded-model T5Config (8192-entry vocabulary, head_dim 64, gated GELU, float32)."""
    return network.T5Config(
        vocab_size=8192,
        dtype=jnp.float32,
        head_dim=64,
        mlp_activations=("gelu", "linear"),
        dropout_rate=0.0,
        logits_via_embedding=False,
        **shape,
    )


class _Model:
    """A randomly initialised model packed for the CPU kernel, its set-up and its jitted step."""

    def __init__(self, cfg, seed: int, weight_dtype: str, enc, max_len: int):
        module = network.Transformer(cfg)
        raw = random_pair.random_params(module, seed)
        self.num_params = random_pair.count_params(raw)
        self.params = steps.pack_params(module, raw, weight_dtype)
        self.enc = enc
        self.setup = jax.jit(lambda p, e: steps.prepare_cache(module, p, e, max_len))
        self.cache = self.setup(self.params, enc)
        self.step = jax.jit(step_timer.decoder_step(module))


def pair_costs_once(target: _Model, draft: _Model, repeats: int) -> dict:
    """One measurement of a (target, draft) pair as the eval job measures it: only these two
    models, in-loop steps interleaved (`step_timer.time_decoder_steps`: T(1), the draft's step,
    T(k) for k = 2..8), then both set-ups interleaved with T(1) (`clock.time_interleaved`)."""
    costs = step_timer.time_decoder_steps(
        target.step,
        (target.params, target.enc),
        target.cache,
        draft.step,
        (draft.params, draft.enc),
        draft.cache,
        batch=1,
        position=16,
        gamma=1,
        repeats=repeats,
        block_sizes=tuple(g + 1 for g in GAMMAS),
    )
    t1 = clock.looped_steps(target.step, STEPS_PER_CALL)
    pos, one = jnp.full((1,), 16, jnp.int32), jnp.full((1, 1), 5, jnp.int32)
    cache = [jax.tree_util.tree_map(jnp.copy, target.cache)]

    def step():
        total, cache[0] = t1((target.params, target.enc), one, pos, cache[0])
        return total

    setups = clock.time_interleaved(
        {
            "t1": step,
            "target": lambda: target.setup(target.params, target.enc),
            "draft": lambda: draft.setup(draft.params, draft.enc),
        },
        max(repeats // 2, 5),
    )
    per_step = [v / STEPS_PER_CALL for v in setups["t1"]]
    return {
        "target_step_ms": costs["target_step_ms"],
        "draft_step_ms": costs["draft_step_ms"],
        "c": costs["c"],
        "verify": {g: costs["block_step_ms"][g + 1] / costs["target_step_ms"] for g in GAMMAS},
        "target_setup_ms": statistics.median(setups["target"]),
        "draft_setup_ms": statistics.median(setups["draft"]),
        "target_setup_steps": clock.paired_ratio(setups["target"], per_step),
        "draft_setup_steps": clock.paired_ratio(setups["draft"], per_step),
    }


def measure_pairs(pairs: dict, passes: int, repeats: int) -> dict:
    """`pair_costs_once` of every (target, draft) pair, `passes` times, the pairs' order reversed
    on every other pass (the VM's speed drifts over minutes); medians over passes per quantity."""
    runs = {name: [] for name in pairs}
    for i in range(passes):
        for name in list(pairs)[:: 1 if i % 2 == 0 else -1]:
            print(f"pass {i + 1}/{passes}: {name}", flush=True)
            runs[name].append(pair_costs_once(*pairs[name], repeats))
    out = {}
    for name, results in runs.items():
        out[name] = {
            key: statistics.median(r[key] for r in results) for key in results[0] if key != "verify"
        }
        out[name]["verify"] = {
            g: statistics.median(r["verify"][g] for r in results) for g in GAMMAS
        }
        out[name]["passes"] = results
    return out


def train_step_seconds(shapes: dict, batch: int, length: int, repeats: int) -> dict:
    """Median seconds of one jitted training step per shape (Adafactor, T5X's loss, no dropout),
    the shapes interleaved round by round."""
    rng = np.random.default_rng(0)
    targets = jnp.asarray(rng.integers(2, 8192, (batch, length)), jnp.int32)
    data = {
        "encoder_input_tokens": jnp.asarray(rng.integers(2, 8192, (batch, length)), jnp.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0))),
    }
    key = jax.random.PRNGKey(0)
    calls = {}
    for name, cfg in shapes.items():
        module = network.Transformer(cfg)
        model = models.EncoderDecoderModel(module, None, None)
        opt = train.make_optimizer("adafactor", 1e-3, 10, 100)
        params = random_pair.random_params(module, 0)
        state = [train.TrainState(jnp.int32(0), params, opt.init(params))]
        step = train.make_train_step(model, opt, dropout=False)

        def run(step=step, state=state):
            state[0], metrics = step(state[0], data, key, None, None)
            return metrics

        calls[name] = run
    samples = clock.time_interleaved(calls, repeats, warmup=1)
    return {name: statistics.median(v) / 1e3 for name, v in samples.items()}


def predictions(costs: dict, alpha: float, tokens: float) -> dict:
    """Best-γ speed-ups at α: Thm 3.8 with the measured verify cost, and with set-up added
    (both sides pay the target's; speculative decoding the draft's too), in target steps."""
    out = {"thm38_measured_verify": {}, "with_setup": {}}
    for g in GAMMAS:
        loop = float(theory.measured_walltime_improvement(alpha, g, costs["c"], costs["verify"][g]))
        base = costs["target_setup_steps"] + tokens
        spec = costs["target_setup_steps"] + costs["draft_setup_steps"] + tokens / loop
        out["thm38_measured_verify"][g] = loop
        out["with_setup"][g] = base / spec
    for name in list(out):
        best = max(out[name], key=out[name].get)
        out[f"{name}_best"] = {"gamma": best, "speedup": out[name][best]}
    return out


def break_even_alpha(costs: dict, goal: float, tokens: float) -> float | None:
    """Smallest α (to 0.001) whose best-γ `with_setup` prediction reaches `goal`; None if none."""
    for a in np.arange(0.0, 0.9995, 0.001):
        if predictions(costs, float(a), tokens)["with_setup_best"]["speedup"] >= goal:
            return round(float(a), 3)
    return None


def table(result: dict) -> str:
    rows = [
        "| target shape | params | T(1) ms | draft ms | c | T(γ+1)/T(1) at best γ | set-up ms "
        f"(target + draft) | best γ: Thm 3.8 + verify at α {result['alpha']} | + set-up "
        "| break-even α | train step s (batch 24) | ≥ hours to plateau (this machine) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["shapes"].items():
        c, p = r["costs"], r["predictions"]
        g = p["with_setup_best"]["gamma"]
        rows.append(
            f"| {name} | {r['target_params'] / 1e6:.1f}M | {c['target_step_ms']:.3f} | "
            f"{c['draft_step_ms']:.3f} | {c['c']:.3f} | "
            f"{c['verify'][g]:.2f} (γ {g}) | "
            f"{c['target_setup_ms']:.1f} + {c['draft_setup_ms']:.1f} | "
            f"{p['thm38_measured_verify_best']['speedup']:.2f}X (γ "
            f"{p['thm38_measured_verify_best']['gamma']}) | {p['with_setup_best']['speedup']:.2f}X | "
            f"{r['break_even_alpha']} | {r['train_step_s']:.2f} | {r['train_hours']:.1f} |"
        )
    notes = [
        "",
        f"- α = {result['alpha']} is the shipped pair's DDTP validation α at T = 0; a decode of "
        f"{result['tokens']} tokens from a {result['enc_len']}-token source; break-even α: the α at "
        "which the shape's '+ set-up' prediction equals the shipped shape's at that α.",
        f"- Hours to plateau: {result['plateau_steps']} steps (the shipped shape's steps to its "
        "plateau, r1 → r4) × the measured step time (both cores); a lower bound for bigger shapes.",
        "- Random weights, float32 activations, CPU kernel on (draft weights bfloat16); "
        f"decoder costs in-loop, medians of {result['repeats']} interleaved rounds per pair, medians over {result['passes']} passes.",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- date: `{result['date']}`",
        f"- hardware: {provenance.hardware_description(result['hardware'])}",
        "",
    ]
    return "\n".join(rows) + "\n" + draft_table(result) + "\n".join(notes)


def draft_table(result: dict) -> str:
    rows = [
        "",
        f"Drafts for the shipped target (same measurements; break-even α against the shipped pair "
        f"at α {result['alpha']}):",
        "",
        "| draft shape | draft params | draft ms | c | best γ: Thm 3.8 + verify at α "
        f"{result['alpha']} | + set-up | break-even α |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["drafts"].items():
        c, p = r["costs"], r["predictions"]
        rows.append(
            f"| {name} | {r['draft_params'] / 1e6:.1f}M | {c['draft_step_ms']:.3f} | {c['c']:.3f} | "
            f"{p['thm38_measured_verify_best']['speedup']:.2f}X (γ "
            f"{p['thm38_measured_verify_best']['gamma']}) | {p['with_setup_best']['speedup']:.2f}X | "
            f"{r['break_even_alpha']} |"
        )
    return "\n".join(rows) + "\n"


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=0.579)
    parser.add_argument("--tokens", type=float, default=25.9)
    parser.add_argument("--enc_len", type=int, default=64)
    parser.add_argument("--max_len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--train_steps", type=int, default=6)
    parser.add_argument("--plateau_steps", type=int, default=5400)
    parser.add_argument("--out_dir", default="results/training/session15")
    args = parser.parse_args(argv)
    targets = {name: config(**shape) for name, shape in SHAPES.items()}
    draft_cfgs = {name: config(**shape) for name, shape in DRAFTS.items()}
    enc = jax.random.randint(jax.random.PRNGKey(0), (1, args.enc_len), 2, 8192).astype(jnp.int32)
    built_targets = {
        n: _Model(c, i, "float32", enc, args.max_len) for i, (n, c) in enumerate(targets.items())
    }
    built_drafts = {
        n: _Model(c, 10 + i, "bfloat16", enc, args.max_len)
        for i, (n, c) in enumerate(draft_cfgs.items())
    }
    shipped_target, shipped_draft = next(iter(SHAPES)), next(iter(DRAFTS))
    pairs = {("target", n): (m, built_drafts[shipped_draft]) for n, m in built_targets.items()}
    pairs.update(
        {
            ("draft", n): (built_targets[shipped_target], m)
            for n, m in built_drafts.items()
            if n != shipped_draft
        }
    )
    measured = measure_pairs(pairs, args.passes, args.repeats)
    seconds = train_step_seconds(targets, 24, 64, args.train_steps)
    shapes, drafts = {}, {}
    for name, cfg in targets.items():
        costs = measured[("target", name)]
        shapes[name] = {
            "config": random_pair.config_dict(cfg),
            "target_params": built_targets[name].num_params,
            "costs": costs,
            "predictions": predictions(costs, args.alpha, args.tokens),
            "train_step_s": seconds[name],
            "train_hours": seconds[name] * args.plateau_steps / 3600,
        }
    for name, cfg in draft_cfgs.items():
        costs = (
            measured[("draft", name)]
            if name != shipped_draft
            else measured[("target", shipped_target)]
        )
        drafts[name] = {
            "config": random_pair.config_dict(cfg),
            "draft_params": built_drafts[name].num_params,
            "costs": costs,
            "predictions": predictions(costs, args.alpha, args.tokens),
        }
    shipped = next(iter(shapes.values()))
    goal = shipped["predictions"]["with_setup_best"]["speedup"]
    for r in [*shapes.values(), *drafts.values()]:
        r["break_even_alpha"] = break_even_alpha(r["costs"], goal, args.tokens)
    result = {
        **{k: v for k, v in vars(args).items() if k != "out_dir"},
        "shapes": shapes,
        "drafts": drafts,
    }
    command = shlex.join(
        ["python", "scripts/target_shape_study.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(result, args.out_dir, "target_shapes", command, table)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
