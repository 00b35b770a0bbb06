"""Stand-in for `t5x.utils`: `RestoreCheckpointConfig`'s fields that gin binds."""

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass
class RestoreCheckpointConfig:
    path: Any = None
    mode: str = "latest"
    dtype: str | None = None
    state_transformation_fns: Sequence[Any] = ()
