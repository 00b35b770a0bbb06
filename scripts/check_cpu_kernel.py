"""Greedy decodes with and without the CPU matmul kernel on DDTP test sentences (shipped models).

  python scripts/check_cpu_kernel.py --num_examples 100    # -> results/verify_cost/greedy_identity.json

Decodes the first N examples of the `ddtp_ende` test split with the shipped embedded target
(baseline greedy) with the kernel on (float32 and bfloat16 packed weights) and off
(`SPECDEC_CPU_KERNEL=0`, XLA's jnp.dot), and speculatively (shipped T5 draft, γ = 5) with the
kernel on; counts identical token sequences against the kernel-off baseline and lists the examples
that differ (first differing position). Batch 1, input/target length 64, as the eval job.
"""

import argparse
import json
import pathlib
import shlex
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import cpu_kernel, eval_inputs, gin_utils, models, provenance


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num_examples", type=int, default=100)
    p.add_argument("--gamma", type=int, default=5)
    p.add_argument("--out", default="results/verify_cost/greedy_identity.json")
    args = p.parse_args(argv)
    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK)"
    gin_utils.parse(["gin/experiments/embedded_ende_model_t0.gin"], [what], finalize=False)
    spec_model, raw_params, task = gin_utils.build()
    examples, _ = eval_inputs.load_examples(task, "test", args.num_examples, 64, 64)

    base = models.EncoderDecoderModel(spec_model.module)
    greedy = {"temperature": 0.0, "topk": 0}
    variants = {}
    with cpu_kernel.env_setting(False):
        variants["xla"] = (raw_params, None)
    for dtype in ("float32", "bfloat16"):
        variants[f"kernel_{dtype}"] = (
            models.pack_params(spec_model.module, raw_params, dtype),
            None,
        )
    draft_params = spec_model.draft.pack_params(spec_model.draft.params)
    variants["kernel_speculative"] = (variants["kernel_float32"][0], draft_params)
    base_fn = jax.jit(lambda tp, b: base.predict_batch_with_aux(tp, b, decoder_params=greedy)[0])
    spec_fn = jax.jit(
        lambda tp, dp, b: spec_model.predict_batch_with_aux(
            tp, b, decoder_params={**greedy, "gamma": args.gamma}, draft_params=dp
        )[0]
    )
    tokens = {name: [] for name in variants}
    for ex in examples:
        enc = np.zeros((1, 64), np.int32)
        enc[0, : len(ex["inputs"])] = ex["inputs"][:64]
        batch = {
            "encoder_input_tokens": jnp.asarray(enc),
            "decoder_input_tokens": jnp.zeros((1, 64), jnp.int32),
        }
        for name, (tp, dp) in variants.items():
            with cpu_kernel.env_setting(
                name != "xla"
            ):  # jit traces on the first call, under this setting
                out = base_fn(tp, batch) if dp is None else spec_fn(tp, dp, batch)
            tokens[name].append(np.asarray(out)[0])
    ref = tokens["xla"]
    result = {"num_examples": len(examples), "variants": {}}
    for name, toks in tokens.items():
        diffs = [
            {"example": i, "first_position": int(np.nonzero(a != b)[0][0])}
            for i, (a, b) in enumerate(zip(toks, ref, strict=True))
            if not np.array_equal(a, b)
        ]
        result["variants"][name] = {"identical": len(toks) - len(diffs), "differing": diffs}
    result.update(
        reference="xla (SPECDEC_CPU_KERNEL=0, baseline greedy)",
        gamma=args.gamma,
        kernel_isa=cpu_kernel.isa(),
        command=shlex.join(["python", "scripts/check_cpu_kernel.py", *(argv or sys.argv[1:])]),
        commit=provenance.git_commit(),
        date=provenance.utc_date(),
        hardware=provenance.hardware_description(),
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["identical"] for k, v in result["variants"].items()}))
    return result


if __name__ == "__main__":
    main()
