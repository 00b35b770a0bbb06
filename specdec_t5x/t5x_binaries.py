"""Glue for T5X's own `t5x/infer.py` and `t5x/eval.py` (bound by `gin/t5x/speculative.gin`).

T5X's binaries build `MODEL` from gin, restore one checkpoint into the tree of
`MODEL.get_initial_variables`, shard it by its `params_axes` and call `MODEL.predict_batch_with_aux`
under pjit with that one tree. Two pieces let the speculative model live in that loop without
touching T5X:

* `network_from_config`: this project's `network.Transformer` (same parameter tree and numerics as
  `t5x.examples.t5.network.Transformer`, plus the multi-token decode cache speculative decoding
  needs) from the user's own T5X `T5Config`, so the model gin's sizes carry over unchanged.
* `AddDraftParams`: a T5X `RestoreStateTransformationFn` that adds the draft's parameters, read
  from the draft's own T5X checkpoint, under `target/draft` of the state T5X restores. With
  `models.SpeculativeEncoderDecoderModel(draft_in_params=True)` the draft is then part of the one
  parameter tree: an argument of T5X's jit (not a compile-time constant), restored in T5X's dtype,
  sharded by T5X's partitioner with the same logical axis rules as the target.

Nothing here imports T5X.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from specdec_t5x import checkpoints, network


def network_from_config(config: Any) -> network.Transformer:
    """This project's T5 network with the fields of any T5X-style `T5Config`.

    Args:
      config: `t5x.examples.t5.network.T5Config` (or any dataclass with `network.T5Config`'s field
        names, this project's own included).

    Returns:
      `network.Transformer(network.T5Config(...))` with every field `config` sets.

    Raises:
      ValueError: `config` has a field `network.T5Config` lacks (the message names it).
    """
    ours = {f.name for f in dataclasses.fields(network.T5Config)}
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    unknown = sorted(set(values) - ours)
    if unknown:
        raise ValueError(
            f"T5Config field(s) {unknown} of {type(config).__module__}.{type(config).__name__} "
            f"have no counterpart in specdec_t5x.network.T5Config (fields: {sorted(ours)})."
        )
    return network.Transformer(network.T5Config(**values))


class AddDraftParams:
    """T5X restore transformation: the draft's parameters under `target/draft`.

    T5X calls it as `fn(state_dict, target_state_dict)` (`RestoreCheckpointConfig.
    state_transformation_fns`) on the state read from the target's checkpoint, before it is
    matched against the model's initial variables (which hold a 'draft' subtree when the model has
    `draft_in_params=True`). The draft's arrays are read whole here (NumPy, as stored; T5X then
    casts them to its restore dtype and places them by their logical axes).

    Args:
      path: the draft's T5X checkpoint: `checkpoint_<step>/` (msgpack + zarr or Orbax `state/`)
        or a model folder (its latest step).

    Raises (when called):
      FileNotFoundError: no checkpoint at `path`.
      ValueError: the model's state (`target_state_dict`) has no 'draft' subtree (MODEL is not a
        speculative model with `draft_in_params`: gin/t5x/speculative.gin was included before
        the model gin), or the checkpoint's state already has one.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = path

    def __call__(
        self, state_dict: Mapping[str, Any], target_state_dict: Any = None, **unused: Any
    ) -> dict[str, Any]:
        expected = (
            target_state_dict.get("target") if isinstance(target_state_dict, Mapping) else None
        )
        if isinstance(expected, Mapping) and "draft" not in expected:
            raise ValueError(
                "the model being restored has no 'draft' parameters, so MODEL is not the "
                "speculative model: include gin/t5x/speculative.gin after your model gin (both set "
                "MODEL; the later one wins)."
            )
        if "draft" in state_dict["target"]:
            raise ValueError(
                f"the target checkpoint already has a 'draft' subtree; not adding {self.path}."
            )
        draft = checkpoints.load_t5x_checkpoint(self.path)["target"]
        return {**state_dict, "target": {**state_dict["target"], "draft": draft}}
