"""The step-function layer: encode, init cache, block step, and the block-step contract.

The samplers (`decoding.temperature_sample`, `speculative.speculative_sample`) never see a Flax
module: they call closures that follow one contract, `BlockStep`, the counterpart of T5X's
`DecodeFnCallable` / `tokens_to_logits` callback (`t5x/decoding.py`). This module is the only place
that turns a `network.Transformer` into such a closure; `models` (the T5X-shaped glue), `drafts`
(the T5 draft) and `timing.step_timer` (step-cost timers) all build theirs here.

The contract::

  step(tokens int32 [batch, k], positions int32 [batch], cache)
      -> (logits float32 [batch, k, vocab], cache)

`tokens[:, j]` is the decoder input at absolute position `positions + j` (position 0 holds the
decoder start token 0) and `logits[:, j]` is the distribution of the output token at that position.
The cache is written at absolute positions, so entries beyond the valid prefix are stale but never
read: a rejected draft costs nothing to roll back (the next call overwrites them).

Tree speculation (`tree`) extends the contract: a step made here also takes `tree=` (a
`tree.TreeQuery`, static: which nodes of a token tree `tokens` are) and has the attributes
`move_slots` (`move_cache_slots`: the accepted path's entries to their positions) and
`cache_slots` (`self_cache_len`); see `tree.TreeStep` for the whole contract.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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


BUCKETS_ENV_VAR = "SPECDEC_ENCODER_BUCKETS"  # "0" encodes every source at its padded length
MIN_BUCKET = 16  # tokens: the shortest encoder length bucket
MAX_BUCKETS = 8  # compiled encoder copies per traced set-up (one `lax.switch` branch each)


def encoder_length_buckets(enc_len: int) -> tuple[int, ...]:
    """The encoder lengths a set-up may run at for sources padded to `enc_len` tokens.

    Equal steps of at least `MIN_BUCKET` tokens (a multiple of it), at most `MAX_BUCKETS` of them,
    the last one `enc_len` itself: 64 -> (16, 32, 48, 64), 256 -> (32, 64, ..., 256), 8 -> (8,).

    Raises:
      ValueError: enc_len < 1.
    """
    if enc_len < 1:
        raise ValueError(f"enc_len must be >= 1; got enc_len={enc_len}.")
    step = max(MIN_BUCKET, -(-enc_len // (MAX_BUCKETS * MIN_BUCKET)) * MIN_BUCKET)
    return (*range(step, enc_len, step), enc_len)


def length_bucketing(params, enc_len: int) -> bool:
    """Whether set-ups with these parameters run the encoder at a length bucket (`bucketed`).

    On for the CPU inference path, i.e. parameters packed for the CPU kernel (`pack_params`: CPU
    backend, float32 activations, a single device), with more than one bucket for `enc_len`.
    Off with `SPECDEC_ENCODER_BUCKETS=0` or `SPECDEC_CPU_KERNEL=0` (raw parameters: T5X's
    padded-length encoder, bit for bit), on accelerators and for raw parameter trees. Read when a
    function is traced.
    """
    if os.environ.get(BUCKETS_ENV_VAR, "1").strip() == "0":
        return False
    return cpu_kernel.is_packed(params) and len(encoder_length_buckets(enc_len)) > 1


def source_length(encoder_input_tokens: Array) -> Array:
    """int32 []: the longest source of the batch in tokens (its last non-zero position + 1)."""
    positions = jnp.arange(1, encoder_input_tokens.shape[1] + 1, dtype=jnp.int32)
    return jnp.max(jnp.where(encoder_input_tokens != 0, positions, 0), initial=0)


def setup_length(params, encoder_input_tokens) -> int:
    """The encoder length (tokens) a set-up with `params` runs at for these concrete inputs.

    Host-side counterpart of the bucket `bucketed` picks inside jit: enc_len when bucketing is
    off, else the first of `encoder_length_buckets(enc_len)` holding the longest source.

    Args:
      params: parameters (raw or packed; decide `length_bucketing`).
      encoder_input_tokens: int32 [batch, enc_len] (NumPy or a concrete jax array).
    """
    enc_len = encoder_input_tokens.shape[1]
    if not length_bucketing(params, enc_len):
        return enc_len
    longest = int(source_length(jnp.asarray(encoder_input_tokens)))
    return next(b for b in encoder_length_buckets(enc_len) if b >= longest)


def warmup_sources(params, encoder_input_tokens: Array) -> list[Array]:
    """Inputs that run a jitted decoder once per length bucket, for warming it up before timing.

    Each `lax.switch` branch of `bucketed` is its own code, and on XLA:CPU its first run pays a
    one-time initialisation (30–50 ms for the embedded target's set-up on the AMD VM of session
    19), which would otherwise land in the first timed call of that length. Decode each of these
    once, untimed, after compiling.

    Args:
      params: the parameters the decoder gets (decide `length_bucketing`).
      encoder_input_tokens: int32 [batch, enc_len] of the timed calls.

    Returns:
      `[encoder_input_tokens]` when bucketing is off; else one int32 [batch, enc_len] per bucket
      b, every row holding token 1 (EOS) at positions < b and padding after.
    """
    enc_len = encoder_input_tokens.shape[1]
    if not length_bucketing(params, enc_len):
        return [encoder_input_tokens]
    positions = jnp.arange(enc_len)[None, :]
    return [
        jnp.broadcast_to(positions < b, encoder_input_tokens.shape).astype(jnp.int32)
        for b in encoder_length_buckets(enc_len)
    ]


def _pad_length(tree, axis_from_end: int, enc_len: int):
    """Zero-pads every leaf of `tree` along axis `ndim - axis_from_end` to `enc_len`."""

    def pad(x):
        widths = [(0, 0)] * x.ndim
        widths[x.ndim - axis_from_end] = (0, enc_len - x.shape[x.ndim - axis_from_end])
        return jnp.pad(x, widths)

    return jax.tree_util.tree_map(pad, tree)


def pad_cross_cache(cache, enc_len: int):
    """`cache` with its cross-attention K/V (`encoder_decoder_attention`, `[..., heads, kv_len,
    head_dim]`) zero-padded to `kv_len = enc_len`; self-attention entries unchanged."""

    def pad(path, x):
        names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
        if "encoder_decoder_attention" in names and x.shape[-2] < enc_len:
            return _pad_length(x, 2, enc_len)
        return x

    return jax.tree_util.tree_map_with_path(pad, cache)


def bucketed(
    params,
    encoder_input_tokens: Array,
    fn: Callable[[Array], Any],
    pad: Callable[[Any, int], Any],
):
    """`fn` run on the sources cut to the shortest length bucket that holds the batch's longest.

    The set-up of a decode (encoder pass, cross-attention K/V) costs in proportion to the padded
    source length, while real sources are shorter (DDTP En→De: 27 tokens on average, padded to
    64; summarization: 116 of 256). On the CPU inference path (`length_bucketing`) the set-up runs
    at the first of `encoder_length_buckets(enc_len)` that holds every row's tokens, chosen at run
    time by one `lax.switch` (each bucket compiled once, in the same executable), and `pad`
    extends the outputs back to `enc_len`: the positions past the bucket hold zeros, which the
    cross-attention padding mask (from the full `encoder_input_tokens`) never lets through.
    Real positions get the same values up to float32 summation order (the encoder's matmuls and
    softmax sums run at another length), so `SPECDEC_CPU_KERNEL=0` keeps T5X's padded-length
    numerics bit for bit. A row of only padding (no tokens) is encoded at the first bucket.

    Args:
      params: the parameters `fn` uses (decide `length_bucketing`).
      encoder_input_tokens: int32 [batch, enc_len], zero-padded at the end.
      fn: `tokens int32 [batch, bucket] -> outputs` (a pytree).
      pad: `(outputs, enc_len) -> outputs` at enc_len (e.g. `pad_cross_cache`).

    Returns:
      `fn`'s outputs at `enc_len` (`fn(encoder_input_tokens)` when bucketing is off).
    """
    enc_len = encoder_input_tokens.shape[1]
    if not length_bucketing(params, enc_len):
        return fn(encoder_input_tokens)
    buckets = encoder_length_buckets(enc_len)
    index = jnp.sum(jnp.asarray(buckets[:-1]) < source_length(encoder_input_tokens))
    branches = [lambda tokens, b=b: pad(fn(tokens[:, :b]), enc_len) for b in buckets[:-1]] + [fn]
    return jax.lax.switch(index, branches, encoder_input_tokens)


def pad_encoded(encoded: Array, enc_len: int) -> Array:
    """float32 [batch, bucket, emb] encoder output zero-padded to [batch, enc_len, emb]."""
    return _pad_length(encoded, 2, enc_len)


def encode(
    module: network.Transformer, params, encoder_input_tokens: Array, buckets: bool = True
) -> Array:
    """Encoder output float32 [batch, enc_len, emb] of int32 [batch, enc_len] (dropout off).

    On the CPU inference path (packed `params`, `buckets=True`) the encoder runs at a length
    bucket (`bucketed`): positions past it hold zeros (masked out by every cross-attention).

    T5X counterpart: `EncoderDecoderModel._compute_logits_from_slice`'s encoder pass.
    """

    def run(tokens):
        return module.apply({"params": params}, tokens, enable_dropout=False, method=module.encode)

    if not buckets:
        return run(encoder_input_tokens)
    return bucketed(params, encoder_input_tokens, run, pad_encoded)


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
    )["params"]

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

    def step(tokens: Array, positions: Array, cache, tree=None) -> tuple[Array, Any]:
        k = tokens.shape[1]
        if tree is None:
            token_positions = positions[:, None] + jnp.arange(k, dtype=jnp.int32)  # [b, k]
            attention = None
        else:  # token j is node tree.nodes[j] of a token tree rooted at position `positions`
            token_positions, attention = tree.attention(positions, self_cache_len(cache))
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
            tree=attention,
        )
        return logits, variables["cache"]

    step.move_slots = move_cache_slots
    step.cache_slots = self_cache_len
    return step


def _is_self_attention_kv(path) -> bool:
    names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
    return "self_attention" in names and names[-1] in ("cached_key", "cached_value")


def self_cache_len(cache) -> int:
    """max_len, the slots of a `network` cache's decoder self-attention (static).

    Raises:
      ValueError: the tree holds no `self_attention/cached_key` leaf.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
        if _is_self_attention_kv(path):
            return leaf.shape[-2]  # [(layers,) b, h, max_len, d]
    raise ValueError("the cache holds no decoder self_attention/cached_key leaf.")


def move_cache_slots(cache, start: Array, path: Array):
    """Copies each row's accepted tree path into the position-addressed self-attention cache.

    For every row b and d in 0..D: slot `start[b] + d` <- slot `start[b] + path[b, d]` of every
    `self_attention/cached_{key,value}` leaf (all are read before any is written; slots past the
    cache end are dropped). Afterwards the path's entries sit at their positions, so the next call
    sees an ordinary cache (`tree`). Cross-attention leaves are unchanged.

    Args:
      cache: a `network` decode cache (`init_cache`), leaves [(layers,) batch, heads, max_len,
        head_dim].
      start: int32 [batch] the slot (= position) of each row's tree root.
      path: int32 [batch, D + 1] node index (BFS order, root 0) at each depth of the kept path.

    Returns:
      The cache with the moved entries.
    """
    start = jnp.asarray(start, jnp.int32)
    path = jnp.asarray(path, jnp.int32)

    def move(kv, max_len):  # [b, h, max_len, d]
        src = jnp.clip(start[:, None] + path, 0, max_len - 1)  # [b, D + 1]
        dst = start[:, None] + jnp.arange(path.shape[1], dtype=jnp.int32)  # [b, D + 1]
        rows = jnp.arange(kv.shape[0])[:, None, None]
        heads = jnp.arange(kv.shape[1])[None, :, None]
        moved = kv[rows, heads, src[:, None, :]]  # [b, h, D + 1, d]
        return kv.at[rows, heads, dst[:, None, :]].set(moved, mode="drop")

    def leaf(path_, kv):
        if not _is_self_attention_kv(path_):
            return kv
        if kv.ndim == 5:  # scanned layers: [layers, b, h, max_len, d]
            return jax.vmap(lambda x: move(x, kv.shape[-2]))(kv)
        return move(kv, kv.shape[-2])

    return jax.tree_util.tree_map_with_path(leaf, cache)


def prepare_cache(
    module: network.Transformer, params, encoder_input_tokens: Array, max_decode_len: int
):
    """Encodes once and returns the fresh decode cache (`encode` then `init_cache`).

    On the CPU inference path both run at the sources' length bucket (`bucketed`), the cached
    cross-attention K/V zero-padded to enc_len.

    Args:
      module: the `network.Transformer`; params: its parameters (raw or packed).
      encoder_input_tokens: int32 [batch, enc_len]; max_decode_len: L (tokens).

    Returns:
      The `init_cache` tree (cross-attention K/V [batch, heads, enc_len, head_dim]).
    """
    params = pack_params(module, params)  # no-op when already packed / the kernel is off

    def setup(tokens):
        encoded = encode(module, params, tokens, buckets=False)
        return init_cache(module, params, encoded, tokens, max_decode_len)

    return bucketed(params, encoder_input_tokens, setup, pad_cross_cache)


def start_loop(inputs, max_decode_steps, depth: int, target, draft):
    """The loop's start: the buffer, lengths, limits and caches after a forced prompt's prefill.

    Args:
      inputs: int32 [batch, L] (column 0 the start slot; a leading run of non-zero tokens after it
        is a forced prompt); max_decode_steps: None or tokens to generate; depth: the most tokens
        one iteration writes before its bonus (γ, or a tree's depth); target, draft: (block
        step, cache) each.

    Returns:
      buffer int32 [batch, L + depth + 2] (the prompt, zeros), length int32 [batch] (valid
      positions, start slot included), limit int32 [batch] (the length limit per row), and the
      target's and draft's caches with the prompt fed (unchanged without one).
    """
    batch, max_len = inputs.shape
    prompt_len = jnp.sum(jnp.cumprod(inputs[:, 1:] != 0, axis=1), axis=1).astype(jnp.int32)
    limit = jnp.full((batch,), max_len, jnp.int32)
    if max_decode_steps is not None:
        limit = jnp.minimum(limit, prompt_len + jnp.asarray(max_decode_steps, jnp.int32))
    keep = jnp.arange(max_len)[None, :] <= prompt_len[:, None]
    buffer = jnp.where(keep, inputs, 0).at[:, 0].set(0)
    buffer = jnp.pad(buffer, ((0, 0), (0, depth + 2)))  # [b, L] -> [b, L + depth + 2]

    def prefill(caches):
        zeros = jnp.zeros((batch,), jnp.int32)
        tc = target[0](buffer[:, :max_len], zeros, caches[0])[1]
        dc = draft[0](buffer[:, :max_len], zeros, caches[1])[1]
        return tc, dc

    target_cache, draft_cache = jax.lax.cond(
        jnp.any(prompt_len > 0), prefill, lambda c: c, (target[1], draft[1])
    )
    return buffer, 1 + prompt_len, limit, target_cache, draft_cache


def check_vocab(target_fn, target_cache, draft_fn, draft_cache, batch, eos_id) -> int:
    """Vocabulary size from the closures' output shapes (traced abstractly, no compute).

    Raises:
      ValueError: different vocabulary sizes, or eos_id outside [0, vocab).
    """
    tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
    positions = jax.ShapeDtypeStruct((batch,), jnp.int32)
    target_shape = jax.eval_shape(target_fn, tokens, positions, target_cache)[0].shape
    draft_shape = jax.eval_shape(draft_fn, tokens, positions, draft_cache)[0].shape
    if target_shape[-1] != draft_shape[-1]:
        raise ValueError(
            f"target and draft vocabularies differ: target logits {target_shape}, draft logits "
            f"{draft_shape}; both models must share one vocabulary (same padded size)."
        )
    vocab = target_shape[-1]
    if not 0 <= int(eos_id) < vocab:
        raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {vocab}).")
    return vocab
