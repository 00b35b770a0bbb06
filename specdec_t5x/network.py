"""T5 v1.1 encoder-decoder in Flax linen with a multi-token, position-addressed decode cache.

Public surface and parameter tree follow T5X's `t5x/examples/t5/network.py` so T5X gin files and
checkpoints carry over: `T5Config` (same field names), `Transformer.__call__ / encode / decode` (same
argument names) and exactly T5X's parameter names (`token_embedder/embedding`,
`encoder/layers_{i}/attention/query/kernel`, ..., `decoder/logits_dense/kernel`).

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

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from specdec_t5x import cpu_kernel

Array = jax.Array
DType = Any

NEG_INF = -1e10  # Masked attention logits (T5X's additive mask value).
NUM_BUCKETS = 32  # Relative-position buckets per stack (T5 v1.1).
MAX_DISTANCE = 128  # Relative distance mapped to the last bucket.
# `Embed` looks up at most this many tokens one row at a time (a decode step's k = γ + 1 tokens):
# XLA:CPU splits a multi-row gather over its thread pool (`outer_dimension_partitions`), a hand-off
# that cost ~0.015 ms of a ~0.5 ms embedded-target verify step at k = 3, while a one-row gather
# (every k = 1 step's) runs inline. The rows are the same either way.
FEW_TOKENS = 16


class TreeAttention(NamedTuple):
    """Where a cached decoder call's tokens live when they are nodes of a token tree (`tree`).

    A position-addressed cache ties each slot to one position, so sibling nodes (same depth, same
    position) would overwrite each other. In a tree call every token gets its own cache slot and
    attends to an explicit set of slots (the prefix plus its ancestors); its position (for the
    relative position bias) is the prefix length plus its depth. Built by
    `tree.TreeQuery.attention`; without it a call writes token j at slot `decoder_positions[:, j]`
    and attends causally (slots <= its position).

    Attributes:
      slots: int32 [batch, k] cache slot each token's self-attention K/V is written to (slots past
        the cache end are dropped).
      key_positions: int32 [batch, max_len] the decoder position of the entry in each cache slot
        (relative position bias of every query against it).
      visible: bool [batch, k, max_len] the cache slots each token attends to (itself included).
    """

    slots: Array
    key_positions: Array
    visible: Array


# T5X initialisers: variance scaling, fan-in, truncated normal; embeddings N(0, 1).
_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
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

    float16 is refused: T5X's additive attention mask value (`NEG_INF` = -1e10, cast to the
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
    kernel_init: Any = _kernel_init

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


def _query_init(head_dim: int):
    """T5X folds the 1/sqrt(head_dim) attention scaling into the query initialiser."""

    def init(key, shape, dtype=jnp.float32):
        return _kernel_init(key, shape, dtype) / np.sqrt(head_dim).astype(np.float32)

    return init


class MultiHeadAttention(nn.Module):
    """Multi-head dot-product attention without 1/sqrt(d) scaling (params query/key/value/out).

    Modes:
      * `cache_mode=None`: plain attention over `kv_inputs`.
      * `cache_mode='self'`: decoder self-attention through the position-addressed cache.
      * `cache_mode='cross'`: cross-attention whose projected encoder K/V live in the cache.
    """

    config: T5Config

    @nn.compact
    def __call__(
        self,
        q_inputs: Array,
        kv_inputs: Array | None,
        mask: Array | None,
        bias: Array | None,
        *,
        enable_dropout: bool = False,
        cache_mode: str | None = None,
        query_positions: Array | None = None,
        tree: TreeAttention | None = None,
    ) -> Array:
        """Attention output.

        Args:
          q_inputs: dtype [batch, q_len, emb].
          kv_inputs: dtype [batch, kv_len, emb]; None with cache_mode='cross' reads the cache.
          mask: bool [batch, 1 | heads, q_len, kv_len] (True = attend) or None.
          bias: dtype [batch | 1, heads, q_len, kv_len] additive bias or None.
          enable_dropout: attention-probability dropout.
          cache_mode: None, 'self' or 'cross' (see class docstring).
          query_positions: int32 [batch, q_len] absolute positions (cache_mode='self').
          tree: cache slots and visibility of token-tree queries (cache_mode='self'; see
            `TreeAttention`); None: slot = position, causal mask.

        Returns:
          dtype [batch, q_len, emb].
        """
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.head_dim
        features = heads * head_dim
        batch, q_len = q_inputs.shape[:2]

        def project(name, x, init=_kernel_init):
            y = Dense(features, cfg.dtype, ("embed", "joined_kv"), kernel_init=init, name=name)(x)
            return y.reshape(y.shape[:2] + (heads, head_dim))  # [b, l, h*d] -> [b, l, h, d]

        query = project("query", q_inputs, _query_init(head_dim))  # [b, q, h, d]
        heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [b, l, h, d] <-> [b, h, l, d]
        # Packed parameters mark the CPU kernel's inference path (`cpu_kernel.pack_params`).
        packed = cpu_kernel.PACKED_NAME in self.variables.get("params", {}).get("query", {})
        kv = "bkhd"  # the layout of `key` / `value` below: [b, k, h, d] or, cached, "bhkd"
        if cache_mode == "cross" and kv_inputs is None:
            # Read the K/V projected when the cache was created (our block steps pass no encoder
            # output), stored heads first.
            key = self.variable("cache", "cached_key").value  # [b, h, k, d]
            value = self.variable("cache", "cached_value").value
            kv = "bhkd"
        elif cache_mode == "cross":
            # Given the encoder output (T5X's step convention), project it as T5X does; the cache
            # keeps the projection made when it was created.
            key, value = project("key", kv_inputs), project("value", kv_inputs)  # [b, k, h, d]
            self.variable("cache", "cached_key", lambda: heads_first(key))  # [b, h, k, d]
            self.variable("cache", "cached_value", lambda: heads_first(value))
            if packed:
                key, value, kv = heads_first(key), heads_first(value), "bhkd"
        else:
            key = project("key", kv_inputs)  # [b, k, h, d]
            value = project("value", kv_inputs)
        if cache_mode == "self":
            initialised = self.has_variable("cache", "cached_key")
            shape = heads_first(key).shape  # the init call: [b, h, max_len, d]
            cached_key = self.variable("cache", "cached_key", jnp.zeros, shape, key.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, shape, value.dtype)
            if initialised:
                max_len = cached_key.value.shape[2]
                rows = jnp.arange(batch)[:, None, None]  # [b, 1, 1]
                cols = jnp.arange(heads)[None, :, None]  # [1, h, 1]
                slots = query_positions if tree is None else tree.slots  # [b, q]
                at = (rows, cols, slots[:, None, :])  # -> [b, h, q]
                # Write (not add) the k new entries at their absolute positions; positions past
                # the cache end are dropped (the sampler never reads their outputs).
                cached_key.value = cached_key.value.at[at].set(heads_first(key), mode="drop")
                cached_value.value = cached_value.value.at[at].set(heads_first(value), mode="drop")
                key, value = cached_key.value, cached_value.value  # [b, h, max_len, d]
                kv = "bhkd"
                key_positions = jnp.arange(max_len, dtype=jnp.int32)
                # Causal by position: query at t sees cache slots <= t only (a tree query: the
                # prefix and its ancestors, `TreeAttention.visible`).
                if tree is None:
                    mask = (key_positions[None, None, :] <= query_positions[:, :, None])[:, None]
                else:
                    mask = tree.visible[:, None]  # [b, 1, q, max_len]
            elif packed:
                key, value, kv = heads_first(key), heads_first(value), "bhkd"
        if kv == "bhkd" and not packed:
            # Raw parameters (`SPECDEC_CPU_KERNEL=0`, accelerators): read the cache as T5X reads
            # its own, so the dots below sum in T5X's order, bit for bit (see `_t5x_cache_read`).
            key, value, kv = _t5x_cache_read(key), _t5x_cache_read(value), "bkhd"

        # T5X's dtypes (layers.py::dot_product_attention): q.k, the additive bias (mask bias
        # NEG_INF/0 in `dtype` plus the relative-position bias) and the softmax all run in the
        # activation dtype, or in float32 when `float32_attention_logits`.
        if cfg.float32_attention_logits:
            query, key = query.astype(jnp.float32), key.astype(jnp.float32)
        # With packed weights the cached attention is one fused kernel call on CPU (float32, no
        # dropout), or with SPECDEC_CPU_ATTENTION=0 contracts heads-first queries: XLA:CPU's
        # batched dot is faster for [b, h, q, d] than for [b, q, h, d] operands
        # (results/verify_cost/). Other platforms, and raw (unpacked) parameters, keep T5X's
        # contraction (its summation order, bit for bit).
        heads_first_dots = kv == "bhkd"  # only with packed parameters (above)
        if mask is not None:
            mask_bias = jax.lax.select(
                mask,
                jnp.zeros(mask.shape, cfg.dtype),
                jnp.full(mask.shape, NEG_INF, cfg.dtype),
            )
            bias = mask_bias if bias is None else mask_bias + bias.astype(cfg.dtype)
        fused = (
            heads_first_dots
            and cpu_kernel.attention_enabled()
            and not enable_dropout
            and all(a.dtype == jnp.float32 for a in (query, key, value))
            and (bias is None or bias.dtype == jnp.float32)
        )
        if fused:
            # Packed float32 inference: logits, bias, softmax and P.V in one CPU kernel call
            # (`cpu_kernel.attention`; XLA's batched dots re-pack the cache on every k-token step,
            # results/verify_cost/). Other platforms run the same contractions as below.
            if bias is None:
                bias = jnp.zeros((1, 1, q_len, key.shape[2]), jnp.float32)
            out = cpu_kernel.attention(query, key, value, bias)  # [b, q, h, d]
            out = out.reshape(batch, q_len, features)  # [b, q, h, d] -> [b, q, h*d]
            return Dense(cfg.emb_dim, cfg.dtype, ("joined_kv", "embed"), name="out")(out)
        if heads_first_dots:
            logits = jax.lax.platform_dependent(
                query,
                key,
                cpu=lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", heads_first(q), k),
                default=lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, _t5x_cache_read(k)),
            )
        else:
            logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)  # [b, h, q, k]
        if bias is not None:
            logits = logits + bias.astype(logits.dtype)
        weights = jax.nn.softmax(logits).astype(cfg.dtype)  # [b, h, q, k]
        weights = nn.Dropout(cfg.dropout_rate)(weights, deterministic=not enable_dropout)
        value = value.astype(cfg.dtype)
        if heads_first_dots:
            out = jax.lax.platform_dependent(
                weights,
                value,
                cpu=lambda w, v: heads_first(jnp.einsum("bhqk,bhkd->bhqd", w, v)),
                default=lambda w, v: jnp.einsum("bhqk,bkhd->bqhd", w, _t5x_cache_read(v)),
            )
        else:
            out = jnp.einsum("bhqk,bkhd->bqhd", weights, value)  # [b, q, h, d]
        out = out.reshape(batch, q_len, features)  # [b, q, h, d] -> [b, q, h*d]
        return Dense(cfg.emb_dim, cfg.dtype, ("joined_kv", "embed"), name="out")(out)


def _t5x_cache_read(x: Array) -> Array:
    """A heads-first cache `dtype [b, h, l, d]` as T5X's attention reads its own: `[b, l, h, d]`.

    T5X stores decoder caches `[batch, heads, head_dim, length]` (`layers.py::
    MultiHeadDotProductAttention`, "as a TPU fusion optimization") and moves the length axis back
    before `dot_product_attention`'s einsums, so XLA contracts each head against that layout. Ours
    is stored `[b, h, l, d]` (what the CPU kernel's fused attention and XLA:CPU's heads-first dots
    read without a copy); contracted as it lies, XLA picks other dot kernels whose float32 sums
    run in another order (cached logits up to ~2e-6 off T5X's, `tests/test_t5x_cached_golden.py`).
    So the raw-parameter path materialises T5X's layout first; the optimisation barrier keeps XLA
    from folding the transpose back into the dot (without it the logits stay off T5X's). Costs one
    copy of each cached K and V per layer and call on that path, as the length-major layout did
    before the cache went heads first (T5X's own self-attention cache needs none); the packed CPU
    path does not use it.

    Args:
      x: dtype [batch, heads, length, head_dim], a cached K or V.

    Returns:
      dtype [batch, length, heads, head_dim], moved from a materialised
      [batch, heads, head_dim, length] array as T5X moves its cache.
    """
    x = jax.lax.optimization_barrier(jnp.swapaxes(x, 2, 3))  # [b, h, l, d] -> [b, h, d, l]
    return jnp.moveaxis(x, -1, -3)  # [b, h, d, l] -> [b, l, h, d]


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
            encoder_segment_ids,
            decoder_segment_ids,
            decoder_positions,
            enable_dropout,
            decode,
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
