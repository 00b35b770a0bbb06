"""The T5 network's multi-head attention, with the decode cache it reads and writes (`network`).

`MultiHeadAttention` (T5X's `query` / `key` / `value` / `out` parameters) runs plain attention,
the decoder self-attention through the position-addressed cache (or the slots of a token tree,
`TreeAttention`) and the cross-attention over cached encoder K/V; the cache layout, and why it is
read as T5X reads its own (`_t5x_cache_read`), are documented in `network`'s docstring.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from specdec_t5x import cpu_kernel
from specdec_t5x.network_layers import Dense, T5Config, default_kernel_init

Array = jax.Array

NEG_INF = -1e10  # Masked attention logits (T5X's additive mask value).


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


def _query_init(head_dim: int):
    """T5X folds the 1/sqrt(head_dim) attention scaling into the query initialiser."""

    def init(key, shape, dtype=jnp.float32):
        return default_kernel_init(key, shape, dtype) / np.sqrt(head_dim).astype(np.float32)

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

        def project(name, x, init=default_kernel_init):
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
            key, value, kv, mask = self._self_cache(key, value, mask, query_positions, tree, packed)
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

    def _self_cache(self, key, value, mask, query_positions, tree, packed):
        """The self-attention cache's step (cache_mode='self'): writes the k new entries at their
        slots and returns (key, value, layout, mask).

        Args:
          key, value: dtype [batch, k, heads, head_dim], this call's projections.
          mask: the caller's bool mask or None (kept at the init call).
          query_positions: int32 [batch, k] absolute positions; tree: `TreeAttention` or None.
          packed: the CPU kernel's packed parameters (heads-first layout).

        Returns:
          Initialised: the whole cache dtype [batch, heads, max_len, head_dim] twice, "bhkd", and
          bool [batch, 1, k, max_len] (causal by position, or the tree's visibility). At the init
          call: the new entries (heads first when packed), their layout, and `mask`.
        """
        heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [b, l, h, d] <-> [b, h, l, d]
        batch, heads = key.shape[0], key.shape[2]
        kv = "bkhd"
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
        return key, value, kv, mask


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
