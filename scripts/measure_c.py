"""Measures c (draft step / target step) and the γ+1 verify cost for two gin model sizes.

Random weights, no checkpoint needed. Writes `<out_dir>/<target>_vs_<draft>_<dtype>_b<batch>.json`
and `.md` (table, command, commit, hardware, date) plus each model's operative gin config.

  python scripts/measure_c.py --target small --draft tiny --dtype float32 --batch 1
  python scripts/measure_c.py --target gin/models/t5_1_1_xxl.gin --draft small --gin NUM_EMBEDDINGS=32128
"""

import argparse
import pathlib
import shlex
import sys

import gin

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import random_pair
from specdec_t5x import gin_utils, provenance
from specdec_t5x.eval import tables


def build_config(model: str, dtype: str, bindings: list[str]):
    """The T5Config bound by `gin/models/t5_1_1_<model>.gin` (or a gin file path)."""
    gin.clear_config(clear_constants=True)
    name = model if model.endswith(".gin") else f"gin/models/t5_1_1_{model}.gin"
    gin_utils.parse(
        [name],
        ["DROPOUT_RATE = 0.0", f"ACTIVATION_DTYPE = '{dtype}'", *bindings]
        + ["gin_utils.build.obj = @network.T5Config()"],
        finalize=False,
    )
    config, operative = gin_utils.build(), gin_utils.operative_config()
    gin.clear_config(clear_constants=True)
    return config, operative


def main(argv=None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", default="small", help="model size (tiny, small, ...) or gin file"
    )
    parser.add_argument("--draft", default="tiny", help="model size or gin file")
    parser.add_argument("--dtype", default="float32", help="ACTIVATION_DTYPE (float32, bfloat16)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--enc_len", type=int, default=64)
    parser.add_argument("--max_len", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--gin", action="append", default=[], help="extra KEY=VALUE binding (both models)"
    )
    parser.add_argument("--out_dir", default="results/cost")
    args = parser.parse_args(argv)

    target_config, target_gin = build_config(args.target, args.dtype, args.gin)
    draft_config, draft_gin = build_config(args.draft, args.dtype, args.gin)
    result = random_pair.measure_step_costs(
        target_config,
        draft_config,
        batch=args.batch,
        enc_len=args.enc_len,
        max_len=args.max_len,
        gamma=args.gamma,
        repeats=args.repeats,
    )
    target, draft = pathlib.Path(args.target).stem, pathlib.Path(args.draft).stem
    result.update(target=target, draft=draft)
    name = f"{target}_vs_{draft}_{args.dtype}_b{args.batch}"
    command = shlex.join(
        ["python", "scripts/measure_c.py", *(sys.argv[1:] if argv is None else argv)]
    )
    path = provenance.write_results(result, args.out_dir, name, command, tables.step_cost_table)
    path.with_suffix(".target.gin").write_text(target_gin)
    path.with_suffix(".draft.gin").write_text(draft_gin)
    print(path.with_suffix(".md").read_text())
    return path


if __name__ == "__main__":
    main()
