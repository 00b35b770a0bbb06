"""Parameters of the models shipped inside the package (`assets/models/<name>/params.msgpack`).

Each file is `flax.serialization.msgpack_serialize` of the plain nested-dict parameter tree (T5X
names, see `network`), stored in bfloat16 to keep the repository small; `load_params` upcasts to
float32. The architectures live in `gin/models/embedded_*.gin`; how the weights were trained is in
`scripts/train_embedded.sh` and `results/training/`.
"""

import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

MODELS_DIR = pathlib.Path(__file__).parent / "assets" / "models"
PARAMS_FILE = "params.msgpack"


def params_path(name: str) -> pathlib.Path:
    """Path of a shipped model's parameters, e.g. `params_path('embedded_ende_target')`."""
    return MODELS_DIR / name / PARAMS_FILE


def save_params(params: Any, path: str | os.PathLike, dtype: Any = jnp.bfloat16) -> pathlib.Path:
    """Writes a parameter tree as msgpack with its floating leaves cast to `dtype`.

    Args:
      params: nested dict of arrays (the `'params'` collection).
      path: output file; parent folders are created.
      dtype: storage dtype of floating-point leaves (bfloat16 halves the size of float32).

    Returns:
      The path written.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

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
      ValueError: neither or both of `name` and `path` given.
      FileNotFoundError: no such parameter file.
    """
    if (name is None) == (path is None):
        raise ValueError(f"give exactly one of name or path; got name={name!r}, path={path!r}.")
    path = params_path(name) if name is not None else pathlib.Path(path)
    if not path.is_file():
        shipped = sorted(p.parent.name for p in MODELS_DIR.glob(f"*/{PARAMS_FILE}"))
        hint = f" Shipped names: {', '.join(shipped)}." if name is not None else ""
        raise FileNotFoundError(f"no parameter file at {path}.{hint}")
    state = serialization.msgpack_restore(path.read_bytes())

    def cast(leaf):
        return jnp.asarray(leaf, dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

    return jax.tree_util.tree_map(cast, state)
