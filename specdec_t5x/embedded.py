"""Parameters of the models shipped inside the package (`assets/models/<name>/params.msgpack`).

Each file is `flax.serialization.msgpack_serialize` of the plain nested-dict parameter tree (T5X
names, see `network`), stored in bfloat16 to keep the repository small; `load_params` upcasts to
float32. The architectures live in `gin/models/embedded_*.gin`; how the weights were trained is in
`scripts/train_embedded.sh` and `results/training/`. A model fine-tuned from another shipped
one may store only the leaves it changed, with `base.json` naming the model that supplies the rest
(`save_params(base=...)`); `load_params` returns the whole tree.
"""

import hashlib
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util

MODELS_DIR = pathlib.Path(__file__).parent / "assets" / "models"
PARAMS_FILE = "params.msgpack"
BASE_FILE = "base.json"  # beside a partial fine-tune's params: {"base": name, "base_sha256": hex}


def params_path(name: str) -> pathlib.Path:
    """Path of a shipped model's parameters, e.g. `params_path('embedded_ende_target')`."""
    return MODELS_DIR / name / PARAMS_FILE


def restore_msgpack(raw: bytes, problem: str) -> Any:
    """`flax.serialization.msgpack_restore(raw)`: the decoded object (nested dicts of NumPy arrays
    and scalars for a parameter or checkpoint file).

    Args:
      raw: the file's bytes.
      problem: the start of the error message, naming the file (e.g. "parameter file x is
        truncated or not a parameter tree").

    Raises:
      ValueError: msgpack cannot decode `raw` (truncated or not msgpack): `problem`, then the byte
        count and msgpack's own message.
    """
    try:
        return serialization.msgpack_restore(raw)
    except Exception as e:  # msgpack raises bare ValueErrors ("Unpack failed: incomplete input")
        raise ValueError(f"{problem} ({len(raw)} bytes; msgpack could not decode it: {e}).") from e


def save_params(
    params: Any, path: str | os.PathLike, dtype: Any = jnp.bfloat16, base: str | None = None
) -> pathlib.Path:
    """Writes a parameter tree as msgpack with its floating leaves cast to `dtype`.

    Args:
      params: nested dict of arrays (the `'params'` collection); with `base`, only the leaves
        that differ from the base model's (a partial fine-tune, `training.freezing`).
      path: output file; parent folders are created.
      dtype: storage dtype of floating-point leaves (bfloat16 halves the size of float32).
      base: name of a shipped model (`params_path`) that supplies every leaf `params` lacks;
        recorded with its SHA-256 in `BASE_FILE` beside `path`, so `load_params` returns the
        whole tree and refuses a base that has changed since.

    Returns:
      The path written.

    Raises:
      FileNotFoundError: `base` is not a shipped model.
      ValueError: a leaf of `params` is not in `base` or has another shape (`merge_params`).
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = path.parent / BASE_FILE
    if base is not None:
        merge_params(load_params(name=base), params, what=f"{path} over base {base!r}")
        digest = hashlib.sha256(params_path(base).read_bytes()).hexdigest()
        record.write_text(json.dumps({"base": base, "base_sha256": digest}, indent=2) + "\n")
    elif record.exists():  # a full tree now: a stale base record would merge over it
        record.unlink()

    def cast(leaf):
        leaf = np.asarray(leaf)
        return leaf.astype(dtype) if np.issubdtype(leaf.dtype, np.floating) else leaf

    state = serialization.to_state_dict(jax.tree_util.tree_map(cast, params))
    path.write_bytes(serialization.msgpack_serialize(state))
    return path


def load_params(
    name: str | None = None, path: str | os.PathLike | None = None, dtype: Any = jnp.float32
) -> Any:
    """Reads a shipped (by `name`) or saved (by `path`) parameter tree, floats cast to `dtype`.

    Raises:
      ValueError: neither or both of `name` and `path` given; a file msgpack cannot decode
        (truncated, or not a parameter file: the message names it) or that holds no tree.
      FileNotFoundError: no such parameter file.
    """
    if (name is None) == (path is None):
        raise ValueError(f"give exactly one of name or path; got name={name!r}, path={path!r}.")
    path = params_path(name) if name is not None else pathlib.Path(path)
    if not path.is_file():
        shipped = sorted(p.parent.name for p in MODELS_DIR.glob(f"*/{PARAMS_FILE}"))
        hint = f" Shipped names: {', '.join(shipped)}." if name is not None else ""
        raise FileNotFoundError(f"no parameter file at {path}.{hint}")
    state = restore_msgpack(
        path.read_bytes(), f"parameter file {path} is truncated or not a parameter tree"
    )
    if not isinstance(state, dict):
        raise ValueError(
            f"parameter file {path} decodes to {type(state).__name__}, not a parameter tree "
            "(a nested dict of arrays, as `save_params` writes)."
        )

    def cast(leaf):
        return jnp.asarray(leaf, dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

    params = jax.tree_util.tree_map(cast, state)
    record = path.parent / BASE_FILE
    if not record.is_file():
        return params
    base = json.loads(record.read_text())
    digest = hashlib.sha256(params_path(base["base"]).read_bytes()).hexdigest()
    if digest != base["base_sha256"]:
        raise ValueError(
            f"{path} holds the leaves fine-tuned from {base['base']!r} with SHA-256 "
            f"{base['base_sha256']}, but {params_path(base['base'])} now has {digest}: the "
            "base model changed; retrain or restore it."
        )
    return merge_params(load_params(name=base["base"], dtype=dtype), params, what=str(path))


def merge_params(base: Any, changed: Any, what: str = "parameters") -> dict[str, Any]:
    """`base` (nested dict) with the leaves of `changed` (nested dict, a subset) in their place.

    Raises:
      ValueError: a leaf of `changed` is not in `base`, or has another shape.
    """
    out = traverse_util.flatten_dict(dict(base), sep="/")
    for key, leaf in traverse_util.flatten_dict(dict(changed), sep="/").items():
        if key not in out:
            raise ValueError(f"{what}: leaf {key!r} is not in the base parameters.")
        if tuple(np.shape(out[key])) != tuple(np.shape(leaf)):
            raise ValueError(
                f"{what}: leaf {key!r} has shape {tuple(np.shape(leaf))}, the base's "
                f"{tuple(np.shape(out[key]))}."
            )
        out[key] = leaf
    return traverse_util.unflatten_dict(out, sep="/")
