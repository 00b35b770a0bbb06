"""T5 v1.1 encoder-decoder in Flax linen with a multi-token, position-addressed decode cache.

Public surface and parameter tree follow T5X's `t5x/examples/t5/network.py` so T5X gin files and
checkpoints carry over: `T5Config` (same field names), `Transformer.__call__ / encode / decode` (same
argument names) and exactly T5X's parameter names (`token_embedder/embedding`,
`encoder/layers_{i}/attention/query/kernel`, ..., `decoder/logits_dense/kernel`).

This module assembles the layers, the encoder and decoder stacks and `Transformer`; the building
blocks live in `network_layers` (`T5Config`, relative position biases, `LayerNorm`, `Dense`,
`MlpBlock`, `Embed`) and `network_attention` (`MultiHeadAttention`, `TreeAttention`: the decode
cache's reads and writes), and every public name of both is importable from here.

What differs from T5X, on purpose, in `decode=True` mode (speculative decoding needs it):

* The decoder takes a *block* of k >= 1 tokens per example, `decoder_input_tokens int32 [batch, k]`,
  with `decoder_positions int32 [batch, k]` giving each token's absolute decoder position (rows may
  start at different positions). Cache entries are **written** (scatter, not added) at those positions
  and a query at position t attends to cache slots <= t only. Rolling back is calling again at an
  earlier position: stale slots are never read before they are overwritten.
* Cross-attention keys/values of the encoder output are projected once, when the cache is created, and
  read from the cache afterwards when a step passes `encoded=None` (T5X passes the encoder output and
  re-projects it at every step; given it, we do the same).
* T5X's own convention still works unchanged: a cached call without `decoder_positions` feeds its
  block at the cache's scalar `cache_index` and advances it, so T5X's `EncoderDecoderModel` (its
  `_compute_kv_cache` / `_compute_logits_from_slice`) decodes with this network as it is.

Numerics follow T5X's dtypes step by step (activations in `dtype`, parameters float32, layer norm
statistics in float32, attention logits/bias/softmax in `dtype` unless `float32_attention_logits`),
so in bfloat16 too the logits are T5X's bit for bit (on the same backend and kernels), teacher-forced
and through the decode cache. Activations are float32 or bfloat16 (`check_activation_dtype`:
float16 overflows T5X's -1e10 attention mask to -inf and is refused).

Cache layout per decoder layer (collection ``'cache'``)::

  decoder/layers_{i}/self_attention/cached_key           dtype [batch, heads, max_len, head_dim]
  decoder/layers_{i}/self_attention/cached_value         dtype [batch, heads, max_len, head_dim]
  decoder/layers_{i}/encoder_decoder_attention/cached_key    dtype [batch, heads, enc_len, head_dim]
  decoder/layers_{i}/encoder_decoder_attention/cached_value  dtype [batch, heads, enc_len, head_dim]
  decoder/cache_index                                     int32 [] (T5X-convention calls only)

Heads before length: the layout the CPU kernel's fused attention and XLA:CPU's heads-first dots
read where it lies on the packed-parameter path (`cpu_kernel.pack_params`, the CPU inference
default). Stored length-major, XLA:CPU copied every layer's cached K and V on every step (12 % of
the embedded target's step at 64 source tokens, 15 % at 256; `results/verify_cost/cache_layout/`).
With raw parameters (`SPECDEC_CPU_KERNEL=0`, accelerators), the path that claims T5X's numerics,
each call reads the cache as T5X reads its own ([batch, heads, head_dim, length], `_t5x_cache_read`):
contracted as it lies, XLA picks other float32 dot kernels and the cached logits drift ~2e-6 from
T5X's (`tests/test_t5x_cached_golden.py` compares them bitwise); that path pays the per-step copy.

Every other cache leaf carries the batch axis first, so T5X-style `num_decodes` expansion (which
skips leaves named `cache_index`) works unchanged.
The cache is created like T5X's: one `decode=True` apply with `mutable=['cache']` whose decoder inputs
have the full `[batch, max_decode_len]` shape (see `models.init_cache`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from specdec_t5x.network_attention import (
    NEG_INF,
    MultiHeadAttention,
    TreeAttention,
)
from specdec_t5x.network_attention import _t5x_cache_read as _t5x_cache_read  # tests read it here
from specdec_t5x.network_layers import (
    ACTIVATION_DTYPES,
    FEW_TOKENS,
    MAX_DISTANCE,
    NUM_BUCKETS,
    Dense,
    DType,
    Embed,
    LayerNorm,
    MlpBlock,
    RelativePositionBiases,
    T5Config,
    check_activation_dtype,
)
from specdec_t5x.network_layers import _bucket_table as _bucket_table  # tests read it here

__all__ = [  # this module's and, re-exported, `network_layers`' and `network_attention`'s
    "ACTIVATION_DTYPES",
    "FEW_TOKENS",
    "MAX_DISTANCE",
    "NEG_INF",
    "NUM_BUCKETS",
    "Decoder",
    "DecoderLayer",
    "Dense",
    "DType",
    "Embed",
    "Encoder",
    "EncoderLayer",
    "LayerNorm",
    "MlpBlock",
    "MultiHeadAttention",
    "RelativePositionBiases",
    "T5Config",
    "TargetEncoderTransformer",
    "Transformer",
    "TreeAttention",
    "check_activation_dtype",
]

Array = jax.Array


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x, mask, bias, enable_dropout):
        cfg = self.config
        drop = functools.partial(
            nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,)), deterministic=not enable_dropout
        )
        y = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="pre_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, name="attention")(
            y, y, mask, bias, enable_dropout=enable_dropout
        )
        x = x + drop(y)
        y = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="pre_mlp_layer_norm")(x)
        y = MlpBlock(cfg, name="mlp")(y, enable_dropout)
        return x + drop(y)


class DecoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(
        self, x, encoded, self_mask, cross_mask, bias, enable_dropout, decode, positions, tree=None
    ):
        cfg = self.config
        drop = functools.partial(
            nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,)), deterministic=not enable_dropout
        )
        y = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="pre_self_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, name="self_attention")(
            y,
            y,
            self_mask,
            bias,
            enable_dropout=enable_dropout,
            cache_mode="self" if decode else None,
            query_positions=positions,
            tree=tree,
        )
        x = x + drop(y)
        y = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="pre_cross_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, name="encoder_decoder_attention")(
            y,
            encoded,
            cross_mask,
            None,
            enable_dropout=enable_dropout,
            cache_mode="cross" if decode else None,
        )
        x = x + drop(y)
        y = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="pre_mlp_layer_norm")(x)
        y = MlpBlock(cfg, name="mlp")(y, enable_dropout)
        return x + drop(y)


def _positions_or_arange(positions: Array | None, tokens: Array) -> Array:
    if positions is not None:
        return positions.astype(jnp.int32)
    return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class Encoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, tokens, segment_ids=None, positions=None, enable_dropout=True):
        cfg = self.config
        positions = _positions_or_arange(positions, tokens)
        mask = (tokens > 0)[:, None, None, :] & (tokens > 0)[:, None, :, None]
        if segment_ids is not None:
            mask &= (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
        bias = RelativePositionBiases(cfg.num_heads, True, cfg.dtype, name="relpos_bias")(
            positions, positions
        )
        x = self.shared_embedding(tokens)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
        x = _layer_stack(EncoderLayer, cfg, cfg.num_encoder_layers, x, mask, bias, enable_dropout)
        x = LayerNorm(cfg.dtype, cfg.layer_norm_epsilon, name="encoder_norm")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=not enable_dropout)


class Decoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(
        self,
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens=None,
        encoder_segment_ids=None,
        decoder_segment_ids=None,
        decoder_positions=None,
        enable_dropout=True,
        decode=False,
        tree=None,
    ):
        cfg = self.config
        initialising = decode and not self.has_variable("cache", _first_layer(cfg))
        if decode:
            # T5X's cache index: the position of the next token fed without decoder_positions
            # (T5X's one-token-per-call convention). Calls with positions neither read nor move it.
            cache_index = self.variable("cache", "cache_index", jnp.zeros, (), jnp.int32)
            if not initialising and decoder_positions is None:
                k = decoder_input_tokens.shape[1]
                decoder_positions = jnp.broadcast_to(
                    cache_index.value + jnp.arange(k, dtype=jnp.int32), decoder_input_tokens.shape
                )
                cache_index.value = cache_index.value + k
        positions = _positions_or_arange(decoder_positions, decoder_input_tokens)
        enc_valid = encoder_input_tokens > 0  # [b, enc_len]
        if decode and not initialising:
            self_mask = None  # built from positions against the cache inside the attention
            cross_mask = jnp.broadcast_to(
                enc_valid[:, None, None, :],
                (enc_valid.shape[0], 1, decoder_input_tokens.shape[1], enc_valid.shape[1]),
            )
            key_positions = jnp.arange(_cache_len(self), dtype=jnp.int32)[None]
            if tree is not None:
                key_positions = tree.key_positions  # [b, max_len]
        else:
            targets = (
                decoder_input_tokens if decoder_target_tokens is None else decoder_target_tokens
            )
            valid = targets > 0 if not decode else jnp.ones_like(targets, bool)
            causal = positions[:, :, None] >= positions[:, None, :]
            self_mask = (causal & valid[:, :, None] & valid[:, None, :])[:, None]
            cross_mask = (valid[:, :, None] & enc_valid[:, None, :])[:, None]
            if decoder_segment_ids is not None:
                same = decoder_segment_ids[:, :, None] == decoder_segment_ids[:, None, :]
                self_mask &= same[:, None]
                cross_mask &= (decoder_segment_ids[:, :, None] == encoder_segment_ids[:, None, :])[
                    :, None
                ]
            key_positions = positions
        bias = RelativePositionBiases(cfg.num_heads, False, cfg.dtype, name="relpos_bias")(
            positions, jnp.broadcast_to(key_positions, (positions.shape[0], key_positions.shape[1]))
        )
        x = self.shared_embedding(decoder_input_tokens)
        x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
        x = _layer_stack(
            DecoderLayer,
            cfg,
            cfg.num_decoder_layers,
            x,
            encoded,
            self_mask,
            cross_mask,
            bias,
            enable_dropout,
            decode,
            positions,
            tree if decode and not initialising else None,
        )
        norm_dtype = jnp.float32 if cfg.float32_final_logits else cfg.dtype
        x = LayerNorm(norm_dtype, cfg.layer_norm_epsilon, name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=not enable_dropout)
        if cfg.logits_via_embedding:
            logits = self.shared_embedding.attend(x) / jnp.sqrt(x.shape[-1]).astype(x.dtype)
        else:
            logits = Dense(cfg.vocab_size, jnp.float32, ("embed", "vocab"), name="logits_dense")(x)
        return logits.astype(jnp.float32)  # [b, q, vocab]


def _cache_len(decoder: nn.Module) -> int:
    """Length (max_decode_len) of the decoder self-attention cache."""
    cache = decoder.variables["cache"][_first_layer(decoder.config)]
    return cache["self_attention"]["cached_key"].shape[-2]  # [(layers,) b, h, len, d]


def _first_layer(config: T5Config) -> str:
    return "layers" if config.scan_layers else "layers_0"


def _layer_stack(layer_cls, config: T5Config, num_layers: int, x: Array, *args) -> Array:
    """Applies `num_layers` layers `layer_cls(config)(x, *args)` in sequence (inside a compact
    method): as modules `layers_{i}` (T5X's names) or, with `config.scan_layers`, as one module
    `layers` under `nn.scan` whose parameters and cache leaves have a leading layer axis."""
    if not config.scan_layers:
        for i in range(num_layers):
            x = layer_cls(config, name=f"layers_{i}")(x, *args)
        return x

    def body(layer, carry, _):
        return layer(carry, *args), None

    scan = nn_partitioning.scan_with_axes(  # nn.scan that adds 'layers' to the params' axes
        body,
        variable_axes={"params": 0, "cache": 0},
        split_rngs={"params": True, "dropout": True},
        length=num_layers,
    )
    return scan(layer_cls(config, name="layers"), x, None)[0]


class Transformer(nn.Module):
    """T5 encoder-decoder with T5X's entry points and parameter tree.

    Mirrors `t5x.examples.t5.network.Transformer`; see the module docstring for the decode-mode
    contract (multi-token blocks at absolute positions, written cache, cached cross K/V).
    """

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(
        self,
        encoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        enable_dropout: bool = True,
        encoder_positions: Array | None = None,
    ) -> Array:
        """Encoder output.

        Args:
          encoder_input_tokens: int32 [batch, enc_len], 0 = padding.
          encoder_segment_ids: int32 [batch, enc_len] for packed inputs, or None.
          enable_dropout: dropout on (training) or off.
          encoder_positions: int32 [batch, enc_len] for packed inputs, or None (0..enc_len-1).

        Returns:
          dtype [batch, enc_len, emb].
        """
        if encoder_input_tokens.ndim != 2:
            raise ValueError(
                f"encoder_input_tokens must be int32 [batch, length]; got shape "
                f"{encoder_input_tokens.shape}."
            )
        return self.encoder(
            encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout
        )

    def decode(
        self,
        encoded: Array,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        decoder_target_tokens: Array | None = None,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        tree: TreeAttention | None = None,
    ) -> Array:
        """Decoder logits (teacher-forced, or one cached block when `decode=True`).

        Args:
          encoded: dtype [batch, enc_len, emb] encoder output. With `decode=True` and an existing
            cache, None reads the cross K/V cached when the cache was created (our block steps);
            an array is projected afresh, as T5X does at every step.
          encoder_input_tokens: int32 [batch, enc_len] (for the cross-attention padding mask).
          decoder_input_tokens: int32 [batch, k] (k = full length when teacher forcing or when
            creating the cache; any k >= 1 for a cached block).
          decoder_target_tokens: int32 [batch, k] or None; its zeros mark padding when teacher
            forcing (T5X semantics). Unused in cached decoding.
          encoder_segment_ids, decoder_segment_ids: int32 segment ids for packed training data.
          decoder_positions: int32 [batch, k] absolute decoder positions (rows may differ;
            rollback = calling again at earlier positions). In a cached call without them the
            block sits at the cache's `cache_index` (T5X's convention: positions index..index+k-1,
            then the index moves on by k); otherwise they default to 0..k-1.
          enable_dropout: dropout on (training) or off.
          decode: use/update the `'cache'` collection (apply with `mutable=['cache']`).
          max_decode_length: accepted for T5X compatibility; the cache length is the decoder input
            length of the cache-creating call.
          tree: with `decode=True` and an existing cache, the tokens are nodes of a token tree:
            their cache slots and visible slots (`TreeAttention`); `decoder_positions` then give
            each node's position (prefix length + depth) for the relative position bias.

        Returns:
          float32 [batch, k, vocab]; row j is the next-token logits after the token at
          `decoder_positions[:, j]`.

        Raises:
          ValueError: `decoder_positions` shape differs from `decoder_input_tokens`'.
        """
        del max_decode_length
        if decoder_positions is not None:
            if decoder_positions.shape != decoder_input_tokens.shape:
                raise ValueError(
                    f"decoder_positions shape {decoder_positions.shape} must equal "
                    f"decoder_input_tokens shape {decoder_input_tokens.shape}."
                )
        return self.decoder(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            decoder_target_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            decoder_positions,
            enable_dropout,
            decode,
            tree,
        )

    def __call__(
        self,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        decoder_target_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        decoder_positions: Array | None = None,
        *,
        enable_dropout: bool = True,
        decode: bool = False,
    ) -> Array:
        """Teacher-forced forward pass: float32 [batch, dec_len, vocab] logits (T5X `__call__`)."""
        encoded = self.encode(
            encoder_input_tokens, encoder_segment_ids, enable_dropout, encoder_positions
        )
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            decoder_target_tokens,
            encoder_segment_ids=encoder_segment_ids,
            decoder_segment_ids=decoder_segment_ids,
            decoder_positions=decoder_positions,
            enable_dropout=enable_dropout,
            decode=decode,
        )


class TargetEncoderTransformer(Transformer):
    """A draft whose decoder reads the *target's* encoder output (a decoder-only draft head).

    In an encoder-decoder model the draft's own encoder is a fixed cost per example that buys
    nothing the target has not already computed: the speculative decoder encodes the source with
    the target anyway. This draft has the target's encoder (`encoder_config`, the target's
    `T5Config`, with its own token embedder `encoder_token_embedder`) and a small decoder
    (`config`) whose cross-attention projects the target's encoder width. When decoding
    speculatively, `models.SpeculativeEncoderDecoderModel` hands it the target's encoder output, so
    the draft's set-up is only its cross-attention K/V projection (see `drafts.T5Draft`,
    `share_target_encoder`). Exactness does not depend on it: the draft is just another q.

    Parameter tree (T5X names): `token_embedder` and `decoder` (the draft's own: what is trained
    and shipped), `encoder_token_embedder/embedding` and `encoder/...` (the target's
    `token_embedder` and `encoder`, frozen in training: `drafts.with_target_encoder` builds the
    tree). Entry points are `Transformer`'s.

    Raises (at first use):
      ValueError: `encoder_config` missing, or its vocabulary differs from `config`'s.
    """

    encoder_config: T5Config | None = None

    def setup(self):
        cfg, ecfg = self.config, self.encoder_config
        if ecfg is None or ecfg.vocab_size != cfg.vocab_size:
            raise ValueError(
                "TargetEncoderTransformer needs encoder_config (the target's T5Config) with the "
                f"draft's vocab_size {cfg.vocab_size}; got "
                f"{None if ecfg is None else ecfg.vocab_size}."
            )
        self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
        self.encoder_token_embedder = Embed(ecfg.vocab_size, ecfg.emb_dim, ecfg.dtype)
        self.encoder = Encoder(ecfg, self.encoder_token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)
