"""The step-function layer: encode, init cache, block step, and the block-step contract.

The samplers (`decoding.temperature_sample`, `speculative.speculative_sample`) never see a Flax
module: they call closures that follow one contract, `BlockStep`, the counterpart of T5X's
`DecodeFnCallable` / `tokens_to_logits` callback (`t5x/decoding.py`). This module is the only place
that turns a `network.Transformer` into such a closure; `models` (the T5X-shaped glue), `drafts`
(the T5 draft) and `benchmark` (step-cost timers) all build theirs here.

The contract::

  step(tokens int32 [batch, k], positions int32 [batch], cache)
      -> (logits float32 [batch, k, vocab], cache)

`tokens[:, j]` is the decoder input at absolute position `positions + j` (position 0 holds the
decoder start token 0) and `logits[:, j]` is the distribution of the output token at that position.
The cache is written at absolute positions, so entries beyond the valid prefix are stale but never
read: a rejected draft costs nothing to roll back (the next call overwrites them).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specdec_t5x import cpu_kernel, network

Array = jax.Array


class BlockStep(Protocol):
    """A cached decoder call on a block of k tokens (see the module docstring).

    T5X counterpart: the `tokens_to_logits` callback handed to `t5x.decoding.temperature_sample`
    (one token per call there; k tokens here, so the target can score γ + 1 prefixes at once).
    """

    def __call__(self, tokens: Array, positions: Array, cache: Any) -> tuple[Array, Any]:
        """Logits float32 [batch, k, vocab] for int32 tokens [batch, k] at `positions` + 0..k-1."""
        ...


def encode(module: network.Transformer, params, encoder_input_tokens: Array) -> Array:
    """Encoder output float32 [batch, enc_len, emb] of int32 [batch, enc_len] (dropout off).

    T5X counterpart: `EncoderDecoderModel._compute_logits_from_slice`'s encoder pass.
    """
    return module.apply(
        {"params": params}, encoder_input_tokens, enable_dropout=False, method=module.encode
    )


def init_cache(
    module: network.Transformer,
    params,
    encoded: Array,
    encoder_input_tokens: Array,
    max_decode_len: int,
):
    """Creates the decode cache as T5X does: one `decode=True` apply on full-length inputs.

    Args:
      module: the `network.Transformer`.
      params: its parameters.
      encoded: float32 [batch, enc_len, emb] encoder output (its cross-attention K/V get cached).
      encoder_input_tokens: int32 [batch, enc_len].
      max_decode_len: decoder length L; the self-attention cache holds positions 0..L-1.

    Returns:
      The `'cache'` collection (see `network` for the layout).
    """
    dummy = jnp.ones((encoder_input_tokens.shape[0], max_decode_len), jnp.int32)
    _, variables = module.apply(
        {"params": params},
        encoded,
        encoder_input_tokens,
        dummy,
        dummy,
        enable_dropout=False,
        decode=True,
        mutable=["cache"],
        method=module.decode,
    )
    return variables["cache"]


def pack_params(module: network.Transformer, params, cpu_weight_dtype: str = "float32"):
    """`params` with the decoder projections packed for the CPU matmul kernel
    (`cpu_kernel.pack_params`; returned unchanged when the kernel is off or does not apply).

    Call once per parameter set, outside decode loops (idempotent). `make_block_step` and
    `prepare_cache` pack raw parameters themselves, so packing first only saves repeating it.

    Args:
      module: the `network.Transformer` (its activation dtype decides whether the kernel applies).
      params: its parameter tree (T5X names), raw or already packed.
      cpu_weight_dtype: 'float32' (default) or 'bfloat16' storage of the packed weights.
    """
    return cpu_kernel.pack_params(params, cpu_weight_dtype, activation_dtype=module.config.dtype)


def unpack_params(module: network.Transformer, params):
    """The T5X layout of a tree from `pack_params` (raw trees unchanged), for consumers of that
    layout such as `hf.export_hf`; see `cpu_kernel.unpack_params` (exact for float32 panels).

    Args:
      module: the `network.Transformer` the tree belongs to (gives each Dense's output width).
      params: its parameter tree, packed or raw.
    """
    if not cpu_kernel.is_packed(params):
        return params
    ones = jnp.ones((1, 1), jnp.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.PRNGKey(0), ones, ones, ones, enable_dropout=False)
    )["params"]["decoder"]

    def out_features(path: tuple[str, ...]) -> int:
        node = shapes
        for key in path:
            node = node[key]
        return node["kernel"].shape[-1]

    return cpu_kernel.unpack_params(params, out_features)


def make_block_step(
    module: network.Transformer,
    params,
    encoder_input_tokens: Array,
    cpu_weight_dtype: str = "float32",
) -> BlockStep:
    """The block-step closure over a cached decoder (contract: `BlockStep`).

    On CPU the decoder's dense projections run on `cpu_kernel` by default: raw `params` are packed
    here, once, outside the returned step (`SPECDEC_CPU_KERNEL=0` turns that off).

    Args:
      module: the `network.Transformer`.
      params: its parameters (raw, or from `pack_params`).
      encoder_input_tokens: int32 [batch, enc_len] (cross-attention padding mask); the batch must
        match the cache's.
      cpu_weight_dtype: storage of weights packed here ('float32' or 'bfloat16'; raw params only).

    Returns:
      A `BlockStep`; its cache comes from `init_cache` (cross-attention K/V are read from it).
    """

    params = pack_params(module, params, cpu_weight_dtype)

    def step(tokens: Array, positions: Array, cache) -> tuple[Array, Any]:
        k = tokens.shape[1]
        token_positions = positions[:, None] + jnp.arange(k, dtype=jnp.int32)  # [b, k]
        logits, variables = module.apply(
            {"params": params, "cache": cache},
            None,  # encoded: cross K/V are read from the cache
            encoder_input_tokens,
            tokens,
            decoder_positions=token_positions,
            enable_dropout=False,
            decode=True,
            mutable=["cache"],
            method=module.decode,
        )
        return logits, variables["cache"]

    return step


def prepare_cache(
    module: network.Transformer, params, encoder_input_tokens: Array, max_decode_len: int
):
    """Encodes once and returns the fresh decode cache (`encode` then `init_cache`)."""
    params = pack_params(module, params)  # no-op when already packed / the kernel is off
    encoded = encode(module, params, encoder_input_tokens)
    return init_cache(module, params, encoded, encoder_input_tokens, max_decode_len)
