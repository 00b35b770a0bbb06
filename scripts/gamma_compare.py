"""The auto-γ comparison table: fixed γ, auto γ (0 = off), auto + early exit, block verification.

One command, re-runnable with new models (the experiment gin files pick them):

  python scripts/gamma_compare.py [--num_examples=30] [--gammas=1,2,3,5] [--gamma_max=6] \
      [--exit_threshold=0.5] [--out=results/gamma_control] \
      [--gin_file=gin/experiments/embedded_ende_model_t0.gin ...] [--gin.KEY=VALUE ...]

Default experiments: the embedded En→De model pair at T = 0 and T = 1, and the summarization pair
(embedded_sum_*) when its weights are in `specdec_t5x/assets/models/`. Writes `metrics.json` and
`table.md` (with command, commit, hardware, load, date) to `--out`. See `benchmarks.gamma_compare`.
"""

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gin  # noqa: E402

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import gamma_compare
from specdec_t5x import embedded
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.eval import pairs

DEFAULT_EXPERIMENTS = [
    "gin/experiments/embedded_ende_model_t0.gin",
    "gin/experiments/embedded_ende_model_t1.gin",
]
SUMMARIZATION = [
    "gin/experiments/embedded_sum_model_t0.gin",
    "gin/experiments/embedded_sum_model_t1.gin",
]
if all(embedded.params_path(n).is_file() for n in ("embedded_sum_target", "embedded_sum_draft")):
    DEFAULT_EXPERIMENTS += SUMMARIZATION  # both tasks once the summarization pair is trained


def main(argv):
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--gin_file=")]
    bindings = [a[len("--gin.") :] for a in argv if a.startswith("--gin.")]
    num_examples = int(opts.get("num_examples", 30))
    results = {}
    for experiment in files or DEFAULT_EXPERIMENTS:
        gin.clear_config()
        spec_model, target_params, _ = pairs.load_pair_from_gin([experiment], bindings)
        query = lambda name: gin.query_parameter(f"%{name}")  # noqa: E731
        settings = {k.lower(): query(k) for k in ("TEMPERATURE", "TOPK", "TOPP")}
        examples, _, _ = inputs_lib.load_examples(
            query("TASK"),
            query("SPLIT"),
            num_examples,
            query("INPUT_LEN"),
            query("TARGET_LEN"),
            spec_model.output_vocabulary,
        )
        results[
            f"{os.path.basename(experiment)} ({query('TASK')}, T={settings['temperature']:g})"
        ] = gamma_compare.compare(
            spec_model,
            target_params,
            [e["inputs"] for e in examples],
            settings=settings,
            max_decode_len=query("TARGET_LEN"),
            input_len=query("INPUT_LEN"),
            gammas=[int(g) for g in opts.get("gammas", "1,2,3,5").split(",")],
            gamma_max=int(opts.get("gamma_max", 6)),
            exit_threshold=float(opts.get("exit_threshold", 0.5)),
        )
    command = "python scripts/gamma_compare.py " + " ".join(argv)
    print(gamma_compare.write(opts.get("out", "results/gamma_control"), results, command))


if __name__ == "__main__":
    main(sys.argv[1:])
