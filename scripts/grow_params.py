"""Grows a shipped (or saved) embedded model to a deeper/wider shape, keeping its function (`widen`).

    python scripts/grow_params.py --name=embedded_ende_draft --num_decoder_layers=2 \
        --out=/tmp/draft_2dec/params.msgpack

The new layers are copies whose output projections are zero (Net2Net-style deepening), so the grown
model's logits equal the original's; training (e.g. distillation with
`--gin.draft/network.T5Config.num_decoder_layers=2 --gin.DRAFT_PARAMS_PATH=...`) starts from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

# benchmarks/ sits beside the package (not installed with it): found from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import accelerator
from specdec_t5x import embedded, widen

_FIELDS = (
    "emb_dim",
    "num_heads",
    "head_dim",
    "mlp_dim",
    "num_encoder_layers",
    "num_decoder_layers",
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, choices=sorted(accelerator.EMBEDDED))
    parser.add_argument(
        "--params_path", default=None, help="load these weights instead of the shipped"
    )
    parser.add_argument("--out", required=True, help="msgpack file to write")
    for field in _FIELDS:
        parser.add_argument(f"--{field}", type=int, default=None, help="new value (default: kept)")
    args = parser.parse_args(argv)
    config = accelerator.EMBEDDED[args.name]
    changes = {f: getattr(args, f) for f in _FIELDS if getattr(args, f) is not None}
    new_config = widen.widen_config(config, dataclasses.replace(config, **changes))
    if args.params_path:
        params = embedded.load_params(path=args.params_path)
    else:
        params = embedded.load_params(name=args.name)
    grown = widen.widen(params, config, new_config)
    print(f"grew {args.name} ({changes}) to {embedded.save_params(grown, args.out)}")


if __name__ == "__main__":
    main()
