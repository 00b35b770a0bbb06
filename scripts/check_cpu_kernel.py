"""Greedy decodes with and without the CPU matmul kernel on DDTP test sentences (shipped models).

  python scripts/check_cpu_kernel.py --num_examples 100    # -> results/verify_cost/greedy_identity.json

Decodes the first N examples of the `ddtp_ende` test split with the shipped embedded target
(baseline greedy) with the kernel on (float32 and bfloat16 packed weights) and off
(`SPECDEC_CPU_KERNEL=0`, XLA's jnp.dot), and speculatively (shipped T5 draft, γ = 5) with the
kernel on; counts identical token sequences against the kernel-off baseline and lists the examples
that differ (first differing position). Batch 1, input/target length 64, as the eval job
(`checks.kernel_greedy_identity`).
"""

import argparse
import json
import pathlib
import shlex
import sys

from specdec_t5x import cpu_kernel, gin_utils, inputs, provenance
from specdec_t5x.eval import checks


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num_examples", type=int, default=100)
    p.add_argument("--gamma", type=int, default=5)
    p.add_argument("--out", default="results/verify_cost/greedy_identity.json")
    args = p.parse_args(argv)
    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK)"
    gin_utils.parse(["gin/experiments/embedded_ende_model_t0.gin"], [what], finalize=False)
    spec_model, raw_params, task = gin_utils.build()
    examples, _ = inputs.load_examples(task, "test", args.num_examples, 64, 64)
    result = checks.kernel_greedy_identity(spec_model, raw_params, examples, args.gamma)
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
