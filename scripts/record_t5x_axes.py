"""Records T5X's logical axis names and shapes of every T5 1.1 parameter (small, base, xxl).

Builds T5X's own `t5x.examples.t5.network.Transformer` (google-research/t5x at commit
cc342d419ec3e3e9c4bf1df33c82330cafdc1e16) with the T5Config values of T5X's
t5x/examples/t5/t5_1_1/{small,base,xxl}.gin (dropout 0), runs `jax.eval_shape` of its `init` on
int32 [1, 8] inputs with enable_dropout=False (nothing is allocated, so xxl is cheap), converts the
'params_axes' collection with `flax.linen.partitioning.get_axis_names` and writes
tests/golden/t5x_params_axes.json:

    {"t5x_commit": "<sha>",
     "t5_configs": {"small": {<T5Config fields>}, "base": {...}, "xxl": {...}},
     "configs": {"small": {"decoder/layers_0/mlp/wi_0/kernel":
                               {"axes": ["embed", "mlp"], "shape": [512, 1024]}, ...},
                 "base": {...}, "xxl": {...}}}

Keys of "configs" are the 'params' tree paths joined by '/'; "axes" are T5X's logical axis names
(one per dimension), "shape" the parameter's shape. T5X is not a dependency of this project: run it
in an environment that has T5X's requirements, with a T5X source tree and stub packages for
`airio` and `jestimator` (imported by t5x/__init__.py, unused here) on PYTHONPATH:

    PYTHONPATH=/path/to/t5x:/path/to/stubs python scripts/record_t5x_axes.py
"""

import json
import pathlib

import jax
import jax.numpy as jnp
from flax import traverse_util
from flax.linen import partitioning
from t5x.examples.t5 import network

T5X_COMMIT = "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "golden" / "t5x_params_axes.json"
COMMON = dict(  # t5_1_1/base.gin, with DROPOUT_RATE = 0 as in T5X's eval and infer runs
    vocab_size=32128,
    dtype="bfloat16",
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
)
SIZES = {  # emb_dim, num_heads, num_encoder_layers, num_decoder_layers, head_dim, mlp_dim
    "small": (512, 6, 8, 8, 64, 1024),
    "base": (768, 12, 12, 12, 64, 2048),
    "xxl": (4096, 64, 24, 24, 64, 10240),
}
FIELDS = ("emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim", "mlp_dim")


def record(fields: dict) -> dict:
    """{'/'-joined param path: {"axes": [...], "shape": [...]}} for one T5Config."""
    module = network.Transformer(network.T5Config(**fields))
    tokens = jnp.ones((1, 8), jnp.int32)
    init = jax.eval_shape(
        lambda rng: module.init(rng, tokens, tokens, tokens, enable_dropout=False),
        jax.random.PRNGKey(0),
    )
    axes = traverse_util.flatten_dict(partitioning.get_axis_names(init["params_axes"]), sep="/")
    shapes = traverse_util.flatten_dict(init["params"], sep="/")
    if axes.keys() != shapes.keys():
        raise ValueError(f"params without axes: {sorted(shapes.keys() ^ axes.keys())}")
    return {k: {"axes": list(axes[k]), "shape": list(shapes[k].shape)} for k in sorted(shapes)}


def main() -> None:
    t5_configs = {
        name: {**COMMON, **dict(zip(FIELDS, dims, strict=True))} for name, dims in SIZES.items()
    }
    configs = {name: record(fields) for name, fields in t5_configs.items()}
    doc = {"t5x_commit": T5X_COMMIT, "t5_configs": t5_configs, "configs": configs}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{k} {len(v)} params" for k, v in configs.items()))


if __name__ == "__main__":
    main()
