"""Typed settings of a speculative decode: `Speculation` (what the draft proposes per iteration and
how the target verifies it), beside `sampling.SamplingSettings` (how both are sampled).

`speculative.speculative_sample` keeps T5X's gin-bindable keywords and builds both objects at its
top; the loop below it only sees the objects. `SpeculativeEncoderDecoderModel.decode` takes them
directly, and `split_decoder_params` is the one place where a T5X `decoder_params` dict becomes
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from specdec_t5x import sampling
from specdec_t5x import tree_shape as tree_lib
from specdec_t5x import verification as verify

Array = jax.Array

SAMPLING_KEYS = ("temperature", "topk", "topp")


@dataclasses.dataclass(frozen=True)
class Speculation:
    """One validated set of speculation settings (the paper's γ, or a draft token tree).

    A field left None is not set here: the decode fn's own default (given below) or its gin
    binding applies (T5X's binaries bind gamma on `speculative.speculative_sample`).
    `speculative_sample` builds one with every field resolved.

    Attributes:
      gamma: int >= 1, draft tokens per iteration (γ); with `tree`, None or the tree's depth.
      tree: None (a chain of γ drafts) or a draft token tree: per-depth branching factors, e.g.
        (3, 2, 1), child-rank paths, e.g. ((0,), (1,), (0, 0)), a row name or a
        `tree_shape.TreeShape`.
      tree_rule: the tree's acceptance rule at T > 0, one of `tree_shape.TREE_RULES` (default
        'without_replacement'); ignored without `tree`.
      verification: 'token' (default, Algorithm 1) or 'block' (Sun et al., ICLR 2025); see
        `verification.VERIFICATIONS`. A tree takes 'token' only.
      draft_confidence_threshold: float in [0, 1), early exit (default 0 = off): a row stops
        drafting after the first draft whose max q is below it. A tree takes 0 only.
      max_decode_steps: None (default: max_decode_len), an int in [0, max_decode_len] (checked
        against the inputs by `speculative_sample`) or an int32 scalar array (may be traced).

    Raises:
      ValueError: γ not an int >= 1, unknown verification, threshold outside [0, 1); with `tree`:
        a bad shape or rule, γ other than None or the tree's depth, block verification or early
        exit.
    """

    gamma: int | None = None
    tree: Any = None
    tree_rule: str | None = None
    verification: str | None = None
    draft_confidence_threshold: float | None = None
    max_decode_steps: int | Array | None = None

    def __post_init__(self):
        if self.tree is not None:
            self._check_tree()
            return
        gamma, verification = self.gamma, self.verification
        if gamma is not None and (not isinstance(gamma, int) or gamma < 1):
            hint = (
                " (γ = 'auto' is chosen outside jit: gamma_control.AutoGammaDecoder, or the eval "
                "job)"
                if gamma == "auto"
                else ""
            )
            raise ValueError(f"gamma must be an int >= 1; got gamma={gamma!r}{hint}.")
        if verification is not None and verification not in verify.VERIFICATIONS:
            raise ValueError(
                f"verification must be one of {verify.VERIFICATIONS}; got "
                f"verification={verification!r}."
            )
        threshold = self.draft_confidence_threshold
        if threshold is not None and (
            not isinstance(threshold, int | float) or not 0.0 <= threshold < 1.0
        ):
            raise ValueError(
                "draft_confidence_threshold must be a static number in [0, 1) (0 = off); got "
                f"draft_confidence_threshold={threshold!r}."
            )

    def _check_tree(self):
        shape = self.shape
        if self.gamma is not None and self.gamma != shape.max_depth:
            raise ValueError(
                f"gamma must be None or the tree's depth {shape.max_depth} with tree="
                f"{self.tree!r}; got gamma={self.gamma!r}."
            )
        if self.verification not in (None, "token") or self.draft_confidence_threshold:
            raise ValueError(
                "tree speculation has its own verification (tree_rule) and no early exit; got "
                f"verification={self.verification!r}, draft_confidence_threshold="
                f"{self.draft_confidence_threshold!r}."
            )
        if self.tree_rule is not None and self.tree_rule not in tree_lib.TREE_RULES:
            raise ValueError(
                f"tree_rule must be one of {tree_lib.TREE_RULES}; got tree_rule={self.tree_rule!r}."
            )

    @property
    def shape(self) -> tree_lib.TreeShape | None:
        """The tree's `TreeShape` (None for a chain)."""
        return None if self.tree is None else tree_lib.parse_tree(self.tree)

    @property
    def depth(self) -> int | None:
        """Most drafts one iteration can accept: γ, or the tree's depth (None when neither set)."""
        return self.gamma if self.tree is None else self.shape.max_depth

    def decoder_params(self) -> dict[str, Any]:
        """The set fields as keyword arguments of `speculative.speculative_sample`."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def split_decoder_params(
    decoder_params: Mapping[str, Any],
) -> tuple[sampling.SamplingSettings | None, Speculation | None, dict[str, Any]]:
    """A T5X `decoder_params` dict as the typed settings, and what they do not hold.

    The one place where the dict becomes settings (`SpeculativeEncoderDecoderModel.
    predict_batch_with_aux` then calls `decode` with them). What a setting object cannot carry
    stays a keyword as given, so the decode fn sees exactly the keywords the dict had (and its
    own defaults or gin bindings for the others): a sampling group that is not complete (all of
    temperature, topk and topp, each a Python number), speculation keys given as None, and keys
    of neither group (a custom decode fn's own).

    Args:
      decoder_params: keyword arguments for the decode fn (gamma, temperature, tree, ...).

    Returns:
      (`sampling.SamplingSettings` or None, `Speculation` or None, the other keywords).

    Raises:
      ValueError: settings that `sampling.SamplingSettings` or `Speculation` refuse.
    """
    rest = dict(decoder_params)
    names = [f.name for f in dataclasses.fields(Speculation)]
    given = {k: rest.pop(k) for k in names if rest.get(k) is not None}
    speculation = Speculation(**given) if given else None
    values = [rest.get(k) for k in SAMPLING_KEYS]
    if not all(map(_plain_number, values)):
        return None, speculation, rest
    for k in SAMPLING_KEYS:
        del rest[k]
    return sampling.SamplingSettings(*values), speculation, rest


def _plain_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
