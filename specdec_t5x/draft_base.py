"""The draft contract (`Draft`): what `SpeculativeEncoderDecoderModel` calls on any draft.

`drafts` documents the contract and its drafts; the draft modules (`drafts`, `ngram_drafts`,
`source_copy_draft`, `copy_drafts`) subclass `Draft`, and `drafts` re-exports it.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from specdec_t5x import steps

Array = jax.Array


class Draft(Protocol):
    """What `SpeculativeEncoderDecoderModel` needs from a draft (every draft subclasses it)."""

    params: Any
    shares_target_encoder: bool = False  # True: decodes from the target's encoder output

    def init_cache(
        self, params, encoder_input_tokens: Array, max_decode_len: int, encoded=None
    ) -> Any:
        """The draft's fresh cache for int32 [batch, enc_len] inputs and L = max_decode_len
        (`encoded`: the target's encoder output, float32 [batch, enc_len, emb]; read only by
        drafts that share the target's encoder)."""
        ...

    def make_step(self, params, encoder_input_tokens: Array) -> steps.BlockStep:
        """The draft's block step over a cache from `init_cache` (same batch)."""
        ...

    def pack_params(self, params):
        """Parameters prepared for repeated decoding (T5 drafts: packed for the CPU kernel, see
        `steps.pack_params`); the default returns them unchanged."""
        return params

    def prepare(self, params, encoder_input_tokens: Array, max_decode_len: int, encoded=None):
        """Returns `(cache, step)`: `init_cache` and `make_step` for this batch."""
        params = self.pack_params(params)  # once, outside the decode loop
        cache = self.init_cache(params, encoder_input_tokens, max_decode_len, encoded)
        return cache, self.make_step(params, encoder_input_tokens)
