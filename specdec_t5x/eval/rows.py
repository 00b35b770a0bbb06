"""The eval job's rows: each a decoder timed side by side with the others on the same batches.

A row (`Row`) has a key (its name in the metrics: 'baseline', 'baseline_t5x', γ, a tree's name
or 'auto'), compiles itself on the evaluation shapes, and decodes a batch in one timed call. The
job times `decode` alone; `prepare` (before it) and `observe` (after it, with the seconds) are
untimed, for rows that choose per call (auto γ: `specdec_t5x.auto.row`). The rows here are the
baseline (the target alone), a chain at a fixed γ and a token tree; `speculative_fn` is the one
place the job calls the speculative model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from specdec_t5x import models, sampling, steps
from specdec_t5x.speculation import Speculation

logger = logging.getLogger(__name__)

Batch = Mapping[str, Any]

# The baseline's draw (`decoding.SAMPLERS`): the speculative loop's own (one uniform per row,
# inverse CDF), so that a T > 0 speed-up is speculation alone; T5X's Gumbel draw is timed beside it
# ('baseline_t5x', `speedup_vs_t5x_sampler`). At T = 0 both are the argmax: one baseline.
BASELINE_SAMPLER = "inverse_cdf"


class Row(Protocol):
    """One timed row of the job.

    Attributes:
      key: its name in the metrics ('baseline', 'baseline_t5x', γ, 'tree(2,2)', 'auto').
    """

    key: Hashable

    def compile(self, batch: Batch, rng) -> None:
        """Compiles and runs once on the evaluation shapes (untimed)."""

    def prepare(self, batch: Batch) -> None:
        """Untimed work before each timed call (auto γ chooses and compiles its plan)."""

    def decode(self, batch: Batch, rng) -> tuple[Any, Any]:
        """The timed call: (tokens int32 [batch, max_decode_len], stats or None), on device."""

    def observe(self, seconds: float, tokens, stats) -> Any:
        """Untimed, after the call: what the row learns; returns its choice to record or None."""

    def report(self, flat: dict[str, Any], runs: Mapping[Hashable, Any], context: Any) -> None:
        """Adds the row's own entries to the flat metrics (most rows: none)."""


def speculative_fn(
    spec_model, sampling_settings: sampling.SamplingSettings, speculation: Speculation
):
    """Jitted `(target_params, draft_params, batch, rng) -> (tokens, aux)` at fixed settings: the
    one place the job calls the speculative model (its typed path,
    `SpeculativeEncoderDecoderModel.decode`).

    Args:
      spec_model: `models.SpeculativeEncoderDecoderModel`.
      sampling_settings: temperature, top-k, top-p for target and draft alike.
      speculation: the row's γ or token tree and its rule (`speculation.Speculation`).

    Returns:
      fn(target_params, draft_params, batch, rng) -> (decodes int32 [batch, max_decode_len],
      {'scores': float32 [batch], 'stats': per-row statistics}).
    """

    def predict(target_params, draft_params, batch, rng):
        return spec_model.decode(
            target_params,
            batch,
            rng,
            sampling=sampling_settings,
            speculation=speculation,
            draft_params=draft_params,
        )

    return jax.jit(predict)


def baseline_model(spec_model, sampler: str) -> models.EncoderDecoderModel:
    """The target alone, drawing with `sampler` (`decoding.SAMPLERS`)."""
    vocabulary = spec_model.output_vocabulary
    return models.EncoderDecoderModel(
        spec_model.module,
        vocabulary,
        vocabulary,
        cpu_weight_dtype=spec_model.cpu_weight_dtype,
        sampler=sampler,
    )


def baseline_samplers(settings: Mapping[str, Any]) -> dict[str, str]:
    """{row key: draw}: at T = 0 one baseline (T5X's argmax, bit for bit); at T > 0 the fair
    baseline and T5X's Gumbel draw beside it."""
    if sampling.is_greedy(settings["temperature"]):
        return {"baseline": "t5x"}
    return {"baseline": BASELINE_SAMPLER, "baseline_t5x": "t5x"}


class _Jitted:
    """A row of one jitted call on fixed parameters; compiled once per encoder length bucket."""

    key: Hashable = None
    target_params: Any = None

    def _call(self, batch, rng):
        raise NotImplementedError

    def compile(self, batch: Batch, rng) -> None:
        for enc in steps.warmup_sources(self.target_params, batch["encoder_input_tokens"]):
            logger.info("compiling %s (encoder length %d)", self.key, enc.shape[1])
            jax.block_until_ready(self._call({**batch, "encoder_input_tokens": enc}, rng))

    def prepare(self, batch: Batch) -> None:
        return None

    def observe(self, seconds: float, tokens, stats) -> None:
        return None

    def report(self, flat, runs, context) -> None:
        return None


class BaselineRow(_Jitted):
    """The target alone (`decoding.temperature_sample` through `models.EncoderDecoderModel`)."""

    def __init__(self, key: str, model: models.EncoderDecoderModel, target_params, settings):
        self.key, self.model, self.target_params = key, model, target_params
        settings = dict(settings)
        self._fn = jax.jit(
            lambda tp, b, rng: model.predict_batch_with_aux(tp, b, rng, decoder_params=settings)[0]
        )

    @property
    def sampler(self) -> str:
        return self.model.default_decoder_params["sampler"]

    def _call(self, batch, rng):
        return self._fn(self.target_params, batch, rng)

    def decode(self, batch: Batch, rng):
        return self._call(batch, rng), None


class ChainRow(_Jitted):
    """Speculative decoding with a chain of γ drafts per iteration."""

    def __init__(self, key: Hashable, spec_model, target_params, draft_params,
                 sampling_settings: sampling.SamplingSettings, speculation: Speculation):  # fmt: skip
        self.key, self.target_params, self.draft_params = key, target_params, draft_params
        self._fn = speculative_fn(spec_model, sampling_settings, speculation)

    def _call(self, batch, rng):
        return self._fn(self.target_params, self.draft_params, batch, rng)

    def decode(self, batch: Batch, rng):
        tokens, aux = self._call(batch, rng)
        return tokens, aux["stats"]


class TreeRow(ChainRow):
    """Speculative decoding with a token tree (one target call per tree per iteration)."""


def timed(fn, *args, compiles=None) -> tuple[Any, float]:
    """(result, wall seconds) of `fn(*args)` including `block_until_ready`."""
    if compiles is not None:
        compiles.active = True
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    if compiles is not None:
        compiles.active = False
    return out, seconds


class CompileCounter:
    """Counts XLA compilations while active (the timed loop must cause none)."""

    def __init__(self):
        self.count, self.active = 0, False

    def __call__(self, event: str, duration_s: float, **kwargs) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def host(tokens, stats):
    """A call's (tokens, stats) as NumPy (after the timed region)."""
    stats = None if stats is None else jax.tree_util.tree_map(np.asarray, stats)
    return np.asarray(tokens), stats
