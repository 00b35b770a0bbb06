"""Baseline decoding: T5X's `temperature_sample`, one token per target call.

This is the baseline every speculative speedup is measured against, so it is one jitted
`lax.while_loop` with no host synchronisation, calling `tokens_to_logits` once per generated token.

Two ways to draw each sampled token (`sampler`, one loop either way; `SAMPLERS`):

* 't5x' (default): `jax.random.categorical` over the adjusted logits, a Gumbel draw per vocabulary
  entry: T5X's tokens bit for bit (the paper's baseline).
* 'inverse_cdf': one uniform per row and `sampling.inverse_cdf_sample` over the adjusted
  distribution, the draw `speculative.speculative_sample` makes. Same distribution (same
  temperature, top-k and top-p filters), different random tokens; it is the baseline whose
  sampling work matches the speculative loop's, so a speed-up against it is speculation alone.

In argmax mode (temperature at or below `MIN_TEMPERATURE`) both take the argmax: same tokens.

Signature, argument meaning, defaults and return contract are T5X's (`t5x/decoding.py`), including
its surprising default **`topk=1`**: with only `temperature=1.0` set, T5X decodes *greedily*. Gin files
of this project therefore always set `topk` explicitly (`gin/decoding/*.gin`).

Worked example (batch 1, L = 5, eos = 1, a forced prompt of one token, 7)::

  inputs   = [[0, 7, 0, 0, 0]]           # column 0 is the BOS slot, 7 is forced
  buffer   = [[0, 7, 0, 0, 0, 0, 0]]     # L + 2 columns; the last is a garbage slot
  step 0: feed 0 at index 0 -> sample ignored, 7 forced into buffer[1] (log-prob not counted)
  step 1: feed 7 at index 1 -> sample 4 -> buffer[2] = 4
  step 2: feed 4 at index 2 -> sample 1 (EOS) -> buffer[3] = 1, ended
  decodes  = buffer[:, 1:-1] = [[7, 4, 1, 0, 0]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from specdec_t5x import sampling

Array = jax.Array
MIN_TEMPERATURE = sampling.MIN_TEMPERATURE

SAMPLERS = ("t5x", "inverse_cdf")  # how each sampled token is drawn (module docstring)

# Cache leaves that T5X does not expand for num_decodes > 1 (they carry no batch axis).
_UNEXPANDED_CACHE_KEYS = ("cache_index", "cached_bias", "position_embedder_index")


@flax.struct.dataclass
class DecodingState:
    """What `tokens_to_logits` receives (T5X's `DecodingState`).

    Attributes:
      cur_index: int32 [batch * num_decodes] position of the token being fed.
      sequences: int32 [batch * num_decodes, max_decode_len] the decode buffer so far (column 0 is
        the BOS slot).
      cur_token: int32 [batch * num_decodes, 1] the token to feed.
      cache: the autoregressive cache pytree.
    """

    cur_index: Array
    sequences: Array
    cur_token: Array
    cache: Any


@flax.struct.dataclass
class SamplingLoopState:
    """Carry of the sampling `lax.while_loop` (T5X's `SamplingLoopState`).

    Attributes:
      step: int32 [] loop iteration.
      cur_index: int32 [B'] position of `cur_token` (B' = batch * num_decodes).
      sequences: int32 [B', max_decode_len + 2] buffer; column 0 BOS, last column garbage.
      cache: autoregressive cache pytree.
      cur_token: int32 [B', 1] token fed at this step.
      ended: bool [B'] row finished (sampled EOS or reached its length limit).
      rng: PRNG key for the next step.
      log_prob: float32 [B'] accumulated log-probability of sampled (non-forced) tokens.
    """

    step: Array
    cur_index: Array
    sequences: Array
    cache: Any
    cur_token: Array
    ended: Array
    rng: Array
    log_prob: Array


TokensToLogits = Callable[[DecodingState], tuple[Array, Any]]


def one_token_logits(block_step) -> TokensToLogits:
    """A `steps.BlockStep` as T5X's `tokens_to_logits(DecodingState) -> (float32 [B, vocab],
    cache)`: the step on the state's one token, int32 [B, 1], at its index."""

    def tokens_to_logits(state: DecodingState):
        logits, cache = block_step(state.cur_token, state.cur_index, state.cache)
        return logits[:, 0], cache  # [B, 1, V] -> [B, V]

    return tokens_to_logits


def check_sampler(sampler: str) -> None:
    """Checks a baseline sampler name.

    Args:
      sampler: 't5x' (T5X's Gumbel draw) or 'inverse_cdf' (the speculative loop's draw).

    Raises:
      ValueError: any other value, naming it and the valid ones.
    """
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}; got sampler={sampler!r}.")


def expand_cache(cache: Any, num_decodes: int, cache_offset: int = 0, expand_index=False) -> Any:
    """Repeat-interleaves every batch-carrying cache leaf `num_decodes` times.

    Args:
      cache: pytree whose leaves have the batch axis at `cache_offset`.
      num_decodes: copies per example ([e0, e0, e1, e1, ...]).
      cache_offset: batch axis of cache leaves (1 with scanned layers).
      expand_index: also expand `cache_index` leaves (T5X does when `initial_index` is given).

    Returns:
      The expanded cache (batch axis multiplied by `num_decodes`).
    """
    skip = _UNEXPANDED_CACHE_KEYS[1:] if expand_index else _UNEXPANDED_CACHE_KEYS

    def expand(path, leaf):
        name = getattr(path[-1], "key", None) if path else None
        if name in skip or jnp.ndim(leaf) == 0:  # e.g. our network's scalar cache_index
            return leaf
        return jnp.repeat(leaf, num_decodes, axis=cache_offset)

    return jax.tree_util.tree_map_with_path(expand, cache)


def temperature_sample(
    inputs: Array,
    cache: Any,
    tokens_to_logits: TokensToLogits,
    eos_id: int,
    decode_rng: Array | None = None,
    num_decodes: int = 1,
    temperature: float | Array = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: Array | None = None,
    max_decode_steps: int | Array | None = None,
    max_decode_steps_hard_limit: int | None = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Callable[[SamplingLoopState], SamplingLoopState] | None = None,
    logit_callback_fn: Callable[[Array, SamplingLoopState], Array] | None = None,
    sampler: str = "t5x",
) -> tuple[Array, Array]:
    """Temperature sampling with T5X's contract (mirrors `t5x.decoding.temperature_sample`).

    With the default `sampler='t5x'` the tokens and log-probs are T5X's bit for bit; `sampler=
    'inverse_cdf'` draws the same distribution as the speculative loop does (module docstring).

    Args:
      inputs: int32 [batch, max_decode_len]. Column 0 is the BOS slot; other non-zero entries are a
        forced decoder prompt (teacher forced, log-probs not counted). All zeros for plain
        encoder-decoder decoding.
      cache: autoregressive cache pytree (batch axis at `cache_offset`).
      tokens_to_logits: `DecodingState -> (float32 [B', vocab] logits, new cache)`.
      eos_id: end-of-sequence id (1 for T5). EOS inside a forced prompt does not end a row.
      decode_rng: PRNG key; None means `jax.random.PRNGKey(0)`.
      num_decodes: independent samples per example; rows are repeat-interleaved.
      temperature: float, or float32 [batch] (one per example, as in T5X: each row is then
        sampled on its own with the same key); at or below `MIN_TEMPERATURE` (1e-4) decodes greedily.
      topk: keep the k most likely tokens (ties kept). **Defaults to 1 as in T5X, i.e. greedy even
        at temperature 1**; 0 switches the filter off.
      topp: nucleus mass in [0, 1]; 0 switches it off.
      cache_offset: batch axis of cache leaves (used only to expand for `num_decodes`).
      initial_index: int32 [batch] start positions when the cache was prefilled with a prompt.
      max_decode_steps: per-example limit `min(max_decode_len, count_nonzero(inputs) + steps)`.
      max_decode_steps_hard_limit: clips `max_decode_steps` when both are set.
      rescale_log_probs: True: log-probs of the adjusted distribution (greedy gives 0); False:
        log-softmax of the raw logits.
      state_callback_fn: applied to the loop state at the start of each iteration and after it.
      logit_callback_fn: `(logits, state) -> logits`, applied before temperature/top-k/top-p.
      sampler: how a sampled token is drawn (`SAMPLERS`): 't5x', `jax.random.categorical` (a
        Gumbel per vocabulary entry; with a per-row temperature every row reuses the step's key,
        as in T5X), or 'inverse_cdf', one uniform per row and `sampling.inverse_cdf_sample` over
        the adjusted distribution (rows independent; rescaled log-probs are then the log of the
        sampled token's adjusted probability, equal to T5X's log-softmax up to rounding). Not
        part of T5X's signature.

    Returns:
      decodes: int32 [batch, num_decodes, max_decode_len]: prompt, generated tokens, EOS, zeros.
      log_probs: float32 [batch, num_decodes], sorted ascending (best is index -1).

    Raises:
      ValueError: topk and topp both set, topp outside [0, 1], negative temperature or topk,
        a static `max_decode_steps` larger than `max_decode_len`, `num_decodes` < 1, or a
        `sampler` not in `SAMPLERS`.
    """
    static_temperature = isinstance(temperature, int | float)
    sampling.validate(temperature if static_temperature else 1.0, topk, topp)
    check_sampler(sampler)
    if num_decodes < 1:
        raise ValueError(f"num_decodes must be >= 1; got {num_decodes}.")
    batch, max_len = inputs.shape
    if isinstance(max_decode_steps, int) and max_decode_steps > max_len:
        raise ValueError(
            f"max_decode_steps={max_decode_steps} exceeds max_decode_len={max_len} (inputs.shape[1])."
        )
    if max_decode_steps is not None and max_decode_steps_hard_limit is not None:
        max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
    if decode_rng is None:
        decode_rng = jax.random.PRNGKey(0)

    if num_decodes > 1:
        inputs = jnp.repeat(inputs, num_decodes, axis=0)  # [b, L] -> [b * n, L]
        cache = expand_cache(cache, num_decodes, cache_offset, initial_index is not None)
        if not static_temperature and jnp.ndim(temperature) == 1:
            temperature = jnp.repeat(temperature, num_decodes)
        if initial_index is not None:
            initial_index = jnp.repeat(initial_index, num_decodes)
        if max_decode_steps is not None and jnp.ndim(max_decode_steps) == 1:
            max_decode_steps = jnp.repeat(max_decode_steps, num_decodes)

    next_token = functools.partial(
        _next_token_and_log_prob,
        temperature=temperature,
        topk=topk,
        topp=topp,
        rescale_log_probs=rescale_log_probs,
        draw=_DRAWS[sampler],
    )
    decodes, log_probs = _temperature_sample_single_trial(
        inputs, cache, tokens_to_logits, next_token, eos_id, decode_rng, initial_index,
        max_decode_steps, state_callback_fn, logit_callback_fn,
    )  # fmt: skip
    decodes = decodes.reshape(batch, num_decodes, max_len)  # [b * n, L] -> [b, n, L]
    log_probs = log_probs.reshape(batch, num_decodes)
    order = jnp.argsort(log_probs, axis=-1)  # ascending: best last
    decodes = jnp.take_along_axis(decodes, order[:, :, None], axis=1)
    return decodes, jnp.take_along_axis(log_probs, order, axis=1)


def _categorical_draw(rng: Array, adjusted: Array) -> tuple[Array, None]:
    """T5X's draw: int32 [rows] tokens by `jax.random.categorical` over float32 [rows, vocab]
    adjusted logits (one Gumbel per entry); no probabilities computed (None)."""
    return jax.random.categorical(rng, adjusted, axis=-1).astype(jnp.int32), None


def _inverse_cdf_draw(rng: Array, adjusted: Array) -> tuple[Array, Array]:
    """The speculative loop's draw: int32 [rows] tokens from one uniform per row by
    `sampling.inverse_cdf_sample` over softmax(adjusted), and those float32 [rows, vocab]
    probabilities (`speculative.speculative_sample`'s `propose` draws the same way)."""
    probs = jax.nn.softmax(adjusted, axis=-1)
    uniform = jax.random.uniform(rng, adjusted.shape[:-1])  # [rows]
    return sampling.inverse_cdf_sample(uniform, probs), probs


_DRAWS = {"t5x": _categorical_draw, "inverse_cdf": _inverse_cdf_draw}


def _next_token_and_log_prob(rng, logits, temperature, topk, topp, rescale_log_probs, draw):
    """Samples int32 [B'] tokens and their float32 [B'] log-probs (see `temperature_sample`).

    A static or scalar temperature samples the whole [B', vocab] batch with one key. A per-row
    temperature array with T5X's draw samples row by row, each row as a [1, vocab] batch with the
    *same* key (T5X maps its sampler over rows with `vmap`), so the tokens are T5X's bit for bit;
    the inverse-CDF draw takes the per-row temperatures as one batch (independent uniforms).
    """
    if isinstance(temperature, int | float) and sampling.is_greedy(temperature):
        token = sampling.argmax(logits)
        if rescale_log_probs:
            return token, jnp.zeros(logits.shape[:1], jnp.float32)
        return token, _pick(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), token)
    if jnp.ndim(temperature) == 1 and draw is _categorical_draw:
        token, log_prob = jax.vmap(
            lambda row, t: _sample_rows(rng, row[None], t, topk, topp, rescale_log_probs, draw)
        )(logits, jnp.asarray(temperature, jnp.float32))
        return token[:, 0], log_prob[:, 0]  # [B', 1] -> [B']
    return _sample_rows(rng, logits, temperature, topk, topp, rescale_log_probs, draw)


def _pick(log_probs: Array, token: Array) -> Array:
    return jnp.take_along_axis(log_probs, token[..., None], axis=-1)[..., 0]


def _sample_rows(rng, logits, temperature, topk, topp, rescale_log_probs, draw):
    """int32 [rows] tokens and float32 [rows] log-probs for a scalar temperature, or float32
    [rows] temperatures (inverse-CDF draw only), drawing with `draw`."""
    if jnp.ndim(temperature) == 1:
        adjusted = sampling.adjust_logits(logits, jnp.asarray(temperature)[:, None], topk, topp)
    else:
        adjusted = sampling.adjust_logits(logits, temperature, topk, topp)
    sampled, probs = draw(rng, adjusted)
    greedy = sampling.greedy_rows(temperature)
    token = jnp.where(greedy, sampling.argmax(logits), sampled)
    if rescale_log_probs:
        if probs is None:  # T5X: log-softmax of the adjusted logits
            sampled_log_prob = _pick(jax.nn.log_softmax(adjusted, axis=-1), token)
        else:  # the probabilities the draw already computed (> 0 at the drawn token)
            sampled_log_prob = jnp.log(_pick(probs, token))
        log_prob = jnp.where(greedy, 0.0, sampled_log_prob)
    else:
        log_prob = _pick(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), token)
    return token, log_prob


def _temperature_sample_single_trial(
    inputs, cache, tokens_to_logits, next_token, eos_id, decode_rng, initial_index,
    max_decode_steps, state_callback_fn, logit_callback_fn,
):  # fmt: skip
    """The sampling loop over flattened rows B' = batch * num_decodes; `next_token(rng, logits)` is
    `_next_token_and_log_prob` with the sampling settings bound (int32 [B'] tokens, float32 [B']
    log-probs from float32 [B', vocab] logits)."""
    rows, max_len = inputs.shape
    if max_decode_steps is None:
        row_max_len = jnp.full((rows,), max_len, jnp.int32)
    else:
        prompt = jnp.count_nonzero(inputs, axis=1).astype(jnp.int32)
        row_max_len = jnp.minimum(max_len, prompt + jnp.asarray(max_decode_steps, jnp.int32))
    sequences = jnp.pad(inputs, ((0, 0), (0, 2)))  # [B', L] -> [B', L + 2]
    if initial_index is None:
        cur_index = jnp.zeros((rows,), jnp.int32)
        cur_token = jnp.zeros((rows, 1), jnp.int32)  # BOS slot value is ignored
    else:
        cur_index = jnp.asarray(initial_index, jnp.int32)
        cur_token = jnp.take_along_axis(sequences, cur_index[:, None], axis=1)
    row_ids = jnp.arange(rows)

    def cond(state: SamplingLoopState):
        return ~jnp.all(state.ended)

    def body(state: SamplingLoopState):
        if state_callback_fn is not None:
            state = state_callback_fn(state)
        rng, next_rng = jax.random.split(state.rng)
        decoding_state = DecodingState(
            cur_index=state.cur_index,
            sequences=state.sequences[:, :-2],
            cur_token=state.cur_token,
            cache=state.cache,
        )
        logits, new_cache = tokens_to_logits(decoding_state)  # [B', V]
        if logit_callback_fn is not None:
            logits = logit_callback_fn(logits, state)
        token, log_prob = next_token(rng, logits)
        i = jnp.minimum(state.cur_index, row_max_len)  # [B']
        forced_token = state.sequences[row_ids, i + 1]
        forced = forced_token != 0
        token = jnp.where(forced, forced_token, token)
        token = jnp.where(state.ended, 0, token)
        new_log_prob = state.log_prob + jnp.where(forced | state.ended, 0.0, log_prob)
        sequences = state.sequences.at[row_ids, i + 1].set(token)
        ended = state.ended | ((token == eos_id) & ~forced) | (i >= row_max_len - 1)
        return SamplingLoopState(
            step=state.step + 1,
            cur_index=i + 1,
            sequences=sequences,
            cache=new_cache,
            cur_token=token[:, None],
            ended=ended,
            rng=next_rng,
            log_prob=new_log_prob,
        )

    init = SamplingLoopState(
        step=jnp.zeros((), jnp.int32),
        cur_index=cur_index,
        sequences=sequences,
        cache=cache,
        cur_token=cur_token,
        ended=row_max_len <= cur_index,
        rng=decode_rng,
        log_prob=jnp.zeros((rows,), jnp.float32),
    )
    final = jax.lax.while_loop(cond, body, init)
    if state_callback_fn is not None:
        final = state_callback_fn(final)
    return final.sequences[:, 1:-1], final.log_prob  # drop BOS and garbage columns
