"""The measured cost curve of a model pair: T(k), the draft step and the sampling work, in ms.

The paper picks γ by maximising Theorem 3.8 for a known α and c (§3.3). Here every term is measured
on this machine, for this model pair and these shapes, once (cached), in the same in-loop timing as
the eval job's step costs (`benchmark.time_decoder_steps`):

* T(k): the target's cached call on k = 1..γmax + 1 tokens (the verify call of γ = k - 1);
* the draft's one-token step;
* the sampling work per token of the baseline (s_1) and per iteration of speculative decoding at γ
  (o(γ): γ draft samples and the acceptance test; argmax and comparisons at T = 0).

With u = T(1) + s_1, the baseline's cost per token, the predicted speedup of γ is
`theory.measured_walltime_improvement(α, γ, c = draft/u, T(γ + 1)/u, o(γ)/u)`
(`CostCurve.predicted_speedup`); `gamma_control` chooses γ from it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x import benchmark, sampling, steps, theory
from specdec_t5x import verification as verify

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class CostCurve:
    """Measured costs of one model pair at one shape (milliseconds, medians).

    Attributes:
      block_step_ms: {k: T(k)} the target's cached call on k tokens, k = 1..gamma_max + 1.
      draft_step_ms: the draft's one-token cached call.
      baseline_sampling_ms: s_1, the baseline's sampling work per token (0-ish at T = 0).
      sampling_ms: {γ: o(γ)} speculative sampling work per iteration, γ = 1..gamma_max.
    """

    block_step_ms: Mapping[int, float]
    draft_step_ms: float
    baseline_sampling_ms: float
    sampling_ms: Mapping[int, float]

    @property
    def gamma_max(self) -> int:
        return max(self.sampling_ms)

    @property
    def unit_ms(self) -> float:
        """u = T(1) + s_1: the baseline's cost per token."""
        return self.block_step_ms[1] + self.baseline_sampling_ms

    @property
    def c(self) -> float:
        """Draft step / u (the paper's c, against the baseline's per-token cost)."""
        return self.draft_step_ms / self.unit_ms

    def predicted_speedup(self, alpha: float, gamma: int) -> float:
        """`theory.measured_walltime_improvement` of γ (0..gamma_max) at α with these costs."""
        if gamma == 0:
            return 1.0
        return float(
            theory.measured_walltime_improvement(
                alpha,
                gamma,
                self.c,
                self.block_step_ms[gamma + 1] / self.unit_ms,
                self.sampling_ms[gamma] / self.unit_ms,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_step_ms": {str(k): v for k, v in self.block_step_ms.items()},
            "draft_step_ms": self.draft_step_ms,
            "baseline_sampling_ms": self.baseline_sampling_ms,
            "sampling_ms": {str(k): v for k, v in self.sampling_ms.items()},
            "c": self.c,
        }


def measure_sampling_ms(
    batch: int,
    vocab: int,
    gamma_max: int,
    settings: Mapping[str, Any],
    verification: str = "token",
    repeats: int = 20,
    steps_per_call: int = 8,
) -> tuple[float, dict[int, float]]:
    """s_1 and o(γ), γ = 1..gamma_max, in ms: the sampler's work on random logits, in a loop.

    Args:
      batch, vocab: logits shape.
      gamma_max: largest γ.
      settings: {'temperature', 'topk', 'topp'}.
      verification: 'token' or 'block' (the acceptance rule timed at T > 0).
      repeats, steps_per_call: as `benchmark.time_decoder_steps`.

    Returns:
      (s_1 ms per baseline token, {γ: o(γ) ms per speculative iteration}).
    """
    temperature, topk, topp = settings["temperature"], settings["topk"], settings["topp"]
    greedy = sampling.is_greedy(temperature)
    accept_fn = verify.block_accept if verification == "block" else verify.token_accept

    def baseline(key, logits):
        return sampling.sample(key, logits[:, 0], temperature, topk, topp)

    def speculative(gamma):
        def work(key, logits):  # logits [b, γ + 1, V] stand in for both models'
            if greedy:  # the sampler's argmax (`speculative._draft_block`)
                drafts = sampling.first_argmax(logits[:, :gamma])
                return verify.greedy_accept(drafts, logits, None).extra
            adjusted = sampling.adjust_logits(logits, temperature, topk, topp)
            draft_key, verify_key = jax.random.split(key)
            probs = jax.nn.softmax(adjusted, axis=-1)
            uniforms = jax.random.uniform(draft_key, (logits.shape[0], gamma))
            drafts = sampling.inverse_cdf_sample(uniforms, probs[:, :gamma])  # as the sampler
            return accept_fn(verify_key, drafts, probs[:, :gamma], probs).extra

        return work

    def looped(work, k):
        logits = jax.random.normal(jax.random.PRNGKey(k), (batch, k, vocab))

        @jax.jit
        def run(key):
            def body(i, acc):
                return acc + work(jax.random.fold_in(key, i), logits + i * 1e-6)  # not hoisted

            return jax.lax.fori_loop(0, steps_per_call, body, jnp.zeros((batch,), jnp.int32))

        return lambda: run(jax.random.PRNGKey(0))

    calls = {0: looped(baseline, 1)}
    calls.update({g: looped(speculative(g), g + 1) for g in range(1, gamma_max + 1)})
    samples = benchmark.time_interleaved(calls, repeats)
    ms = {g: statistics.median(v) / steps_per_call for g, v in samples.items()}
    return ms[0], {g: ms[g] for g in range(1, gamma_max + 1)}


def step_costs(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array,
    max_decode_len: int,
    gamma: int,
    *,
    position: int = 8,
    repeats: int = 30,
    block_sizes=(),
) -> dict[str, Any]:
    """c, the verify-cost ratio and T(k) of a model pair, on caches built once (not timed).

    One cached target step, one draft step, one γ + 1 verify step and one target call per k in
    `block_sizes`, at decoder position `position`, caches built from `encoder_input_tokens` (int32
    [batch, enc_len]); timed by `benchmark.time_decoder_steps`.

    Returns:
      `benchmark.time_decoder_steps`'s dict (`c`, `verify_cost_ratio`, `*_step_ms`,
      `block_step_ms`).
    """
    enc = jnp.asarray(encoder_input_tokens)
    module, draft = spec_model.module, spec_model.draft
    # Packed once here for the CPU kernel (no-op when off): the steps below run in the timed loop.
    weight_dtype = getattr(spec_model, "cpu_weight_dtype", "float32")
    target_params = steps.pack_params(module, target_params, weight_dtype)
    draft_params = (
        draft.pack_params(draft_params) if hasattr(draft, "pack_params") else draft_params
    )
    target_cache = jax.jit(lambda tp, e: steps.prepare_cache(module, tp, e, max_decode_len))(
        target_params, enc
    )
    draft_cache = jax.jit(lambda dp, e: draft.init_cache(dp, e, max_decode_len))(draft_params, enc)

    def draft_step(dp, e, tokens, pos, cache):
        return draft.make_step(dp, e)(tokens, pos, cache)  # the cache is built once, above

    largest = max([gamma + 1, *block_sizes])
    return benchmark.time_decoder_steps(
        benchmark.decoder_step(module),
        (target_params, enc),
        target_cache,
        draft_step,
        (draft_params, enc),
        draft_cache,
        batch=enc.shape[0],
        position=max(0, min(position, max_decode_len - largest)),
        gamma=gamma,
        repeats=repeats,
        block_sizes=tuple(block_sizes),
    )


_CURVES: dict[tuple, CostCurve] = {}


def measure_cost_curve(
    spec_model,
    target_params,
    draft_params,
    encoder_input_tokens: Array,
    max_decode_len: int,
    gamma_max: int,
    settings: Mapping[str, Any],
    verification: str = "token",
    repeats: int = 20,
) -> CostCurve:
    """The `CostCurve` of this model pair and shape; measured once per process, then cached.

    The cache key is the model pair (object identity), the batch and encoder shape, the decode
    length, gamma_max, the sampling settings and the verification rule.

    Raises:
      ValueError: gamma_max < 1.
    """
    if not isinstance(gamma_max, int) or gamma_max < 1:
        raise ValueError(f"gamma_max must be an int >= 1; got gamma_max={gamma_max!r}.")
    key = (
        id(spec_model),
        id(spec_model.draft),
        tuple(encoder_input_tokens.shape),
        max_decode_len,
        gamma_max,
        tuple(sorted(settings.items())),
        verification,
    )
    if key not in _CURVES:
        costs = step_costs(
            spec_model,
            target_params,
            draft_params,
            encoder_input_tokens,
            max_decode_len,
            gamma_max,
            repeats=repeats,
            block_sizes=range(1, gamma_max + 2),
        )
        vocab = spec_model.module.config.vocab_size
        batch = encoder_input_tokens.shape[0]
        s1, overhead = measure_sampling_ms(
            batch, vocab, gamma_max, settings, verification, repeats=repeats
        )
        _CURVES[key] = CostCurve(costs["block_step_ms"], costs["draft_step_ms"], s1, overhead)
    return _CURVES[key]
