"""Greedy speed-ups side by side: HF `generate` (prompt lookup, assistant) vs our speculative decoding.

Needs the [hf] extra (torch CPU + transformers). Exports the experiment's target (and T5 draft)
to HF format, decodes the same task examples with HF's greedy baseline, HF prompt lookup
(`prompt_lookup_num_tokens=γ`), HF assisted generation (where the draft is a T5 model) and with
our baseline and speculative sampler (the experiment's draft: T5, source copy, aligned copy),
and writes `<out_dir>/<name>.json` / `.md` (times, speed-ups against each implementation's own
baseline, tokens per target call, exactness counts, command, commit, hardware, date) plus the
operative gin config. Input and decode lengths default to the experiment's INPUT_LEN /
TARGET_LEN macros (else 64).

  python scripts/bench_vs_hf.py --gin_file gin/experiments/embedded_ende_model_t0.gin \
      --num_examples 50 --out_dir results/vs_hf
  python scripts/bench_vs_hf.py --gin_file gin/experiments/embedded_correct_aligned_copy_t0.gin \
      --num_examples 50 --out_dir results/vs_hf
"""

import argparse
import pathlib
import shlex
import sys
import tempfile

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import vs_hf as vs_hf_lib
from specdec_t5x import gin_utils, provenance
from specdec_t5x import inputs as inputs_lib
from specdec_t5x.eval import tables


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", required=True, help="experiment gin file")
    parser.add_argument("--gin", action="append", default=[], help="extra KEY=VALUE binding")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_examples", type=int, default=50)
    parser.add_argument("--input_len", type=int, help="default: INPUT_LEN of the gin, else 64")
    parser.add_argument("--target_len", type=int, help="default: TARGET_LEN of the gin, else 64")
    parser.add_argument("--out_dir", default="results/vs_hf")
    args = parser.parse_args(argv)

    what = "gin_utils.build.obj = (%SPEC_MODEL, %TARGET_PARAMS, %TASK, %GAMMA)"
    gin_utils.parse(args.gin_file, [*args.gin, what], finalize=False)
    if "DRAFT_SHORTLIST" in gin_utils.defined_macros():
        # HF's assisted generation runs the draft's full logits layer: so do we (no shortlist).
        gin_utils.parse(args.gin_file, ["DRAFT_SHORTLIST = None", *args.gin, what], finalize=False)
    input_len = args.input_len or gin_utils.query_macro("INPUT_LEN", 64)
    target_len = args.target_len or gin_utils.query_macro("TARGET_LEN", 64)
    draft_name = gin_utils.query_macro("DRAFT_NAME")
    spec_model, target_params, task, gamma = gin_utils.build()
    examples, _, _ = inputs_lib.load_examples(
        task, args.split, args.num_examples, input_len, target_len
    )
    with tempfile.TemporaryDirectory() as work_dir:
        result = vs_hf_lib.compare_with_hf(
            spec_model,
            target_params,
            [ex["inputs"] for ex in examples],
            max_decode_len=target_len,
            gamma=int(gamma),
            work_dir=work_dir,
            draft_name=draft_name,
        )
    result.update(task=task, split=args.split, gin_files=args.gin_file, input_len=input_len)
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
