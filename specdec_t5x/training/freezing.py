"""Which parameters a run trains: `/`-joined paths matched by patterns, for partial fine-tuning.

A pattern names a subtree by its path (`'encoder'`, `'decoder/logits_dense'`) or matches leaf paths
with shell wildcards (`'*/mlp/*'`, `'token_embedder/*'`). `train(frozen_params=...)` keeps every
matching leaf as it is (zero gradient, no optimizer update) and leaves it out of the export, so a
model fine-tuned from a shipped one is stored as the leaves it changed beside the name of the model
it changed (`embedded.save_params(base=...)`; `embedded.load_params` merges them back with
`embedded.merge_params`).

Example: the correction target fine-tunes the summarization target's attention and norms only
(`gin/runs/correct.gin`), which ships in 6 MB instead of 27 MB.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from flax import traverse_util


def matches(path: str, patterns: Sequence[str]) -> bool:
    """Whether the `/`-joined leaf `path` is inside a subtree or matches a wildcard of `patterns`."""
    return any(
        path == p or path.startswith(p.rstrip("/") + "/") or fnmatch.fnmatchcase(path, p)
        for p in patterns
    )


def flat(params: Mapping[str, Any]) -> dict[str, Any]:
    """`{'a/b/kernel': leaf}` of a nested parameter dict."""
    return traverse_util.flatten_dict(dict(params), sep="/")


def nested(leaves: Mapping[str, Any]) -> dict[str, Any]:
    """The nested parameter dict of `{'a/b/kernel': leaf}`."""
    return traverse_util.unflatten_dict(dict(leaves), sep="/")


def check_patterns(params: Mapping[str, Any], patterns: Sequence[str]) -> None:
    """Raises ValueError naming each pattern that matches no leaf of `params` (a typo would
    otherwise train everything)."""
    paths = list(flat(params))
    unused = [p for p in patterns if not any(matches(path, [p]) for path in paths)]
    if unused:
        tops = sorted({path.split("/")[0] for path in paths})
        raise ValueError(
            f"frozen_params {unused} match no parameter; paths look like "
            f"{paths[0]!r} (top-level subtrees {tops}); use a subtree path or a shell wildcard."
        )


def split(
    params: Mapping[str, Any], patterns: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trained, frozen) flat `{path: leaf}` dicts of `params` under `patterns` (`matches`)."""
    trained, frozen = {}, {}
    for path, leaf in flat(params).items():
        (frozen if matches(path, patterns) else trained)[path] = leaf
    return trained, frozen


def labels(params: Mapping[str, Any], patterns: Sequence[str]) -> dict[str, Any]:
    """`params`' structure with `'frozen'` / `'trained'` leaves, for `optax.multi_transform`."""
    return nested(
        {path: "frozen" if matches(path, patterns) else "trained" for path in flat(params)}
    )
