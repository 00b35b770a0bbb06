"""Distilling a draft (M_q) from a frozen target (M_p): DistillSpec (Zhou et al., ICLR 2024).

The acceptance rate of speculative sampling at temperature 1 is alpha = E[sum_x min(p, q)] =
1 - E[TVD(p, q)] (paper Section 3.3 / Corollary 3.6), so a draft is trained to bring q close to p *on
the prefixes it will be asked to continue*. Two choices make that work (DistillSpec, Section 3):

* **Which sequences.** Ground-truth prefixes (today's token-level KD) or sequences *generated* by
  the draft itself (on-policy) or by the target, at the eval temperatures (0: greedy, 1: sampling).
  `MixedBatches` draws each step's batch from a mixture of the three; generated batches come from
  a pool that is regenerated from the *current* draft parameters every `regenerate_every` steps.
* **Which divergence** `D(p, q)` per token, against the target's full next-token distribution:
  forward KL(p || q), reverse KL(q || p), total variation (TVD = 0.5 sum |p - q|, whose mean is
  exactly 1 - alpha at T = 1) or the Jensen-Shannon divergence (`divergence`).

`distillation_loss` is `(1 - w) CE(data) + w D(p, q)` per token on any batch (w = 1 on generated
sequences, whose "labels" are the model's own samples); it reuses `EncoderDecoderModel.token_losses`,
so label smoothing, z-loss and the loss normaliser apply as in `loss_fn`. Gradients flow only into
the draft: the target's logits enter through `stop_gradient`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import models
from specdec_t5x.data import packing

Array = jax.Array
Batch = Mapping[str, Any]
DIVERGENCES = ("fkl", "rkl", "tvd", "jsd")
SOURCES = ("data", "draft", "target")


def divergence(kind: str, p_log_probs: Array, q_log_probs: Array) -> Array:
    """Per-position divergence between the target's p and the draft's q.

    Args:
      kind: `'fkl'` KL(p || q) = sum p log(p/q); `'rkl'` KL(q || p); `'tvd'` 0.5 sum |p - q|;
        `'jsd'` 0.5 KL(p || m) + 0.5 KL(q || m), m = (p + q) / 2 (in nats, at most log 2).
      p_log_probs, q_log_probs: float32 [..., vocab] normalised log-probabilities.

    Returns:
      float32 [...] (the vocabulary axis summed out).

    Raises:
      ValueError: unknown `kind`.
    """
    p, q = jnp.exp(p_log_probs), jnp.exp(q_log_probs)
    if kind == "fkl":
        return jnp.sum(p * (p_log_probs - q_log_probs), axis=-1)
    if kind == "rkl":
        return jnp.sum(q * (q_log_probs - p_log_probs), axis=-1)
    if kind == "tvd":
        return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
    if kind == "jsd":
        log_m = jnp.logaddexp(p_log_probs, q_log_probs) - jnp.log(2.0)
        kl_pm = jnp.sum(p * (p_log_probs - log_m), axis=-1)
        kl_qm = jnp.sum(q * (q_log_probs - log_m), axis=-1)
        return 0.5 * (kl_pm + kl_qm)
    raise ValueError(f"divergence must be one of {DIVERGENCES}; got {kind!r}.")


def distillation_loss(
    model: models.EncoderDecoderModel,
    params,
    target_logits: Array,
    batch: Mapping[str, Array],
    dropout_rng: Array | None,
    distill_weight: float | Array,
    kind: str = "fkl",
    xent_weight: float | Array | None = None,
    target_temperature: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
    """`xent_weight * CE(labels) + distill_weight * D(p_τ || q)` (+ z-loss) per weighted token.

    Args:
      model: the draft being trained (q); its label smoothing, z-loss and loss normaliser apply.
      params: its parameters.
      target_logits: float32 [batch, len, vocab] logits of the frozen target (p) on `batch`
        (no gradient flows into them).
      batch: T5X features (`make_batch` or `generated_batch`) with `decoder_loss_weights`.
      dropout_rng: PRNG key enabling dropout, or None.
      distill_weight: w of the divergence term (float or float32 []).
      kind: the divergence (`divergence`).
      xent_weight: weight of the cross-entropy on `decoder_target_tokens`; default 1 - w.
      target_temperature: τ > 0; the divergence is taken against p_τ = softmax(logits_p / τ).
        τ < 1 sharpens the target toward its argmax: as τ -> 0, TVD(p_τ, q) -> 1 - q(argmax p),
        the draft's miss rate in argmax mode (α at T = 0). The metrics below use p itself.

    Returns:
      (loss float32 [], metrics float32 []: `loss`, `xent`, `divergence`, `kl` (forward KL),
      `alpha` (sum_x min(p, q): the acceptance rate at temperature 1, teacher-forced on `batch`),
      `greedy_match` (argmax p == argmax q: the acceptance rate at temperature 0), `z_loss`,
      `num_tokens`, `accuracy`).
    """
    if xent_weight is None:
        xent_weight = 1.0 - distill_weight
    q_logits = model.logits(params, batch, dropout_rng)  # [b, L, V]
    xent, z, weights, norm = model.token_losses(q_logits, batch)
    if not target_temperature > 0:
        raise ValueError(f"target_temperature must be > 0; got {target_temperature!r}.")
    p_logits = jax.lax.stop_gradient(target_logits)
    q_log_probs = jax.nn.log_softmax(q_logits, axis=-1)
    p_log_probs = jax.nn.log_softmax(p_logits, axis=-1)
    p_tau = (
        p_log_probs
        if target_temperature == 1.0
        else jax.nn.log_softmax(p_logits / target_temperature, axis=-1)
    )
    div = divergence(kind, p_tau, q_log_probs)  # [b, L]
    num_tokens = jnp.maximum(jnp.sum(weights), 1.0)

    def mean(x):
        return jnp.sum(jax.lax.stop_gradient(x) * weights) / num_tokens

    loss = jnp.sum((xent_weight * xent + distill_weight * div + z) * weights) / norm
    alpha = jnp.sum(jnp.minimum(jnp.exp(p_log_probs), jnp.exp(q_log_probs)), axis=-1)
    greedy = jnp.argmax(q_logits, -1) == jnp.argmax(p_logits, -1)
    correct = jnp.argmax(q_logits, -1) == batch["decoder_target_tokens"]
    return loss, {
        "loss": jax.lax.stop_gradient(loss),
        "xent": mean(xent),
        "divergence": mean(div),
        "kl": mean(div if kind == "fkl" else divergence("fkl", p_log_probs, q_log_probs)),
        "alpha": mean(alpha),
        "greedy_match": mean(greedy.astype(jnp.float32)),
        "z_loss": mean(z),
        "num_tokens": jnp.sum(weights),
        "accuracy": mean(correct.astype(jnp.float32)),
    }


def generated_batch(encoder_input_tokens: Array, decodes: Array, eos_id: int) -> dict[str, Array]:
    """T5X features for training on generated decoder sequences, one example per row.

    The decodes become `decoder_target_tokens` up to and including their first EOS (the whole row
    when there is none); `decoder_input_tokens` are them shifted right (starting with 0).
    Segment ids are 1 on real tokens and 0 on padding, positions count from 0, so the batch has the
    same features and shapes as a packed `packing.make_batch` batch (one compiled train step).

    Args:
      encoder_input_tokens: int32 [batch, input_len].
      decodes: int32 [batch, target_len] sampled tokens (`temperature_sample`'s layout: no BOS).
      eos_id: end-of-sequence id.

    Returns:
      Dict of int32 [batch, len] features plus `decoder_loss_weights` float32 [batch, target_len].
    """
    length = decodes.shape[1]
    positions = jnp.arange(length, dtype=jnp.int32)
    is_eos = decodes == eos_id
    first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), length - 1)
    real = positions[None, :] <= first_eos[:, None]  # [b, L]
    targets = jnp.where(real, decodes, 0).astype(jnp.int32)
    enc_real = encoder_input_tokens > 0
    enc_positions = jnp.arange(encoder_input_tokens.shape[1], dtype=jnp.int32)
    return {
        "encoder_input_tokens": encoder_input_tokens.astype(jnp.int32),
        "encoder_segment_ids": enc_real.astype(jnp.int32),
        "encoder_positions": jnp.where(enc_real, enc_positions[None, :], 0),
        "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_segment_ids": real.astype(jnp.int32),
        "decoder_positions": jnp.where(real, positions[None, :], 0),
        "decoder_loss_weights": real.astype(jnp.float32),
    }


def make_generator(model: models.EncoderDecoderModel, target_len: int) -> Callable[..., Batch]:
    """Jitted `(params, encoder_input_tokens, temperature, rng) -> generated_batch(...)`.

    Decodes with the model's cached decoder (`predict_batch_with_aux`, `temperature_sample`, top-k
    off) for `target_len` tokens. `temperature` is a float32 scalar (0 decodes greedily), a traced
    argument, so one compilation serves every temperature. It is one scalar for the whole batch on
    purpose: a per-row temperature array follows T5X's semantics (every row sampled with the *same*
    key), which would make the rows of a generated batch correlated samples.
    """

    def generate(params, encoder_input_tokens, temperature, rng):
        if jnp.ndim(temperature) != 0:
            raise ValueError(
                f"temperature must be a scalar, got shape {jnp.shape(temperature)} (one per batch)."
            )
        batch = {
            "encoder_input_tokens": encoder_input_tokens,
            "decoder_input_tokens": jnp.zeros(
                (encoder_input_tokens.shape[0], target_len), jnp.int32
            ),
        }
        decoder_params = {"temperature": temperature, "topk": 0, "topp": 0.0}
        decodes, _ = model.predict_batch_with_aux(params, batch, rng, decoder_params=decoder_params)
        return generated_batch(encoder_input_tokens, decodes, model.eos_id)

    return jax.jit(generate)


class MixedBatches:
    """Training batches drawn from a mixture of ground truth and draft- / target-generated sequences.

    Step t's source is drawn from `mixture` with a generator seeded by `(seed, t)` (so a resumed run
    draws the same sources). Generated batches come from a pool per source of `pool_batches`
    batches, batch i decoded at `temperatures[i % len(temperatures)]`; the pool is refilled with new
    encoder inputs (`packing.SourceBatches`) and, for the draft, the *current* draft parameters every
    `regenerate_every` steps (at the first generated step of each window of that many steps, and at
    the first one after a restart). Pool batches are used in turn. A run resumed from a checkpoint at
    a multiple of `regenerate_every` replays the uninterrupted run's batches exactly.

    Args:
      data: the ground-truth `packing.PackedBatches` stream.
      sources: `packing.SourceBatches` (same batch size and input length as `data`).
      mixture: fractions per source, keys in `SOURCES` (normalised; missing keys are 0).
      draft_generate, target_generate: `make_generator` functions (None where unused).
      target_params: the frozen target's parameters.
      temperatures: sampling temperatures of generated batches (0 = greedy).
      regenerate_every: steps between pool refills.
      pool_batches: generated batches per source per refill.
      seed: source choice and sampling keys.

    Raises:
      ValueError: bad mixture keys or fractions, a needed generator missing, empty temperatures,
        or non-positive `regenerate_every` / `pool_batches`.
    """

    def __init__(
        self,
        data: packing.PackedBatches,
        sources: packing.SourceBatches,
        mixture: Mapping[str, float],
        draft_generate: Callable[..., Batch] | None,
        target_generate: Callable[..., Batch] | None,
        target_params: Any,
        temperatures: Sequence[float] = (0.0, 1.0),
        regenerate_every: int = 100,
        pool_batches: int = 4,
        seed: int = 0,
    ):
        bad = sorted(set(mixture) - set(SOURCES))
        fractions = np.asarray([float(mixture.get(s, 0.0)) for s in SOURCES])
        if bad or np.any(fractions < 0) or fractions.sum() <= 0:
            raise ValueError(
                f"mixture must map {SOURCES} to non-negative fractions, not all 0; got {mixture!r}."
            )
        generators = {"draft": draft_generate, "target": target_generate}
        for source, gen in generators.items():
            if fractions[SOURCES.index(source)] > 0 and gen is None:
                raise ValueError(f"mixture uses {source!r} sequences but no generator was given.")
        if not temperatures or min(temperatures) < 0:
            raise ValueError(f"temperatures must be non-empty and >= 0; got {temperatures!r}.")
        if regenerate_every < 1 or pool_batches < 1:
            raise ValueError(
                f"regenerate_every and pool_batches must be >= 1; got {regenerate_every}, "
                f"{pool_batches}."
            )
        self.data, self.sources, self.generators = data, sources, generators
        self.fractions = fractions / fractions.sum()
        self.target_params, self.temperatures = target_params, tuple(temperatures)
        self.regenerate_every, self.pool_batches, self.seed = regenerate_every, pool_batches, seed
        self._pools: dict[str, list[tuple[str, Batch]]] = {}
        self._refilled_at: int | None = None
        self._cursor = {s: 0 for s in generators}

    def source(self, step: int) -> str:
        """The source (`'data'`, `'draft'` or `'target'`) of step `step`'s batch."""
        return SOURCES[np.random.default_rng((self.seed, step, 1)).choice(3, p=self.fractions)]

    def _refill(self, step: int, draft_params) -> None:
        self._pools, self._refilled_at = {}, step
        self._cursor = {s: 0 for s in self.generators}
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed), step)
        for s, gen in self.generators.items():
            if gen is None or self.fractions[SOURCES.index(s)] == 0:
                continue
            params = draft_params if s == "draft" else self.target_params
            pool = []
            for i in range(self.pool_batches):
                t = self.temperatures[i % len(self.temperatures)]
                temps = jnp.asarray(t, jnp.float32)
                rng = jax.random.fold_in(key, 2 * i + (s == "target"))
                batch = gen(params, next(self.sources), temps, rng)
                # Host copies: numpy like the packed batches, so the train step compiles once.
                pool.append((f"{s}_t{t:g}", jax.device_get(batch)))
            self._pools[s] = pool

    def next(self, step: int, draft_params) -> tuple[str, Batch]:
        """`(label, batch)` for step `step`: label `'data'` or e.g. `'draft_t1'` (source, temp)."""
        s = self.source(step)
        if s == "data":
            return "data", next(self.data)
        window = step // self.regenerate_every
        if self._refilled_at is None or self._refilled_at // self.regenerate_every != window:
            self._refill(step, draft_params)
        i = self._cursor[s]
        self._cursor[s] = i + 1
        return self._pools[s][i % self.pool_batches]

    def state(self) -> dict[str, Any]:
        return {**self.data.state(), "sources": self.sources.state()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Restores both streams; the pool is regenerated on first use (from restored params)."""
        self.data.restore(state)
        if "sources" in state:
            self.sources.restore(state["sources"])
        self._pools, self._refilled_at = {}, None
