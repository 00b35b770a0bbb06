"""Logits -> adjusted next-token distributions: temperature, top-k, top-p (nucleus), argmax.

The paper (§2.2) casts every sampling method as sampling from an *adjusted* distribution; speculative
decoding is exact for the adjusted distributions only if target (p) and draft (q) are adjusted the
same way. This module is that one place, shared by the baseline (`decoding.temperature_sample`) and the
speculative sampler (`speculative.speculative_sample`).

Semantics follow T5X's `temperature_sample` and `t5x/binary_search.py`, decision for decision:

* temperature at or below `MIN_TEMPERATURE` (compared in float32, as T5X does: it samples only when
  T > 1e-4) means argmax (greedy); top-k / top-p are then ignored.
* top-k keeps every token whose logit is >= the k-th largest (ties at the threshold are all kept,
  so more than k tokens can survive, as in T5X); k >= vocab keeps everything.
* top-p keeps every token whose probability is >= the largest threshold t whose kept mass (the
  float32 masked sum of the probabilities >= t) is >= p. That is the smallest most-probable set with
  mass >= p, ties with its least probable member included, where "mass" is that float32 sum (not a
  cumulative sum, whose rounding differs at exact boundaries). One deliberate difference: if even the
  whole vocabulary's float32 mass is below p (p within rounding of 1), T5X masks every token (its
  threshold search ends on NaN) and then samples uniformly; we keep every token.
* removed tokens get the logit `NEG_INF` (finite, so no NaN can arise from all-masked rows).

Only the speculative sampler uses `first_argmax` (the same tokens as `argmax`, computed faster on
XLA:CPU). `inverse_cdf_sample` (exact in distribution, one uniform per row, but not T5X's random
draws) is the speculative sampler's draw and the baseline's with `sampler='inverse_cdf'`. The
baseline's default keeps `argmax` and `jax.random.categorical`, which are bit-identical to T5X.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MIN_TEMPERATURE = 1e-4  # T5X's threshold: temperatures at or below it decode greedily.
NEG_INF = -1e10  # Logit of a removed token (exp underflows to exactly 0 in float32).


def validate(temperature: float, topk: int, topp: float) -> None:
    """Checks sampling settings shared by the baseline and speculative samplers.

    Args:
      temperature: softmax temperature (Python number; checked when static).
      topk: number of most likely tokens kept (0 = off).
      topp: nucleus mass in [0, 1] (0 = off).

    Raises:
      ValueError: negative temperature, negative topk, topp outside [0, 1], or both topk and topp set.
    """
    if isinstance(temperature, int | float) and temperature < 0:
        raise ValueError(f"temperature must be >= 0; got temperature={temperature}.")
    if not isinstance(topk, int) or topk < 0:
        raise ValueError(f"topk must be a non-negative int (0 = off); got topk={topk!r}.")
    if not 0.0 <= float(topp) <= 1.0:
        raise ValueError(f"topp must be in [0, 1] (0 = off); got topp={topp}.")
    if topk and topp:
        raise ValueError(f"Set at most one of topk and topp; got topk={topk}, topp={topp}.")


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """One validated set of sampling settings, applied identically to target and draft (§2.2).

    The object the eval job passes to both samplers (like gemma's sampler configs) instead of a
    loose (temperature, topk, topp) triple; gin builds it from the TEMPERATURE / TOPK / TOPP
    macros (`gin/runs/eval.gin`).

    Attributes:
      temperature: float >= 0; below `MIN_TEMPERATURE` is argmax mode (top-k / top-p ignored).
      topk: int >= 0, tokens kept by the top-k filter (0 = off).
      topp: float in [0, 1], nucleus mass (0 = off). At most one of topk / topp is set.

    Raises:
      ValueError: on construction, for settings `validate` rejects.
    """

    temperature: float = 1.0
    topk: int = 0
    topp: float = 0.0

    def __post_init__(self):
        for name, value in (("temperature", self.temperature), ("topp", self.topp)):
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
                raise ValueError(
                    f"{name} (gin: {name.upper()}) must be a number; got {value!r} "
                    f"({type(value).__name__})."
                )
        validate(self.temperature, self.topk, self.topp)

    @property
    def greedy(self) -> bool:
        """Argmax mode (temperature below `MIN_TEMPERATURE`)."""
        return is_greedy(self.temperature)

    def decoder_params(self) -> dict[str, Any]:
        """`{'temperature', 'topk', 'topp'}`: keyword arguments of both samplers."""
        return dataclasses.asdict(self)

    def adjust_logits(self, logits: Array) -> Array:
        """`adjust_logits` under these settings: float32 [..., vocab] -> float32 [..., vocab]."""
        return adjust_logits(logits, self.temperature, self.topk, self.topp)


def is_greedy(temperature: float) -> bool:
    """True when a static temperature selects argmax decoding (float32 T <= `MIN_TEMPERATURE`)."""
    return bool(np.float32(temperature) <= np.float32(MIN_TEMPERATURE))


def greedy_rows(temperature: Array) -> Array:
    """bool [...]: rows whose (traced) temperature selects argmax, decided as `is_greedy`."""
    return jnp.asarray(temperature, jnp.float32) <= jnp.float32(MIN_TEMPERATURE)


def topk_mask(logits: Array, topk: int) -> Array:
    """Keeps logits >= the k-th largest per row; others become `NEG_INF`.

    Args:
      logits: float32 [..., vocab].
      topk: k >= 1 (0 returns `logits` unchanged; k >= vocab keeps every token).

    Returns:
      float32 [..., vocab].
    """
    if not topk:
        return logits
    k = min(topk, logits.shape[-1])
    rows = int(np.prod(logits.shape[:-1]))
    if rows > 1 and k <= TOPK_PASSES_MAX:  # XLA:CPU sorts every row of a multi-row top_k
        index = top_k_indices(logits, k)[..., -1:]
        kth = jnp.take_along_axis(logits, index, axis=-1)  # the same k-th largest value
    else:
        kth = jax.lax.top_k(logits, k)[0][..., -1:]  # [..., 1]
    return jnp.where(logits >= kth, logits, NEG_INF)


# Up to this k, `topk_mask` of several rows finds the k-th largest logit by `top_k_indices`'
# passes (two reductions per row and pass) rather than `jax.lax.top_k`, which XLA:CPU lowers to a
# full sort of every row when it has more than one row (costs: results/trees/profile/).
TOPK_PASSES_MAX = 32


def top_k_indices(x: Array, k: int) -> Array:
    """The indices `jax.lax.top_k(x, k)[1]` gives (largest first, ties to the lower index), in k
    passes of two plain reductions each (max, then the first index attaining it among the
    entries not yet taken).

    Inside a loop body XLA:CPU lowers `top_k` of more than one row to a full sort of every row;
    these passes cost far less per row (measured: results/trees/profile/). A NaN counts as the
    largest value (the first NaN first, as `first_argmax`); the k indices of a row are always
    distinct.

    Args:
      x: float32 [..., n]; k: static, 1 <= k <= n.

    Returns:
      int32 [..., k] the indices of the k largest entries of each row, largest first.

    Raises:
      ValueError: k outside [1, n].
    """
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"top_k_indices needs 1 <= k <= {n} (the row length); got k={k}.")
    iota = jnp.arange(n, dtype=jnp.int32)
    taken = jnp.zeros(x.shape, bool)
    out = []
    for _ in range(k):
        free = jnp.where(taken, -jnp.inf, x)
        top = jnp.max(free, axis=-1, keepdims=True)  # NaN if a free entry is NaN
        hit = ((free == top) | jnp.isnan(free)) & ~taken
        index = jnp.min(jnp.where(hit, iota, n), axis=-1)  # [...]
        out.append(index)
        taken = taken | (iota == index[..., None])
    return jnp.stack(out, axis=-1)


def topp_mask(logits: Array, topp: float) -> Array:
    """Nucleus filter: keeps every token at least as probable as the threshold T5X would pick.

    The threshold is the largest row probability v whose kept mass, the float32 sum of the
    probabilities >= v, is >= `topp` (T5X's `binary_search.topp_mask` decides the same set by a
    search over all float32 thresholds; kept masses only change at row probabilities, so searching
    those, by bisection over the sorted row, gives the same decisions in ceil(log2(vocab)) sums).

    Args:
      logits: float32 [..., vocab] (already temperature-scaled).
      topp: mass in (0, 1] (0 or >= 1 return `logits` unchanged).

    Returns:
      float32 [..., vocab].
    """
    if not topp or topp >= 1.0:
        return logits
    probs = jax.nn.softmax(logits, axis=-1)
    vocab = probs.shape[-1]
    descending = -jnp.sort(-probs, axis=-1)  # [..., vocab]

    def kept_mass(threshold):  # [..., 1] -> [..., 1]
        return jnp.sum(jnp.where(probs >= threshold, probs, 0.0), axis=-1, keepdims=True)

    def bisect(_, bounds):
        # Invariant: the answer (first sorted index whose kept mass is >= topp) is in [lo, hi].
        lo, hi = bounds
        mid = (lo + hi) // 2
        enough = kept_mass(jnp.take_along_axis(descending, mid, axis=-1)) >= topp
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    lo = jnp.zeros(probs.shape[:-1] + (1,), jnp.int32)
    hi = jnp.full_like(lo, vocab - 1)  # the last index keeps everything
    steps = max(1, int(np.ceil(np.log2(vocab))))
    lo, _ = jax.lax.fori_loop(0, steps, bisect, (lo, hi))
    threshold = jnp.take_along_axis(descending, lo, axis=-1)  # [..., 1]
    return jnp.where(probs >= threshold, logits, NEG_INF)


def adjust_logits(logits: Array, temperature: float | Array, topk: int = 0, topp: float = 0.0):
    """Temperature, then top-k or top-p: the logits of the adjusted distribution (§2.2).

    Args:
      logits: float32 [..., vocab] raw model logits.
      temperature: > 0 scalar, or float32 array broadcastable to `logits[..., :1]`.
      topk: k (0 = off).
      topp: nucleus mass (0 = off).

    Returns:
      float32 [..., vocab]; `NEG_INF` for removed tokens.
    """
    logits = logits.astype(jnp.float32) / jnp.maximum(temperature, MIN_TEMPERATURE)
    return topp_mask(topk_mask(logits, topk), topp)


def adjusted_probs(logits: Array, temperature: float, topk: int = 0, topp: float = 0.0) -> Array:
    """The adjusted distribution itself: float32 [..., vocab] probabilities summing to 1.

    In argmax mode (`is_greedy(temperature)`) it is the one-hot of `argmax(logits)`.
    """
    if is_greedy(temperature):
        return jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(adjust_logits(logits, temperature, topk, topp), axis=-1)


def argmax(logits: Array) -> Array:
    """Greedy token: int32 [...] (first index among exact ties, like `jnp.argmax`)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def sample(rng: Array, logits: Array, temperature: float, topk: int = 0, topp: float = 0.0):
    """One token per row from the adjusted distribution (argmax in greedy mode).

    Args:
      rng: PRNG key (one key for the whole batch, as in T5X).
      logits: float32 [batch, vocab].
      temperature, topk, topp: see `adjust_logits`.

    Returns:
      int32 [batch].
    """
    if is_greedy(temperature):
        return argmax(logits)
    adjusted = adjust_logits(logits, temperature, topk, topp)
    return jax.random.categorical(rng, adjusted, axis=-1).astype(jnp.int32)


def first_argmax(logits: Array) -> Array:
    """`argmax`, computed as two plain reductions (max, then the first index attaining it).

    Same result as `jnp.argmax` for every input (first index among exact ties; the first NaN if
    the row has one; index 0 for a row of -inf), but XLA:CPU runs it several times faster than
    its variadic (value, index) reduction: the speculative loop takes 2γ + 1 argmaxes per
    iteration in argmax mode. The baseline (`decoding.temperature_sample`) keeps `argmax`.

    Args:
      logits: float32 [..., vocab].

    Returns:
      int32 [...].
    """
    vocab = logits.shape[-1]
    top = jnp.max(logits, axis=-1, keepdims=True)  # NaN if the row has a NaN
    hit = (logits == top) | jnp.isnan(logits)  # isnan only matters when top is NaN
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(hit, index, vocab), axis=-1).astype(jnp.int32)


INVERSE_CDF_BLOCK = 128  # tokens per block of the two-level search in `inverse_cdf_sample`


def inverse_cdf_sample(uniform: Array, probs: Array) -> Array:
    """One token per row by inverse-CDF sampling: the first x with cdf(x) > u · total mass.

    Exact in distribution for the (unnormalised) row `probs` up to float32 rounding of the sums,
    with one uniform per row instead of `jax.random.categorical`'s Gumbel per vocabulary entry.
    The search is two-level (the cumulative mass of blocks of `INVERSE_CDF_BLOCK` tokens, then the
    cumulative mass inside the chosen block), since a full-vocabulary cumsum is slow on XLA:CPU.
    The target u · total is clipped below the (block) mass it is searched in, so a token with
    zero probability is never returned (rounding can only move mass between positive entries).
    Used by the speculative sampler (Leviathan et al., 2022, Algorithm 1 needs samples from q, p
    and the residual exact in distribution, not T5X's Gumbel draws) and by the baseline's
    `sampler='inverse_cdf'` (`decoding`); the baseline's default keeps `jax.random.categorical`.

    Args:
      uniform: float32 [...] in [0, 1) (e.g. `jax.random.uniform`); 1 is accepted too.
      probs: float32 [..., vocab] non-negative, with a positive sum per row (need not be 1).

    Returns:
      int32 [...] token ids in [0, vocab), with probs > 0 whenever the row's float32 sum is
      positive (a row without positive mass, e.g. only subnormal entries, which XLA:CPU flushes to
      zero, gets an arbitrary in-range id; the speculative residual never passes such a row).
    """
    *lead, vocab = probs.shape
    block = INVERSE_CDF_BLOCK
    num_blocks = -(-vocab // block)
    flat = probs.reshape(-1, vocab).astype(jnp.float32)
    flat = jnp.pad(flat, ((0, 0), (0, num_blocks * block - vocab)))  # zeros are never chosen
    blocks = flat.reshape(-1, num_blocks, block)  # [N, nb, block]
    block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [N, nb]
    total = block_cdf[:, -1]
    u = jnp.asarray(uniform, jnp.float32).reshape(-1)
    target = jnp.minimum(u * total, jnp.nextafter(total, 0.0))  # < total: some block exceeds it
    j = jnp.minimum(jnp.sum(block_cdf <= target[:, None], axis=-1), num_blocks - 1)  # [N]
    before = jnp.take_along_axis(block_cdf, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0]
    rest = target - jnp.where(j > 0, before, 0.0)  # >= 0
    cdf = jnp.cumsum(jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0], axis=-1)
    rest = jnp.minimum(rest, jnp.nextafter(cdf[:, -1], 0.0))  # block j has positive mass
    i = jnp.minimum(jnp.sum(cdf <= rest[:, None], axis=-1), block - 1)
    return jnp.minimum(j * block + i, vocab - 1).astype(jnp.int32).reshape(lead)  # in range
