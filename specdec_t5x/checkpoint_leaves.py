"""The leaves of a T5X checkpoint on disk: msgpack trees, TensorStore (zarr) arrays, Orbax reads.

Helpers of `checkpoints` (which documents the format): flattening the nested msgpack tree to
{path tuple: leaf}, turning a stored TensorStore spec into a local one and reading or writing its
zarr array, and Orbax PyTree metadata and partial restores for T5X's Orbax `state/` layout.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from specdec_t5x import embedded

CHUNK_BYTES = 64 * 1024 * 1024  # T5X's desired zarr chunk size

Name = tuple[str, ...]  # a leaf's path from the tree's root


def flatten(tree: Any, prefix: Name = ()) -> dict[Name, Any]:
    """{path tuple: leaf}; TensorStore spec dicts are leaves, empty dicts are dropped."""
    if isinstance(tree, Mapping) and not is_spec(tree):
        flat = {}
        for key, value in tree.items():
            flat.update(flatten(value, prefix + (str(key),)))
        return flat
    return {prefix: tree}


def unflatten(flat: Mapping[Name, Any]) -> dict[str, Any]:
    """The nested dict of {path tuple: leaf} (inverse of `flatten`)."""
    tree: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def tree_to_dict(tree: Any) -> Any:
    """Nested plain dicts of a (possibly FrozenDict) parameter tree."""
    if isinstance(tree, Mapping):
        return {str(k): tree_to_dict(v) for k, v in tree.items()}
    return tree


def is_float(dtype) -> bool:
    """Whether `dtype` is a floating dtype (bfloat16 included)."""
    return jnp.issubdtype(np.dtype(dtype), jnp.floating)


def cast_float(array: np.ndarray, dtype) -> np.ndarray:
    """`array` cast to `dtype` if both are floating (None: unchanged); other arrays unchanged."""
    if dtype is None or not is_float(array.dtype):
        return array
    return np.asarray(array).astype(dtype)


def read_optimizer_state(msgpack_file: pathlib.Path) -> dict[str, Any]:
    """The `optimizer` dict of a msgpack file ({'target', 'state', ...}), leaves unread.

    Raises:
      ValueError: a TensorFlow checkpoint index, a truncated or corrupt file, or no 'optimizer'.
    """
    raw = msgpack_file.read_bytes()
    if raw.startswith(b"model_checkpoint_path"):
        raise ValueError(f"{msgpack_file} is a TensorFlow checkpoint index, not a T5X checkpoint.")
    contents = embedded.restore_msgpack(
        raw, f"T5X checkpoint file {msgpack_file} is truncated or corrupt"
    )
    if not isinstance(contents, dict):
        raise ValueError(f"{msgpack_file} does not hold a T5X checkpoint dict.")
    if contents.get("version", 0) == 0:  # version 0 stored the optimizer state at the top
        return contents
    if "optimizer" not in contents:
        raise ValueError(f"{msgpack_file} has no 'optimizer' entry; keys: {sorted(contents)}.")
    return contents["optimizer"]


def is_spec(leaf: Any) -> bool:
    """Whether a msgpack leaf is a TensorStore spec dict (the array lives in a zarr folder)."""
    return isinstance(leaf, dict) and {"driver", "kvstore"} <= set(leaf)


def spec_shape(spec: Mapping[str, Any]) -> tuple[int, ...]:
    """The array shape a TensorStore spec records (no data read)."""
    return tuple(int(d) for d in spec["metadata"]["shape"])


def jsonable(value: Any) -> Any:
    """A deep copy with NumPy arrays/scalars (as msgpack may return them) turned into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def absolute_spec(spec: Mapping[str, Any], ckpt_dir: pathlib.Path) -> dict[str, Any]:
    """A copy of a written spec readable from local disk (T5X's relative→absolute rewrite).

    GCS (`'gcs'`) and `'gfile'` kvstores become `'file'`; the relative path is joined to the
    folder holding the msgpack file (old specs keep the path at the top level).

    Raises:
      ValueError: a spec without a path, or a kvstore driver other than file, gfile or gcs.
    """
    spec = jsonable(spec)
    kvstore = dict(spec.get("kvstore", {}))
    rel = kvstore.get("path", spec.pop("path", None))
    if rel is None:
        raise ValueError(f"TensorStore spec without a path: {spec}.")
    spec["kvstore"] = {"driver": "file", "path": os.path.join(str(ckpt_dir), rel)}
    if kvstore.get("driver") not in ("file", "gfile", "gcs"):
        raise ValueError(f"unsupported TensorStore kvstore driver {kvstore.get('driver')!r}.")
    return spec


def open_store(spec: Mapping[str, Any], ckpt_dir: pathlib.Path, name: str) -> ts.TensorStore:
    """Opens the zarr array of one leaf. Raises FileNotFoundError naming the parameter."""
    absolute = absolute_spec(spec, ckpt_dir)
    try:
        return ts.open(absolute, open=True, read=True).result()
    except ValueError as err:  # tensorstore reports NOT_FOUND / FAILED_PRECONDITION this way
        raise FileNotFoundError(
            f"array of {name!r} missing or unreadable at {absolute['kvstore']['path']!r}: {err}"
        ) from err


def leaf_reader(leaf: Any, ckpt_dir: pathlib.Path, name: str):
    """(shape, dtype, read(index) -> np.ndarray) of an inline or TensorStore leaf."""
    if is_spec(leaf):
        store = open_store(leaf, ckpt_dir, name)
        return (
            store.shape,
            np.dtype(store.dtype.numpy_dtype),
            lambda idx=(): store[idx].read().result(),
        )
    array = np.asarray(leaf)
    return array.shape, array.dtype, lambda idx=(): array[idx]


def orbax_metadata(state_dir: pathlib.Path) -> dict[Name, Any]:
    """{path: Orbax leaf metadata (`.shape`, `.dtype`)} of an Orbax PyTree checkpoint; no data read."""
    metadata = ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).metadata(state_dir)
    return flatten(tree_to_dict(metadata.item_metadata.tree))


def orbax_restore(state_dir: pathlib.Path, items: Mapping[Name, Any], args: Mapping[Name, Any]):
    """Restores the leaves named in `items` (a partial restore) with their restore `args`."""
    restored = ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).restore(
        state_dir,
        args=ocp.args.PyTreeRestore(
            item=unflatten(items), restore_args=unflatten(args), partial_restore=True
        ),
    )
    return flatten(tree_to_dict(restored))


def choose_chunk_shape(write_shape: tuple[int, ...], target_elements: int) -> list[int]:
    """T5X's `_choose_chunk_shape`: largest divisor chunk with <= target_elements elements.

    Greedily shrinks the largest dimension to its next smaller divisor until the chunk fits.
    """
    factors = [[i for i in range(1, size + 1) if size % i == 0] or [1] for size in write_shape]
    while int(np.prod([f[-1] for f in factors])) > max(1, target_elements):
        dim = max(range(len(factors)), key=lambda i: factors[i][-1])
        factors[dim].pop()
    return [f[-1] for f in factors]


def write_zarr(leaf, name: str, data_dir: pathlib.Path, dtype) -> dict[str, Any]:
    """Writes one leaf as a gzip zarr array; returns the relative spec stored in the msgpack."""
    dtype = np.dtype(dtype if dtype is not None else leaf.dtype)
    shape = tuple(int(d) for d in leaf.shape)
    metadata = {
        "compressor": {"id": "gzip"},
        "shape": list(shape),
        "chunks": choose_chunk_shape(shape, CHUNK_BYTES // dtype.itemsize),
    }
    relative = {
        "driver": "zarr",
        "dtype": dtype.name,
        "kvstore": {"driver": "file", "path": name},
        "metadata": metadata,
    }
    relative = ts.Spec(relative).to_json()  # exactly what T5X writes (path gets a trailing '/')
    store = ts.open(absolute_spec(relative, data_dir), create=True, open=True).result()
    if isinstance(leaf, jax.Array) and len(leaf.addressable_shards) > 1:
        for shard in leaf.addressable_shards:  # never gathers the whole array on the host
            if shard.replica_id == 0:
                store[shard.index].write(np.asarray(shard.data).astype(dtype)).result()
    else:
        store.write(np.asarray(leaf).astype(dtype)).result()
    return relative
