"""Entry point of the main job: `python -m specdec_t5x.eval --gin_file=... [--gin.KEY=VALUE ...]`.

T5X-style flags: `--gin_file` (repeatable; paths or names relative to the repository, e.g.
`gin/experiments/embedded_ende_model_t0.gin`) and `--gin.KEY=VALUE` bindings (e.g.
`--gin.NUM_EXAMPLES=20`, `--gin.EVAL_OUTPUT_DIR="'/tmp/out'"`). Runs `job.evaluate` as bound
by `gin/runs/eval.gin`, saves the operative config with the results and prints the table row.
Several processes (`multihost`): add T5X's `--coordinator_address=HOST:PORT --process_count=N
--process_index=I` (or `--multiprocess` where `jax.distributed` detects them).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Sequence

import gin

from specdec_t5x import decoding, gin_utils, multihost, provenance, speculative
from specdec_t5x.eval import job, tables

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow (imported by seqio) is chatty


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


# Every argument of the two samplers is set by the job: GAMMA / TEMPERATURE / TOPK / TOPP / SEED /
# TARGET_LEN through `job.evaluate`, the rest by the models per call (T5X's keywords) or left
# at their defaults for baseline and speculative decoding alike (token verification, no early exit:
# block verification and early exit are compared by scripts/gamma_control_table.py). A gin binding
# of any of them would be overridden, or would change one decoder or one row only, so it is an error.
PER_CALL_PARAMETERS = [
    *(f"speculative.speculative_sample.{p}" for p in _parameters(speculative.speculative_sample)),
    *(f"decoding.temperature_sample.{p}" for p in _parameters(decoding.temperature_sample)),
    *(
        f"models.{m}.default_decoder_params"
        for m in ("EncoderDecoderModel", "SpeculativeEncoderDecoderModel")
    ),
]
PER_CALL_ROUTE = (
    "the GAMMA / TEMPERATURE / TOPK / TOPP / SEED / TARGET_LEN macros (e.g. --gin.GAMMA=3); every "
    "row verifies token by token without early exit (block verification and early exit: "
    "scripts/gamma_control_table.py)"
)


def parse_config(files: Sequence[str], bindings: Sequence[str], finalize: bool = True) -> None:
    """Parses `gin/runs/eval.gin` + files + bindings; rejects bindings the job cannot honour.

    Raises:
      ValueError: an unset required macro, a macro binding nothing uses (a typo), or a binding of
        a sampler parameter the job sets per call (`PER_CALL_PARAMETERS`).
    """
    gin_utils.parse(["gin/runs/eval.gin", *files], bindings, finalize=False)
    gin_utils.reject_bindings(PER_CALL_PARAMETERS, PER_CALL_ROUTE)
    if finalize:
        gin.finalize()


def parse_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits argv into gin files and bindings; raises ValueError on anything else."""
    files, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin_file="):
            files.append(arg.split("=", 1)[1])
        elif arg.startswith("--gin."):
            bindings.append(arg[len("--gin.") :])
        else:
            raise ValueError(
                f"unknown argument {arg!r}; expected --gin_file=FILE or --gin.KEY=VALUE."
            )
    if not files:
        raise ValueError("at least one --gin_file is required (see gin/experiments/).")
    return files, bindings


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, distributed = multihost.split_flags(argv)  # T5X's --coordinator_address etc.
    if distributed is not None:
        multihost.initialize(**distributed)  # before any JAX work (gin may load parameters)
    files, bindings = parse_flags(rest)
    parse_config(files, bindings)
    evaluate = gin.get_configurable(job.evaluate)
    metrics = evaluate(command="python -m specdec_t5x.eval " + " ".join(argv))
    # Written once, after the call: only then does the operative config hold every value used.
    out_dir = gin.query_parameter("%EVAL_OUTPUT_DIR")
    provenance.write_operative_config(out_dir, gin_utils.operative_config())
    print(tables.TABLE_HEADER)
    print(tables.table_row(metrics))
    print(json.dumps({k: metrics[k] for k in ("identical_fraction", "speedup")}))
    if "weight_flips" in metrics:  # CPU_WEIGHT_DTYPE='bfloat16': what the rounding changed
        flips = metrics["weight_flips"]
        print(
            f"bfloat16 CPU weights: {flips['num_flipped']} of {metrics['num_examples']} greedy "
            f"baselines differ from float32 weights (max float32 logit gap at the flip: "
            f"{flips['max_float32_logit_gap']}); details: metrics.json 'weight_flips'"
        )
    print(f"results: {out_dir}")
    return metrics


if __name__ == "__main__":
    main()
