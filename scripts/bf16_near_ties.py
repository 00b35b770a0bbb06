"""bf16 greedy speculative vs baseline: identical fraction and flipped near-ties, ± float32 final logits.

Decodes the first N examples of the experiment's task with the greedy baseline
(`decoding.temperature_sample`, target alone) and greedy speculative decoding (γ from the gin file),
both in one batch, with bfloat16 activations, once with T5X's numerics and once with
`T5Config.float32_final_logits=True` on target and draft. For each example whose tokens differ it
reports the first differing position, the target's top-2 logit gap there (teacher-forced on the
baseline prefix, `reports.near_tie_report`) and the bfloat16 spacing at the top logit. Writes
`<out_dir>/bf16_near_ties.json` / `.md` with command, commit, hardware and date.

  python scripts/bf16_near_ties.py --gin_file gin/experiments/embedded_ende_model_t0.gin \
      --num_examples 24 --out_dir results/bf16
"""

import argparse
import shlex
import sys

import gin

from specdec_t5x import gin_utils, inputs, provenance
from specdec_t5x.eval import checks


def run_setting(gin_files, bindings, examples, input_len, target_len):
    """`checks.greedy_flip_report` of `examples` for one numerics setting (gin bindings)."""
    gin.clear_config()
    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %GAMMA)"
    gin_utils.parse(gin_files, [*bindings, what], finalize=False)
    spec_model, target_params, gamma = gin_utils.build()
    report = checks.greedy_flip_report(
        spec_model, target_params, gamma, examples, input_len, target_len
    )
    return {"bindings": list(bindings), **report}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", required=True)
    parser.add_argument("--num_examples", type=int, default=24)
    parser.add_argument("--split", default="test")
    parser.add_argument("--input_len", type=int, default=64)
    parser.add_argument("--target_len", type=int, default=64)
    parser.add_argument("--out_dir", default="results/bf16")
    args = parser.parse_args(argv)
    bf16 = ["ACTIVATION_DTYPE = 'bfloat16'"]
    f32_logits = [
        "target/network.T5Config.float32_final_logits = True",
        "draft/network.T5Config.float32_final_logits = True",
    ]
    gin_utils.parse(args.gin_file, ["gin_utils.build.obj = %TASK"], finalize=False)
    task = gin_utils.build()
    examples, _ = inputs.load_examples(
        task, args.split, args.num_examples, args.input_len, args.target_len
    )
    settings = {"bf16 (T5X numerics)": bf16, "bf16 + float32_final_logits": bf16 + f32_logits}
    result = {"task": task, "split": args.split, "num_examples": len(examples), "settings": {}}
    for name, bindings in settings.items():
        result["settings"][name] = run_setting(
            args.gin_file, bindings, examples, args.input_len, args.target_len
        )
        print(name, {k: v for k, v in result["settings"][name].items() if k != "flips"})
    command = shlex.join(
        ["python", "scripts/bf16_near_ties.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(
        result, args.out_dir, "bf16_near_ties", command, checks.flip_table
    )
    print(path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
