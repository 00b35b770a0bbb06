"""Greedy speed-ups side by side: HF `generate(assistant_model=draft)` vs our speculative decoding.

Needs the [hf] extra (torch CPU + transformers). Exports the experiment's target and T5 draft to
HF format, decodes the same task examples with HF's greedy baseline and assisted generation and
with our baseline and speculative samplers, and writes `<out_dir>/<name>.json` / `.md` (times,
speed-ups against each implementation's own baseline, exactness counts, command, commit,
hardware, date) plus the operative gin config.

  python scripts/bench_vs_hf.py --gin_file gin/experiments/embedded_ende_model_t0.gin \
      --num_examples 50 --out_dir results/vs_hf
"""

import argparse
import pathlib
import shlex
import sys
import tempfile

from specdec_t5x import gin_utils, provenance
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.bench import vs_hf as vs_hf_lib
from specdec_t5x.eval import tables


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", required=True, help="experiment gin file")
    parser.add_argument("--gin", action="append", default=[], help="extra KEY=VALUE binding")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_examples", type=int, default=50)
    parser.add_argument("--input_len", type=int, default=64)
    parser.add_argument("--target_len", type=int, default=64)
    parser.add_argument("--out_dir", default="results/vs_hf")
    args = parser.parse_args(argv)

    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK, %GAMMA)"
    # HF's assisted generation runs the draft's full logits layer: so do we here (no shortlist).
    gin_utils.parse(args.gin_file, ["DRAFT_SHORTLIST = None", *args.gin, what], finalize=False)
    spec_model, target_params, task, gamma = gin_utils.build()
    examples, _, _ = inputs_lib.load_examples(
        task, args.split, args.num_examples, args.input_len, args.target_len
    )
    with tempfile.TemporaryDirectory() as work_dir:
        result = vs_hf_lib.compare_with_hf(
            spec_model,
            target_params,
            [ex["inputs"] for ex in examples],
            max_decode_len=args.target_len,
            gamma=int(gamma),
            work_dir=work_dir,
        )
    result.update(task=task, split=args.split, gin_files=args.gin_file)
    name = "_".join(pathlib.Path(f).stem for f in args.gin_file)
    command = shlex.join(
        ["python", "scripts/bench_vs_hf.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(result, args.out_dir, name, command, tables.hf_comparison_table)
    path.with_suffix(".gin").write_text(gin_utils.operative_config())
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
