"""T5X checkpoints (`t5x/checkpoints.py`, VERSION 3) read and written without T5X.

On-disk format (as written by T5X's `t5x.checkpoints.Checkpointer.save` and read by
`t5x.checkpoints.load_t5x_checkpoint`)::

  <model_dir>/checkpoint_<step>/checkpoint         msgpack: {'version': 3, 'optimizer': STATE}
  <model_dir>/checkpoint_<step>/target.decoder.layers_0.self_attention.query.kernel/
      .zarray, 0.0, 1.0, ...                       one zarr (v2, gzip) array per partitioned leaf

  STATE = {'target': <param tree>, 'state': {'step': ..., 'param_states': ...}}

The same files one level down, in `checkpoint_<step>/state/`, are read too (T5X's `Checkpointer`
looks for `state/checkpoint` first). T5X's Orbax checkpoint manager (`OrbaxCheckpointManagerInterface`)
writes `checkpoint_<step>/state/` as an Orbax PyTree checkpoint instead (OCDBT: `_METADATA`,
`manifest.ocdbt`, `ocdbt.process_*/`) holding the same `{'target', 'state'}` tree; it is read with
orbax-checkpoint (TensorStore underneath), never parsed by hand. A msgpack leaf is either the array itself (flax's ext-encoded
ndarray, "written inline") or a TensorStore spec dict whose kvstore path is relative to the folder
holding the msgpack file (`{'driver': 'zarr', 'dtype': 'float32', 'kvstore': {'driver': 'file',
'path': 'target.encoder.layers_0.attention.query.kernel/'}, 'metadata': {'shape': [...], 'chunks':
[...], 'compressor': {'id': 'gzip'}}}`); GCS specs (`'driver': 'gcs'`, dummy bucket) are read
from the local copy of the same folder.

* `load_t5x_checkpoint` mirrors T5X's function of that name: the nested `{'target', 'state'}` dict,
  no model needed.
* `load_params_for_model` returns only the parameters, checked against a model's
  `jax.eval_shape` parameter shapes and read leaf by leaf (each device reads only its slice) into
  the requested shardings, so an 11B model never sits twice in host memory.
* `save_t5x_checkpoint` writes the msgpack + zarr format in `checkpoint_<step>/`, the layout T5X's
  `load_t5x_checkpoint` reads (it does not look into `state/`, so we write nothing there).

The leaf-level work (msgpack trees, TensorStore specs and zarr arrays, Orbax reads) is in
`checkpoint_leaves`.
"""

from __future__ import annotations

import os
import pathlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization

from specdec_t5x import checkpoint_leaves, network

VERSION = 3
CHECKPOINT_FILE = "checkpoint"
STATE_SUBDIR = "state"
_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")


class LazyArray:
    """A checkpoint leaf read only when `get()` is called (T5X's `LazyArray`, simplified).

    Attributes:
      shape: the array's shape.
      dtype: the dtype `get()` returns (after `restore_dtype`).
    """

    def __init__(self, shape: tuple[int, ...], dtype, read: Callable[[], np.ndarray]):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._read = read

    def get(self) -> np.ndarray:
        return self._read()

    def __repr__(self) -> str:
        return f"LazyArray(shape={self.shape}, dtype={self.dtype})"


def all_steps(model_dir: str | os.PathLike) -> list[int]:
    """Steps of the finished `checkpoint_<step>/` folders in `model_dir`, ascending."""
    steps = []
    for child in pathlib.Path(model_dir).iterdir() if pathlib.Path(model_dir).is_dir() else ():
        match = _STEP_DIR.match(child.name)
        if match and _checkpoint_in(child) is not None:
            steps.append(int(match.group(1)))
    return sorted(steps)


def _checkpoint_in(step_dir: pathlib.Path) -> pathlib.Path | None:
    """The msgpack file, or the Orbax `state/` folder, of a step folder (None if neither)."""
    for candidate in (step_dir / STATE_SUBDIR / CHECKPOINT_FILE, step_dir / CHECKPOINT_FILE):
        if candidate.is_file():
            return candidate
    if is_orbax_state(step_dir / STATE_SUBDIR):
        return step_dir / STATE_SUBDIR
    return None


def is_orbax_state(path: str | os.PathLike) -> bool:
    """True for a folder holding an Orbax PyTree checkpoint (T5X's Orbax `state/` layout)."""
    path = pathlib.Path(path)
    return path.is_dir() and any((path / f).is_file() for f in ("_METADATA", "manifest.ocdbt"))


def find_checkpoint(path: str | os.PathLike, step: int | None = None) -> pathlib.Path:
    """The msgpack `checkpoint` file, or the Orbax `state/` folder, of a checkpoint.

    Args:
      path: `checkpoint_<step>/`, a model folder holding several, the msgpack file itself, or an
        Orbax `state/` folder.
      step: step to pick in a model folder (None: the latest).

    Raises:
      FileNotFoundError: the path does not exist, holds no checkpoint, or lacks that step.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"T5X checkpoint path {str(path)!r} does not exist.")
    if path.is_file() or is_orbax_state(path):
        return path
    if step is not None and (path / f"checkpoint_{step}").is_dir():
        path = path / f"checkpoint_{step}"
    elif step is not None and path.name != f"checkpoint_{step}":
        raise FileNotFoundError(
            f"no checkpoint_{step}/ in {str(path)!r}; available steps: {all_steps(path)}."
        )
    found = _checkpoint_in(path)
    if found is not None:
        return found
    steps = all_steps(path)
    if steps:
        return _checkpoint_in(path / f"checkpoint_{steps[-1]}")
    raise FileNotFoundError(
        f"no T5X checkpoint in {str(path)!r}: expected a '{STATE_SUBDIR}/{CHECKPOINT_FILE}' or "
        f"'{CHECKPOINT_FILE}' msgpack file, an Orbax '{STATE_SUBDIR}/' folder, or "
        "checkpoint_<step>/ folders holding one."
    )


def _load_orbax(state_dir: pathlib.Path, restore_dtype, lazy: bool) -> dict[str, Any]:
    """`load_t5x_checkpoint` for T5X's Orbax layout: NumPy leaves, or `LazyArray`s."""
    metadata = checkpoint_leaves.orbax_metadata(state_dir)

    def spec(key):
        return jax.ShapeDtypeStruct(tuple(metadata[key].shape), metadata[key].dtype)

    def cast_for(key):
        return (
            restore_dtype
            if key[0] == "target" and checkpoint_leaves.is_float(metadata[key].dtype)
            else None
        )

    def read(keys):
        args = {k: ocp.RestoreArgs(restore_type=np.ndarray) for k in keys}
        flat = checkpoint_leaves.orbax_restore(state_dir, {k: spec(k) for k in keys}, args)
        return {k: checkpoint_leaves.cast_float(np.asarray(flat[k]), cast_for(k)) for k in keys}

    if not lazy:
        return checkpoint_leaves.unflatten(read(list(metadata)))
    return checkpoint_leaves.unflatten(
        {
            k: LazyArray(spec(k).shape, cast_for(k) or spec(k).dtype, lambda k=k: read([k])[k])
            for k in metadata
        }
    )


def load_t5x_checkpoint(
    path: str | os.PathLike,
    step: int | None = None,
    restore_dtype=None,
    lazy_parameters: bool = False,
) -> dict[str, Any]:
    """Loads a whole T5X checkpoint without a model (mirrors `t5x.checkpoints.load_t5x_checkpoint`).

    Args:
      path: `checkpoint_<step>/` (msgpack + zarr, or T5X's Orbax `state/` inside), a model folder
        holding several, the msgpack file or the Orbax `state/` folder.
      step: step to load from a model folder (None: the latest).
      restore_dtype: cast the floating `target` leaves to this dtype (None: as stored).
      lazy_parameters: return `LazyArray`s (read on `get()`) instead of arrays.

    Returns:
      The nested dict T5X returns: `{'target': params, 'state': {'step': ..., 'param_states':
      ...}, ...}` with np.ndarray (or `LazyArray`) leaves.

    Raises:
      FileNotFoundError: no checkpoint at `path` (or that step), or a leaf's array is missing.
      ValueError: not a T5X msgpack file, or a truncated/corrupt one (the message names it).
    """
    restore_dtype = None if restore_dtype is None else jnp.dtype(restore_dtype)
    msgpack_file = find_checkpoint(path, step)
    if msgpack_file.is_dir():  # T5X's Orbax layout
        return _load_orbax(msgpack_file, restore_dtype, lazy_parameters)
    ckpt_dir = msgpack_file.parent
    flat = checkpoint_leaves.flatten(checkpoint_leaves.read_optimizer_state(msgpack_file))
    out = {}
    for key, leaf in flat.items():
        if not (checkpoint_leaves.is_spec(leaf) or isinstance(leaf, np.ndarray | np.generic)):
            out[key] = leaf  # None or plain Python values
            continue
        name = "/".join(key)
        shape, dtype, read = checkpoint_leaves.leaf_reader(leaf, ckpt_dir, name)
        cast = restore_dtype if key[0] == "target" else None
        if lazy_parameters:
            out_dtype = cast if cast is not None and checkpoint_leaves.is_float(dtype) else dtype
            out[key] = LazyArray(
                shape, out_dtype, lambda r=read, c=cast: checkpoint_leaves.cast_float(r(), c)
            )
        else:
            out[key] = checkpoint_leaves.cast_float(np.asarray(read()), cast)
    return checkpoint_leaves.unflatten(out)


def _as_module(model) -> network.Transformer:
    if isinstance(model, network.T5Config):
        return network.Transformer(model)
    if isinstance(model, network.Transformer):
        return model
    if isinstance(getattr(model, "module", None), network.Transformer):
        return model.module  # a models.EncoderDecoderModel
    raise TypeError(f"expected a T5Config, Transformer or EncoderDecoderModel; got {type(model)}.")


def param_shapes(model) -> Any:
    """The parameter tree of `model` as `jax.ShapeDtypeStruct`s (no memory allocated).

    Args:
      model: a `network.T5Config`, `network.Transformer` or `models.EncoderDecoderModel`.
    """
    module = _as_module(model)
    ones = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    variables = jax.eval_shape(
        lambda e, d: module.init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False), ones, ones
    )
    return variables["params"]


def _check_against_model(
    found: Mapping[checkpoint_leaves.Name, Any],
    expected: Mapping[checkpoint_leaves.Name, Any],
    where: str,
):
    """Raises ValueError naming missing / unexpected parameters and shape mismatches."""
    show = lambda keys: (
        ", ".join("/".join(k) for k in keys[:10]) + (" ..." if len(keys) > 10 else "")
    )
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"T5X checkpoint {where} does not match the model's parameter names: "
            f"missing from the checkpoint: [{show(missing)}]; "
            f"not in the model: [{show(unexpected)}]."
        )
    for key in sorted(expected):
        shape = found[key]
        if tuple(shape) != tuple(expected[key]):
            raise ValueError(
                f"T5X checkpoint {where}: parameter {'/'.join(key)!r} has shape {tuple(shape)} "
                f"in the checkpoint but {tuple(expected[key])} in the model."
            )


def load_params_for_model(
    path: str | os.PathLike,
    model,
    dtype=jnp.bfloat16,
    shardings=None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """The `target` parameters of a T5X checkpoint, checked against `model` and placed on devices.

    Each leaf is read on its own (TensorStore reads only the slices the devices need), cast,
    and assembled with `jax.make_array_from_callback` into its sharding before the next leaf is
    read, so host memory holds at most one leaf at a time.

    Args:
      path: `checkpoint_<step>/`, a model folder (then `step` or the latest), the msgpack file or
        an Orbax `state/` folder (T5X's Orbax checkpoint manager's layout).
      model: `network.T5Config`, `network.Transformer` or `models.EncoderDecoderModel` (e.g. built
        by a gin/models file); its `jax.eval_shape` parameter tree is the expected one.
      dtype: floating parameters are cast to it (bfloat16 for inference; None keeps the stored
        dtype, float32 in T5X checkpoints).
      shardings: a `jax.sharding.Sharding` for every leaf, or a tree of them shaped like the
        params (e.g. `partitioning.param_shardings`), or None (default device).
      mesh: alternative to `shardings`: use `partitioning.param_shardings(model params, mesh)`.
      step: step to load from a model folder.

    Returns:
      The parameter tree (T5X names) of `jax.Array`s.

    Raises:
      FileNotFoundError: no checkpoint at `path`, or a leaf's zarr array is missing.
      ValueError: parameter names or shapes differ from the model's (the message names the
        parameter and both shapes).
    """
    dtype = None if dtype is None else jnp.dtype(dtype)  # also accepts 'bfloat16' from gin
    expected_tree = param_shapes(model)
    expected = {
        k: v.shape
        for k, v in checkpoint_leaves.flatten(checkpoint_leaves.tree_to_dict(expected_tree)).items()
    }
    msgpack_file = find_checkpoint(path, step)
    if msgpack_file.is_dir():  # T5X's Orbax layout
        metadata = checkpoint_leaves.orbax_metadata(msgpack_file)
        flat = {k[1:]: v for k, v in metadata.items() if k[0] == "target"}
        found = {k: tuple(v.shape) for k, v in flat.items()}
    else:
        state = checkpoint_leaves.read_optimizer_state(msgpack_file)
        if "target" not in state:
            raise ValueError(f"T5X checkpoint {msgpack_file} has no 'target' (params) entry.")
        flat = checkpoint_leaves.flatten(state["target"])
        found = {
            k: checkpoint_leaves.spec_shape(v) if checkpoint_leaves.is_spec(v) else np.shape(v)
            for k, v in flat.items()
            if v is not None
        }
    _check_against_model(found, expected, str(msgpack_file))
    if shardings is None and mesh is not None:
        from specdec_t5x import partitioning  # local: partitioning does not need checkpoints

        shardings = partitioning.param_shardings(expected_tree, mesh, _as_module(model))
    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        flat_shardings = dict.fromkeys(expected, shardings)
    else:
        flat_shardings = checkpoint_leaves.flatten(checkpoint_leaves.tree_to_dict(shardings))
    if msgpack_file.is_dir():  # Orbax reads each leaf straight into its sharding
        default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        args = {
            ("target",) + k: ocp.ArrayRestoreArgs(
                sharding=flat_shardings[k] or default,
                dtype=dtype
                if dtype is not None and checkpoint_leaves.is_float(flat[k].dtype)
                else None,
            )
            for k in expected
        }
        items = {("target",) + k: jax.ShapeDtypeStruct(found[k], flat[k].dtype) for k in expected}
        restored = checkpoint_leaves.orbax_restore(msgpack_file, items, args)
        return checkpoint_leaves.unflatten({k[1:]: v for k, v in restored.items()})
    params = {}
    for key in sorted(expected):
        params[key] = _place_leaf(flat[key], msgpack_file.parent, key, dtype, flat_shardings[key])
    return checkpoint_leaves.unflatten(params)


def _place_leaf(
    leaf, ckpt_dir: pathlib.Path, key: checkpoint_leaves.Name, dtype, sharding
) -> jax.Array:
    """Reads one leaf (slice by slice when sharded), casts it, puts it on its devices."""
    shape, _, read = checkpoint_leaves.leaf_reader(leaf, ckpt_dir, "/".join(key))
    if sharding is None:
        return jax.device_put(checkpoint_leaves.cast_float(np.asarray(read()), dtype))
    slices: dict[str, np.ndarray] = {}  # replicated slices are read once

    def callback(index):
        cache_key = repr(index)
        if cache_key not in slices:
            slices[cache_key] = checkpoint_leaves.cast_float(np.asarray(read(index)), dtype)
        return slices[cache_key]

    return jax.make_array_from_callback(tuple(shape), sharding, callback)


def save_t5x_checkpoint(
    params: Any,
    path: str | os.PathLike,
    step: int,
    *,
    param_states: Any = None,
    layout: str = "legacy",
    write_inline: Callable[[str], bool] | None = None,
    save_dtype=np.float32,
) -> pathlib.Path:
    """Writes `params` as a T5X checkpoint `path/checkpoint_<step>/` (atomic rename at the end).

    Args:
      params: parameter tree (T5X names), arrays of any dtype (sharded `jax.Array`s are written
        shard by shard).
      path: model folder; created if missing.
      step: training step (`state.step` in the checkpoint and the folder name).
      param_states: optional optimizer state tree written as `state.param_states`.
      layout: `'legacy'` only: msgpack and arrays in `checkpoint_<step>/`, the layout T5X's
        `load_t5x_checkpoint` reads (it does not look into `state/`, where T5X's own writer puts
        an Orbax checkpoint instead).
      write_inline: predicate on the dotted leaf name (`'target.encoder.encoder_norm.scale'`):
        True writes that leaf inline into the msgpack file, False as a zarr array. Scalars (the
        step) are always inline; by default every other array goes to zarr (as T5X does for
        partitioned parameters).
      save_dtype: dtype of the floating `target` leaves (T5X's default float32; None keeps).

    Returns:
      The checkpoint folder.

    Raises:
      FileExistsError: `checkpoint_<step>/` already exists.
      ValueError: a layout other than 'legacy'.
    """
    if layout != "legacy":
        raise ValueError(
            f"layout must be 'legacy' (the layout T5X's load_t5x_checkpoint reads); got {layout!r}."
        )
    model_dir = pathlib.Path(path)
    final_dir = model_dir / f"checkpoint_{int(step)}"
    if final_dir.exists():
        raise FileExistsError(f"{final_dir} already exists; T5X never overwrites a checkpoint.")
    tmp_dir = model_dir / f"checkpoint_{int(step)}.tmp-{int(time.time())}"
    data_dir = tmp_dir
    data_dir.mkdir(parents=True)
    state: dict[str, Any] = {"step": np.asarray(int(step), np.int32)}
    if param_states is not None:
        state["param_states"] = checkpoint_leaves.tree_to_dict(param_states)
    flat = checkpoint_leaves.flatten(
        {"target": checkpoint_leaves.tree_to_dict(params), "state": state}
    )
    written = {}
    for key, leaf in flat.items():
        name = ".".join(key)
        dtype = (
            save_dtype if key[0] == "target" and checkpoint_leaves.is_float(leaf.dtype) else None
        )
        inline = np.ndim(leaf) == 0 or (write_inline is not None and write_inline(name))
        if inline:
            written[key] = checkpoint_leaves.cast_float(np.asarray(leaf), dtype)
        else:
            written[key] = checkpoint_leaves.write_zarr(leaf, name, data_dir, dtype)
    contents = {"version": VERSION, "optimizer": checkpoint_leaves.unflatten(written)}
    (data_dir / CHECKPOINT_FILE).write_bytes(serialization.msgpack_serialize(contents))
    tmp_dir.rename(final_dir)
    return final_dir
