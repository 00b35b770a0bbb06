"""Checkpoints of `train`: orbax save/restore of the training state and data position, and export
of one checkpoint's parameters as an embedded params file (`embedded.save_params`).

The state is `train.TrainState` (step, params, optax state); a checkpoint also holds the data
stream's position and the training wall time, so a killed run resumes where it left off and replays
the same batches (T5X's `checkpoints.Checkpointer` keeps the dataset iterator the same way).
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import orbax.checkpoint as ocp

from specdec_t5x import embedded

logger = logging.getLogger(__name__)


class TrainCheckpoints:
    """Orbax checkpoints of a `TrainState` plus the data position and training wall time."""

    def __init__(self, directory: pathlib.Path, keep: int):
        self.manager = ocp.CheckpointManager(
            directory.absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_names=("state", "data"),
        )

    def restore(self, state, stream) -> tuple[Any, float]:
        """The latest checkpoint (state shaped like `state`; `stream` repositioned), or as is."""
        step = self.manager.latest_step()
        if step is None:
            return state, 0.0
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(state), data=ocp.args.JsonRestore()
        )
        restored = self.manager.restore(step, args=args)
        stream.restore(restored["data"])
        logger.info("Resumed from step %d (%s)", step, restored["data"])
        return restored["state"], float(restored["data"]["elapsed_s"])

    def save(self, state, stream, elapsed_s: float) -> None:
        data = {**stream.state(), "elapsed_s": elapsed_s}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data))
        self.manager.save(int(state.step), args=args)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def export_checkpoint(
    run_dir: str | os.PathLike,
    export_path: str | os.PathLike,
    step: int | None = None,
    export_dtype: Any = jnp.bfloat16,
    exclude: Sequence[str] = (),
) -> tuple[pathlib.Path, int]:
    """Writes the parameters of one of `train`'s orbax checkpoints as an embedded params file.

    What `train(export_path=...)` does at the end of a run, for a checkpoint taken mid-run (to
    measure a model while it still trains, or to ship the best step). The optimizer state is not
    read into a template: the checkpoint is restored as a plain tree and only `params` is kept.

    Args:
      run_dir: the run folder given to `train` (holds `checkpoints/`).
      export_path: msgpack file to write (`embedded.save_params`).
      step: which checkpoint; None = the latest.
      export_dtype: storage dtype of floating leaves (bfloat16 halves the size of float32).
      exclude: top-level subtrees left out (as `train(frozen_params=...)` leaves the frozen
        target encoder of a `network.TargetEncoderTransformer` draft out of its export).

    Returns:
      (path written, step exported).

    Raises:
      FileNotFoundError: `run_dir` holds no checkpoint (or not `step`).
    """
    directory = pathlib.Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoints folder in run_dir {str(run_dir)!r}.")
    manager = ocp.CheckpointManager(directory.absolute(), item_names=("state", "data"))
    try:
        steps = sorted(manager.all_steps())
        if step is None and steps:
            step = steps[-1]
        if step not in steps:
            raise FileNotFoundError(
                f"no checkpoint of step {step!r} in {str(directory)!r}; has {steps}."
            )
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    finally:
        manager.close()
    state = restored["state"]
    params = state["params"] if isinstance(state, Mapping) else state[1]
    params = {k: v for k, v in params.items() if k not in exclude}
    return embedded.save_params(params, export_path, export_dtype), int(step)
