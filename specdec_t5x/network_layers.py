"""The T5 network's configuration and building blocks (`network` assembles them).

`T5Config` with T5X's field names and the activation dtypes it accepts; the relative-position
biases (exact bucket tables); and the layers with T5X's parameter names and dtypes: `LayerNorm`
(RMSNorm), `Dense` (bias-free, or the CPU kernel's packed and shortlisted forms), `MlpBlock` and
`Embed`. `network` re-exports every public name here; the attention is in `network_attention`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from specdec_t5x import cpu_kernel

Array = jax.Array
DType = Any

NUM_BUCKETS = 32  # Relative-position buckets per stack (T5 v1.1).
MAX_DISTANCE = 128  # Relative distance mapped to the last bucket.
# `Embed` looks up at most this many tokens one row at a time (a decode step's k = γ + 1 tokens):
# XLA:CPU splits a multi-row gather over its thread pool (`outer_dimension_partitions`), a hand-off
# that cost ~0.015 ms of a ~0.5 ms embedded-target verify step at k = 3, while a one-row gather
# (every k = 1 step's) runs inline. The rows are the same either way.
FEW_TOKENS = 16

# T5X initialisers: variance scaling, fan-in, truncated normal; embeddings N(0, 1).
default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
_embed_init = nn.initializers.normal(stddev=1.0)
_relpos_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyperparameters of a T5 model, with T5X's field names and defaults.

    Attributes:
      vocab_size: model vocabulary (rows of the embedding table; T5 rounds to a multiple of 128).
      dtype: activation dtype (`'bfloat16'` in T5X's v1.1 gins); parameters are float32.
      emb_dim: model width d_model.
      num_heads: attention heads.
      num_encoder_layers / num_decoder_layers: stack depths.
      head_dim: per-head width d_kv.
      mlp_dim: feed-forward width d_ff.
      mlp_activations: `('gelu', 'linear')` for v1.1 gated-GELU; `('relu',)` for T5 1.0.
      dropout_rate: dropout probability (only active with `enable_dropout=True`).
      logits_via_embedding: tie the logits layer to the embedding (T5 1.0) instead of
        `decoder/logits_dense` (v1.1).
      float32_attention_logits: compute q.k, the attention bias and the softmax in float32
        (T5X's field and default, False: all three in `dtype`).
      layer_norm_epsilon: ε of every RMSNorm (T5X's `LayerNorm.epsilon`, 1e-6); `widen.widen`
        scales it by d_old / d_new to keep a widened network's function.
      scan_layers: stack the layers of each stack under one `layers` module run by `nn.scan`
        (parameters and caches gain a leading layer axis; `widen.stack_layers` maps a
        `layers_{i}` tree to it). Compiles one layer instead of all of them.
      float32_final_logits: not in T5X (default False = T5X's numerics). True runs the final
        `decoder_norm` in float32, so the logits projection (float32 in both cases) sees an
        unrounded input; an option to reduce bf16 near-tie flips between call shapes.
    """

    vocab_size: int
    dtype: DType = jnp.float32
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
    layer_norm_epsilon: float = 1e-6
    scan_layers: bool = False
    float32_final_logits: bool = False

    def __post_init__(self):
        """Raises ValueError naming a bad field (e.g. a gin macro left as %gin.REQUIRED)."""
        for name in (
            "vocab_size",
            "emb_dim",
            "num_heads",
            "num_encoder_layers",
            "num_decoder_layers",
            "head_dim",
            "mlp_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"T5Config.{name} must be a positive int; got {value!r}.")
        if not isinstance(self.dropout_rate, int | float) or not 0 <= self.dropout_rate < 1:
            raise ValueError(
                f"T5Config.dropout_rate must be a float in [0, 1); got {self.dropout_rate!r} "
                "(is a gin macro such as DROPOUT_RATE still %gin.REQUIRED?)."
            )
        if not isinstance(self.layer_norm_epsilon, int | float) or self.layer_norm_epsilon <= 0:
            raise ValueError(
                f"T5Config.layer_norm_epsilon must be a positive float; got {self.layer_norm_epsilon!r}."
            )
        if not self.mlp_activations:
            raise ValueError("T5Config.mlp_activations must name at least one activation.")
        check_activation_dtype(self.dtype)


ACTIVATION_DTYPES = ("float32", "bfloat16")  # what `T5Config.dtype` accepts


def check_activation_dtype(dtype: DType) -> None:
    """Raises ValueError unless `dtype` names float32 or bfloat16 (`ACTIVATION_DTYPES`).

    float16 is refused: T5X's additive attention mask value (`network.NEG_INF` = -1e10, cast to the
    activation dtype as T5X casts it) overflows float16 to -inf, so a query row whose keys are all
    masked (every padding position of the encoder) gets softmax(-inf, ..., -inf) = NaN, which then
    reaches every output through the cross-attention (0 x NaN). T5X's own network does the same
    (every logit NaN on the padded inputs of `tests/golden/t5x_network.npz`). float64 activations
    would need `jax_enable_x64` and were never checked against T5X.

    Args:
      dtype: the activation dtype, as a dtype, a scalar type or its name (`'bfloat16'` in gin).

    Raises:
      ValueError: naming `dtype` and the accepted ones.
    """
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name in ACTIVATION_DTYPES:
        return
    why = (
        ": T5X's attention mask value -1e10 overflows float16 to -inf and padded rows turn into NaN"
        if name == "float16"
        else ""
    )
    raise ValueError(
        f"T5Config.dtype must be one of {ACTIVATION_DTYPES} (activations; parameters stay "
        f"float32); got {dtype!r}{why}."
    )


# ----------------------------------------------------------------------------------------------
# Relative position buckets (T5): exact integer tables built with NumPy at trace time.


@functools.cache
def _bucket_table(bidirectional: bool) -> np.ndarray:
    """Bucket of every relative distance n = query_pos - key_pos in [-MAX, MAX].

    Returns int32 [2 * MAX_DISTANCE + 1]; entry `n + MAX_DISTANCE`. Distances beyond +-MAX_DISTANCE
    map to the same bucket as +-MAX_DISTANCE, so callers clip n first. Follows T5's
    `_relative_position_bucket` (float32 log with eps), evaluated once in NumPy so the mapping never
    depends on device float behaviour.
    """
    n = np.arange(-MAX_DISTANCE, MAX_DISTANCE + 1, dtype=np.int64)
    num_buckets = NUM_BUCKETS
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
        / np.log(MAX_DISTANCE / max_exact)
        * (num_buckets - max_exact)
    ).astype(np.int64)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    ret += np.where(is_small, n, val_if_large)
    return ret.astype(np.int32)


class RelativePositionBiases(nn.Module):
    """One relative-position bias table per stack, shared by its layers (param `rel_embedding`)."""

    num_heads: int
    bidirectional: bool
    dtype: DType

    @nn.compact
    def __call__(self, query_positions: Array, key_positions: Array) -> Array:
        """Bias for every (query, key) pair.

        Args:
          query_positions: int32 [batch, q_len] absolute positions.
          key_positions: int32 [batch, k_len] absolute positions.

        Returns:
          dtype [batch, heads, q_len, k_len] additive attention bias.
        """
        rel_embedding = nn_partitioning.param_with_axes(
            "rel_embedding",
            _relpos_init,
            (self.num_heads, NUM_BUCKETS),
            jnp.float32,
            axes=("heads", "relpos_buckets"),
        )
        n = query_positions[:, :, None] - key_positions[:, None, :]  # [b, q, k]
        n = jnp.clip(n, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        buckets = jnp.asarray(_bucket_table(self.bidirectional))[n]  # [b, q, k]
        bias = jnp.take(rel_embedding.T, buckets, axis=0)  # [b, q, k, heads]
        return jnp.transpose(bias, (0, 3, 1, 2)).astype(self.dtype)  # [b, heads, q, k]


# ----------------------------------------------------------------------------------------------
# Layers.


class LayerNorm(nn.Module):
    """T5 RMSNorm, x * rsqrt(mean(x^2) + eps) * scale, with T5X's dtypes at each step.

    As `t5x/examples/t5/layers.py::LayerNorm`: the mean square and rsqrt in float32, the normalised
    value rounded to `dtype`, then multiplied by the scale (also rounded to `dtype`) in `dtype`.
    """

    dtype: DType
    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x, jnp.float32)
        scale = nn_partitioning.param_with_axes(
            "scale", nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=("embed",)
        )
        var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = jnp.asarray(x * jax.lax.rsqrt(var + self.epsilon), self.dtype)
        return y * jnp.asarray(scale, self.dtype)


class Dense(nn.Module):
    """Bias-free projection with a 2-D `kernel [in, out]` (T5X's DenseGeneral storage).

    If the parameter tree holds `kernel_packed` instead (from `cpu_kernel.pack_params`, which packs
    the decoder's projections for cached CPU decoding), the product runs on the CPU kernel.

    Attributes:
      features: output width.
      dtype: activation dtype of the product (the kernel is stored float32).
      kernel_axes: T5X's logical axis names of the kernel `[in, out]` (`param_with_axes`), e.g.
        ('embed', 'mlp'); T5X's partitioner maps them to the mesh (`partitioning`).
    """

    features: int
    dtype: DType
    kernel_axes: tuple[str, str]
    kernel_init: Any = default_kernel_init

    @nn.compact
    def __call__(self, x: Array) -> Array:
        if self.has_variable("params", cpu_kernel.SHORTLIST_INDEX_NAME):
            return self._shortlist(x)
        if self.has_variable("params", cpu_kernel.PACKED_NAME):
            packed = self.get_variable("params", cpu_kernel.PACKED_NAME)
            # The raw kernel, where pack_params kept it for steps that run XLA's dot (choice).
            raw = (
                self.get_variable("params", "kernel")
                if self.has_variable("params", "kernel")
                else None
            )
            return cpu_kernel.dense(x, packed, self.features, self.dtype, kernel=raw)
        kernel = nn_partitioning.param_with_axes(
            "kernel",
            self.kernel_init,
            (x.shape[-1], self.features),
            jnp.float32,
            axes=self.kernel_axes,
        )
        return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))

    def _shortlist(self, x: Array) -> Array:
        """A draft's logits over its output shortlist (`drafts.shortlist_params`): only the S
        shortlisted columns are computed; every other token's logit is -inf."""
        index = self.get_variable("params", cpu_kernel.SHORTLIST_INDEX_NAME)  # int32 [features]
        if index.shape != (self.features,):
            raise ValueError(
                f"{cpu_kernel.SHORTLIST_INDEX_NAME} must be int32 [{self.features}]; got "
                f"{index.shape}."
            )
        packed = None
        if self.has_variable("params", cpu_kernel.PACKED_NAME):
            packed = self.get_variable("params", cpu_kernel.PACKED_NAME)
            n = packed.shape[0] * cpu_kernel.PANEL
            raw = self.has_variable("params", cpu_kernel.SHORTLIST_KERNEL_NAME)
            rows = int(np.prod(x.shape[:-1]))
            dtype = jnp.dtype(packed.dtype).name
            if raw and cpu_kernel.choose(packed.shape[-2], n, rows, dtype, True) == "xla":
                packed = None  # XLA measured faster: the raw kernel's dot, as unpacked
        if packed is not None:
            y = cpu_kernel.dense(x, packed, n, jnp.float32)
        else:
            kernel = self.get_variable("params", cpu_kernel.SHORTLIST_KERNEL_NAME)
            y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype)).astype(jnp.float32)
        y = jnp.concatenate([y, jnp.full(y.shape[:-1] + (1,), -jnp.inf, y.dtype)], axis=-1)
        index = jnp.where(index < 0, y.shape[-1] - 1, index)  # outside: the -inf column
        return jnp.take(y, index, axis=-1).astype(self.dtype)


class MlpBlock(nn.Module):
    """Feed-forward block: gated (`wi_0` * `wi_1`) when several activations are given, else `wi`."""

    config: T5Config

    @nn.compact
    def __call__(self, x: Array, enable_dropout: bool) -> Array:
        cfg = self.config
        acts = cfg.mlp_activations
        h = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = Dense(cfg.mlp_dim, cfg.dtype, ("embed", "mlp"), name=name)(x)
            y = y if act == "linear" else getattr(nn, act)(y)
            h = y if h is None else h * y
        h = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(h, deterministic=not enable_dropout)
        return Dense(cfg.emb_dim, cfg.dtype, ("mlp", "embed"), name="wo")(h)


class Embed(nn.Module):
    """Shared token embedding `embedding [vocab, emb]` (float32 params)."""

    num_embeddings: int
    features: int
    dtype: DType

    def setup(self):
        self.embedding = nn_partitioning.param_with_axes(
            "embedding",
            _embed_init,
            (self.num_embeddings, self.features),
            jnp.float32,
            axes=("vocab", "embed"),
        )

    def __call__(self, tokens: Array) -> Array:
        """int32 [...] token ids -> dtype [..., features] (T5X's `Embed.__call__`, `jnp.take`)."""
        if 1 < tokens.size <= FEW_TOKENS:  # one-row gathers, stacked (see FEW_TOKENS)
            flat = tokens.reshape(-1)
            rows = [jnp.take(self.embedding, flat[i], axis=0) for i in range(flat.size)]
            out = jnp.stack(rows).reshape(*tokens.shape, self.features)
        else:
            out = jnp.take(self.embedding, tokens, axis=0)
        return out.astype(self.dtype)

    def attend(self, x: Array) -> Array:
        """Logits against the float32 table (T5X's `attend_dtype=float32`): float32 [..., vocab]."""
        return jnp.dot(x, self.embedding.T)
