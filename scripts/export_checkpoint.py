"""Exports the parameters of a training checkpoint (`scripts/train.py`'s orbax folder) as msgpack.

    python scripts/export_checkpoint.py --run_dir=train_runs/embedded_ende_target \
        --out=/tmp/target/params.msgpack [--step=1200] [--dtype=bfloat16]

The file loads with `--gin.TARGET_PARAMS_PATH=...` / `--gin.DRAFT_PARAMS_PATH=...` (or
`embedded.load_params(path=...)`), as the export `train` writes at the end of a run does.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp

from specdec_t5x import drafts
from specdec_t5x.training import checkpoints as train_checkpoints


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True, help="the run folder (holds checkpoints/)")
    parser.add_argument("--out", required=True, help="msgpack file to write")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument(
        "--draft_only",
        action="store_true",
        help="leave the target's encoder out (a network.TargetEncoderTransformer draft's run)",
    )
    args = parser.parse_args(argv)
    exclude = tuple(drafts.TARGET_ENCODER_SUBTREES) if args.draft_only else ()
    path, step = train_checkpoints.export_checkpoint(
        args.run_dir, args.out, step=args.step, export_dtype=jnp.dtype(args.dtype), exclude=exclude
    )
    print(f"exported step {step} of {args.run_dir} to {path}")


if __name__ == "__main__":
    main()
