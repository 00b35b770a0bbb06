"""Stand-in for `t5x.examples.t5.network`: `T5Config`'s field names and defaults only."""

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class T5Config:
    vocab_size: int
    dtype: Any = "float32"
    emb_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = False
    float32_attention_logits: bool = False


class Transformer:
    """Stand-in for T5X's example network (a user's model gin names it; never run here)."""

    def __init__(self, config: T5Config):
        self.config = config
