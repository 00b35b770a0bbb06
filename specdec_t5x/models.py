"""Model glue, shaped like T5X's `EncoderDecoderModel` (`t5x/models.py`).

Glue only: encode once, build the cache, build a step closure, call an injectable decode function.

* `EncoderDecoderModel`: one T5 network; `predict_batch_with_aux` calls `decode_fn` (gin-injectable,
  default `decoding.temperature_sample`) with T5X's keyword contract; `score_batch` and `loss_fn`
  are teacher-forced.
* `SpeculativeEncoderDecoderModel` (defined in `speculative_model`, re-exported here): holds a
  target network and a draft (`drafts.Draft`); its `predict_batch_with_aux` calls
  `speculative.speculative_sample` and returns its statistics in the aux dict, so a T5X-shaped
  eval loop runs it unchanged (T5X's "Option 2", like `contrib/calm`); its `decode` is the same
  under typed settings (`sampling.SamplingSettings`, `speculation.Speculation`).

Both keep T5X's model contract as `t5x/infer.py`, `t5x/eval.py` and `t5x/utils.py` call it:
`FEATURE_CONVERTER_CLS` (seqio's `EncDecFeatureConverter`), `get_initial_variables(rng,
input_shapes, input_types=None)` returning `params` and `params_axes` (the logical axis names T5X's
`PjitPartitioner` shards by), `predict_batch`, `predict_batch_with_aux` and `score_batch` with
T5X's signatures. The decode functions' contracts are the Protocols `DecodeFnCallable` (T5X's) and
`SpeculativeDecodeFnCallable`.

Both closures handed to samplers follow the block-step contract `steps.BlockStep`; `encode`,
`init_cache`, `make_block_step` and `BlockStep` are re-exported from `steps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import optax

from specdec_t5x import cpu_kernel, decoding, network, steps

if TYPE_CHECKING:
    from specdec_t5x import speculative

Array = jax.Array


class DecodeFnCallable(Protocol):
    """T5X's decode-function contract (`t5x.models.DecodeFnCallable`), called with keywords only.

    `decoding.temperature_sample` is one; T5X's own `decoding.temperature_sample` is another.

    Args:
      inputs: int32 [batch, max_decode_len] decoder prompt buffer (all zeros: no prompt).
      cache: the decoder cache pytree of `tokens_to_logits`.
      tokens_to_logits: `DecodingState -> (logits float32 [batch * num_decodes, vocab], cache)`.
      eos_id: end-of-sequence id.
      num_decodes: decodes per example.
      decode_rng: PRNG key, or None.
      cache_offset: axis of the batch in the cache leaves (0 here: no scanned-layer offset).
      **kwargs: `decoder_params` (temperature, topk, topp, max_decode_steps, ...).

    Returns:
      (decodes int32 [batch, num_decodes, max_decode_len], scores float32 [batch, num_decodes]),
      sorted so that `[:, -1]` is the best.
    """

    def __call__(
        self,
        *,
        inputs: Array,
        cache: Mapping[str, Any],
        tokens_to_logits: decoding.TokensToLogits,
        eos_id: int,
        num_decodes: int,
        decode_rng: Array | None,
        cache_offset: int,
        **kwargs: Any,
    ) -> tuple[Array, Array]: ...


class SpeculativeDecodeFnCallable(Protocol):
    """The speculative decode-function contract, in the style of T5X's `DecodeFnCallable`: called
    with keywords only, T5X's named, the speculative ones in `**kwargs`.

    `speculative.speculative_sample` is the one here; its signature is the full list.

    Args:
      inputs: int32 [batch, max_decode_len] decoder prompt buffer (all zeros: no prompt).
      eos_id: end-of-sequence id.
      decode_rng: PRNG key, or None.
      **kwargs: `target_cache` / `draft_cache`, the caches of the two block steps;
        `target_tokens_to_logits` / `draft_tokens_to_logits`, the two `steps.BlockStep`s
        (`(tokens int32 [batch, k], positions int32 [batch], cache) -> (logits float32 [batch, k,
        vocab], cache)`); then gamma, temperature, topk, topp, ... (`decoder_params`, or bound by
        gin).

    Returns:
      (decodes int32 [batch, max_decode_len], `speculative.SpeculativeStats` of [batch] arrays).
    """

    def __call__(
        self, *, inputs: Array, eos_id: int, decode_rng: Array | None, **kwargs: Any
    ) -> tuple[Array, speculative.SpeculativeStats]: ...


class _EncDecFeatureConverter:
    """`seqio.EncDecFeatureConverter`, as T5X's class attribute, imported on first use (seqio
    imports TensorFlow, which decoding alone never needs)."""

    def __get__(self, obj, owner=None):
        import seqio

        return seqio.EncDecFeatureConverter


def require_features(batch: Mapping[str, Array], *keys: str) -> None:
    """Checks that `batch` has the token features `keys`, each an integer array [batch, len].

    Raises:
      ValueError: a feature is missing, not 2-D, or not of an integer dtype (naming it).
    """
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"batch is missing feature(s) {missing}; it has {sorted(batch)}.")
    for key in keys:
        shape, dtype = jnp.shape(batch[key]), jnp.result_type(batch[key])
        if len(shape) != 2 or not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(
                f"batch[{key!r}] must be int32 token ids [batch, length]; got {dtype} {shape}."
            )


# The step-function layer lives in `steps`; these names stay public here (T5X keeps its decoding
# callables next to the model glue too).
BlockStep = steps.BlockStep
encode = steps.encode
init_cache = steps.init_cache
make_block_step = steps.make_block_step
pack_params = steps.pack_params


# Adapts a block step to T5X's `tokens_to_logits(DecodingState) -> (float32 [B, vocab], cache)`.
one_token_logits_fn = decoding.one_token_logits


def decoder_prompt_inputs(batch: Mapping[str, Array], eos_id: int, prompt_with_targets: bool):
    """T5X's decoder buffer, int32 [batch, max_decode_len]: zeros, or (`prompt_with_targets`)
    `batch['decoder_input_tokens']` (int32 [batch, max_decode_len], the shifted targets) with EOS
    zeroed, as a forced prompt."""
    dec = batch["decoder_input_tokens"]
    if prompt_with_targets:
        return dec * (dec != eos_id)
    return jnp.zeros_like(dec)


class EncoderDecoderModel:
    """T5X-shaped encoder-decoder model (mirrors `t5x.models.EncoderDecoderModel`).

    Args:
      module: a `network.Transformer`.
      input_vocabulary / output_vocabulary: seqio vocabularies (or None; eos then defaults to 1).
      optimizer_def: optax optimizer used by `train` (may be None for inference).
      decode_fn: decode function called with T5X's keywords (`inputs, cache, tokens_to_logits,
        eos_id, num_decodes, decode_rng, cache_offset, **decoder_params`). Default
        `decoding.temperature_sample` (T5X defaults to beam search, which speculative decoding does
        not apply to).
      label_smoothing, z_loss, loss_normalizing_factor: training loss settings as in T5X.
      default_decoder_params: dict merged under per-call `decoder_params`.
      feature_converter_cls: overrides `FEATURE_CONVERTER_CLS` (T5X's argument), e.g.
        `seqio.EncDecFeatureConverter` subclasses; None keeps seqio's `EncDecFeatureConverter`.
      cpu_weight_dtype: storage of the decoder weights packed for the CPU kernel: 'float32'
        (default) or 'bfloat16' (CPU inference option: halves the bytes read, changes numerics).
      sampler: the baseline's draw (`decoding.SAMPLERS`), passed to `decode_fn` as its `sampler`
        keyword unless the call's `decoder_params` set one: 't5x' (T5X's tokens) or
        'inverse_cdf' (the speculative loop's draw: the fair baseline at T > 0). None (default)
        passes nothing (`decoding.temperature_sample` then draws as T5X). Needs a decode fn
        with a `sampler` keyword (`decoding.temperature_sample`).

    Raises:
      ValueError: `cpu_weight_dtype` not 'float32' or 'bfloat16'; `sampler` not None nor in
        `decoding.SAMPLERS`, or set both here and in `default_decoder_params`.
    """

    FEATURE_CONVERTER_CLS = _EncDecFeatureConverter()

    def __init__(
        self,
        module: network.Transformer,
        input_vocabulary=None,
        output_vocabulary=None,
        optimizer_def: optax.GradientTransformation | None = None,
        decode_fn: DecodeFnCallable = decoding.temperature_sample,
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        loss_normalizing_factor: float | None = None,
        default_decoder_params: Mapping[str, Any] | None = None,
        cpu_weight_dtype: str = "float32",
        sampler: str | None = None,
        feature_converter_cls: type | None = None,
    ):
        cpu_kernel.check_weight_dtype(cpu_weight_dtype)
        default_decoder_params = dict(default_decoder_params or {})
        if sampler is not None:
            decoding.check_sampler(sampler)
            if "sampler" in default_decoder_params:
                raise ValueError(
                    f"sampler={sampler!r} is also set in default_decoder_params "
                    f"({default_decoder_params['sampler']!r}); set it in one place."
                )
            default_decoder_params["sampler"] = sampler
        if feature_converter_cls is not None:
            self.FEATURE_CONVERTER_CLS = feature_converter_cls
        self.cpu_weight_dtype = cpu_weight_dtype
        self.module = module
        self.input_vocabulary = input_vocabulary
        self.output_vocabulary = output_vocabulary
        self.optimizer_def = optimizer_def
        self.decode_fn = decode_fn
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.loss_normalizing_factor = loss_normalizing_factor
        self.default_decoder_params = default_decoder_params

    @property
    def eos_id(self) -> int:
        vocab = self.output_vocabulary
        return 1 if vocab is None else int(vocab.eos_id)

    def get_initial_variables(
        self,
        rng: Array,
        input_shapes: Mapping[str, tuple[int, ...]],
        input_types: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Initial variables for inputs of the given shapes (T5X's `get_initial_variables`).

        Args:
          rng: PRNG key of the initialisation.
          input_shapes: feature name -> shape, e.g. `encoder_input_tokens` (batch, enc_len) and
            `decoder_input_tokens` (batch, max_decode_len); `encoder_/decoder_segment_ids` and
            `encoder_/decoder_positions` are used when present (packed batches).
          input_types: feature name -> dtype (T5X passes the dataset's); int32 where absent.

        Returns:
          `{'params': the parameter tree (T5X names), 'params_axes': T5X's logical axis names of
          every parameter}` (`flax.linen.partitioning.get_axis_names` turns the latter into the
          tree T5X's `PjitPartitioner.get_mesh_axes` reads).

        Raises:
          KeyError: `encoder_input_tokens` or `decoder_input_tokens` missing from `input_shapes`.
        """
        input_types = {} if input_types is None else input_types

        def ones(name):
            if name not in input_shapes:
                return None
            return jnp.ones(input_shapes[name], input_types.get(name, jnp.int32))

        dec = ones("decoder_input_tokens")
        return self.module.init(
            rng,
            ones("encoder_input_tokens"),
            dec,
            dec,
            ones("encoder_segment_ids"),
            ones("decoder_segment_ids"),
            ones("encoder_positions"),
            ones("decoder_positions"),
            enable_dropout=False,
        )

    def logits(self, params, batch: Mapping[str, Array], dropout_rng: Array | None = None) -> Array:
        """Teacher-forced float32 [batch, len, vocab] logits (packed batches supported: segment
        ids and positions are read when present); dropout on iff `dropout_rng` is given.

        Raises:
          ValueError: a required feature missing from `batch` or not int token ids [batch, len].
        """
        require_features(
            batch, "encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"
        )
        rngs = None if dropout_rng is None else {"dropout": dropout_rng}
        return self.module.apply(
            {"params": params},
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
            batch.get("encoder_positions"),
            batch.get("decoder_positions"),
            enable_dropout=dropout_rng is not None,
            rngs=rngs,
        )  # [b, L, V]

    def token_losses(self, logits: Array, batch: Mapping[str, Array]):
        """Per-token cross-entropy (with label smoothing) and z-loss, the weights and the normaliser.

        The pieces of `loss_fn` (T5X's `cross_entropy_with_logits` and `compute_weighted_cross_
        entropy`), shared with `specdec_t5x.training.distill.distillation_loss` so both honour
        `label_smoothing`, `z_loss` and `loss_normalizing_factor`.

        Args:
          logits: float32 [batch, len, vocab].
          batch: `decoder_target_tokens` int32 [batch, len]; optional `decoder_loss_weights`
            (default: targets > 0).

        Returns:
          (xent float32 [batch, len], z_loss float32 [batch, len], weights float32 [batch, len],
          normaliser float32 []: `loss_normalizing_factor`, else the number of weighted tokens).
        """
        targets = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights", (targets > 0).astype(jnp.float32))
        soft = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), self.label_smoothing)
        log_z = jax.nn.logsumexp(logits, axis=-1)
        xent = log_z - jnp.sum(soft * logits, axis=-1)  # [b, L]
        z = self.z_loss * jnp.square(log_z)
        norm = self.loss_normalizing_factor or jnp.maximum(jnp.sum(weights), 1.0)
        return xent, z, weights, jnp.asarray(norm, jnp.float32)

    def loss_fn(self, params, batch: Mapping[str, Array], dropout_rng: Array | None):
        """Teacher-forced cross-entropy (+ z-loss) as in T5X.

        Args:
          params: model parameters.
          batch: `encoder_input_tokens`, `decoder_input_tokens`, `decoder_target_tokens` int32
            [batch, len]; optional `decoder_loss_weights` (default: targets > 0).
          dropout_rng: PRNG key enabling dropout, or None.

        Returns:
          (loss float32 [], metrics dict of float32 [] values: `loss`, `z_loss`, `num_tokens`,
          `accuracy`).

        Raises:
          ValueError: a feature missing from `batch` or not int token ids [batch, length].
        """
        logits = self.logits(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        xent, z, weights, norm = self.token_losses(logits, batch)
        num_tokens = jnp.sum(weights)
        loss = jnp.sum((xent + z) * weights) / norm
        correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
        metrics = {
            "loss": loss,
            "z_loss": jnp.sum(z * weights) / norm,
            "num_tokens": num_tokens,
            "accuracy": jnp.sum(correct * weights) / jnp.maximum(num_tokens, 1.0),
        }
        return loss, metrics

    def score_batch(
        self, params, batch: Mapping[str, Array], return_intermediates: bool = False
    ) -> Array:
        """Teacher-forced sum of target-token log-probs: float32 [batch] (T5X `score_batch`).

        Args:
          params: model parameters (a speculative model's: the target's).
          batch: `encoder_input_tokens`, `decoder_input_tokens`, `decoder_target_tokens` int32
            [batch, len]; optional `decoder_loss_weights` float32 [batch, len].
          return_intermediates: T5X's option to return sown intermediates; not supported.

        Raises:
          ValueError: a feature missing from `batch` or not int token ids [batch, length];
            `return_intermediates=True`.
        """
        if return_intermediates:
            raise ValueError(
                "score_batch(return_intermediates=True) is not supported: the network sows no "
                "intermediates; call score_batch without it."
            )
        logits = self.logits(params, batch)
        targets = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights", (targets > 0).astype(jnp.float32))
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        token_scores = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(token_scores * weights, axis=-1)

    def pack_params(self, params):
        """`params` packed for cached CPU decoding (see `pack_params`); raw trees still work
        everywhere, but packing once here saves re-packing in every `predict_batch_with_aux`."""
        return pack_params(self.module, params, self.cpu_weight_dtype)

    def decoder_state(self, params, encoder_input_tokens: Array, max_decode_len: int):
        """Encodes once and returns `(cache, block_step)` for this model's decoder.

        Args:
          params: parameters (raw or packed; packed here once if raw).
          encoder_input_tokens: int32 [batch, enc_len], zero-padded.
          max_decode_len: L, the decoder cache length (tokens).

        Returns:
          (cache: the `steps.init_cache` tree for [batch] rows of length L, block_step: a
          `steps.BlockStep`, `(tokens int32 [batch, k], positions int32 [batch], cache) -> (logits
          float32 [batch, k, vocab], cache)`).
        """
        params = self.pack_params(params)
        cache = steps.prepare_cache(self.module, params, encoder_input_tokens, max_decode_len)
        return cache, steps.make_block_step(self.module, params, encoder_input_tokens)

    def predict_batch(self, params, batch, rng=None, **kwargs) -> Array:
        """Best decodes int32 [batch, max_decode_len] (T5X `predict_batch`); keywords as
        `predict_batch_with_aux`."""
        return self.predict_batch_with_aux(params, batch, rng, **kwargs)[0]

    def predict_batch_with_aux(
        self,
        params,
        batch: Mapping[str, Array],
        rng: Array | None = None,
        decoder_params: Mapping[str, Any] | None = None,
        return_all_decodes: bool = False,
        num_decodes: int = 1,
        prompt_with_targets: bool = False,
    ) -> tuple[Array, dict[str, Any]]:
        """Decodes a batch with `decode_fn` (mirrors T5X's `predict_batch_with_aux`).

        Args:
          params: model parameters: raw (the decoder projections are then packed for the CPU
            kernel inside every call: ~4-6% of a 64-token decode of the embedded target,
            experiments/pack_in_call) or from `pack_params` (packed once: no cost).
          batch: `encoder_input_tokens` int32 [batch, enc_len] and `decoder_input_tokens` int32
            [batch, max_decode_len] (its shape sets the decode length).
          rng: PRNG key for sampling (None: `PRNGKey(0)` inside the decode fn).
          decoder_params: extra keyword arguments for `decode_fn` (e.g. temperature, topk;
            sampler: 't5x' or 'inverse_cdf', see `decoding.temperature_sample`).
          return_all_decodes: return [batch, num_decodes, L] instead of the best [batch, L].
          num_decodes: samples per example.
          prompt_with_targets: use the decoder inputs (EOS zeroed) as a forced prompt.

        Returns:
          (decodes int32 [batch, L] or [batch, num_decodes, L], {'scores': float32 [batch] or
          [batch, num_decodes]}).

        Raises:
          ValueError: a feature missing from `batch` or not int token ids [batch, length]; bad
            sampling settings (from the decode fn).
        """
        require_features(batch, "encoder_input_tokens", "decoder_input_tokens")
        params = self.pack_params(params)  # once per call, outside the decode loop
        enc = batch["encoder_input_tokens"]
        inputs = decoder_prompt_inputs(batch, self.eos_id, prompt_with_targets)
        cache, block_step = self.decoder_state(params, enc, inputs.shape[1])
        if num_decodes > 1:
            # The cache is expanded by the decode fn; the step closure needs expanded inputs.
            block_step = steps.make_block_step(self.module, params, jnp.repeat(enc, num_decodes, 0))
        kwargs = {**self.default_decoder_params, **dict(decoder_params or {})}
        decodes, scores = self.decode_fn(
            inputs=inputs,
            cache=cache,
            tokens_to_logits=one_token_logits_fn(block_step),
            eos_id=self.eos_id,
            num_decodes=num_decodes,
            decode_rng=rng,
            cache_offset=0,
            **kwargs,
        )
        if return_all_decodes:
            return decodes, {"scores": scores}
        return decodes[:, -1, :], {"scores": scores[:, -1]}


def __getattr__(name: str):
    """`SpeculativeEncoderDecoderModel` from `speculative_model` (which builds on this module, so
    it is looked up on first use rather than imported above)."""
    if name == "SpeculativeEncoderDecoderModel":
        from specdec_t5x import speculative_model

        return speculative_model.SpeculativeEncoderDecoderModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
