"""Model glue, shaped like T5X's `EncoderDecoderModel` (`t5x/models.py`).

Glue only: encode once, build the cache, build a step closure, call an injectable decode function.

* `EncoderDecoderModel`: one T5 network; `predict_batch_with_aux` calls `decode_fn` (gin-injectable,
  default `decoding.temperature_sample`) with T5X's keyword contract; `score_batch` and `loss_fn`
  are teacher-forced.
* `SpeculativeEncoderDecoderModel`: holds a target network and a draft (`drafts.Draft`); its
  `predict_batch_with_aux` calls `speculative.speculative_sample` and returns its statistics in the
  aux dict, so a T5X-shaped eval loop runs it unchanged (T5X's "Option 2", like `contrib/calm`).

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
    """The speculative decode-function contract (`speculative.speculative_sample`).

    Args:
      inputs: int32 [batch, max_decode_len] decoder prompt buffer (all zeros: no prompt).
      target_cache / draft_cache: the caches of the two block steps.
      target_tokens_to_logits / draft_tokens_to_logits: `steps.BlockStep`s, `(tokens int32
        [batch, k], positions int32 [batch], cache) -> (logits float32 [batch, k, vocab], cache)`.
      eos_id: end-of-sequence id.
      decode_rng: PRNG key, or None.
      **kwargs: gamma, temperature, topk, topp, ... (`decoder_params`, or bound by gin).

    Returns:
      (decodes int32 [batch, max_decode_len], `speculative.SpeculativeStats` of [batch] arrays).
    """

    def __call__(
        self,
        inputs: Array,
        target_cache: Any,
        target_tokens_to_logits: steps.BlockStep,
        draft_cache: Any,
        draft_tokens_to_logits: steps.BlockStep,
        eos_id: int,
        *,
        decode_rng: Array | None = None,
        **kwargs: Any,
    ) -> tuple[Array, speculative.SpeculativeStats]: ...


class _EncDecFeatureConverter:
    """`seqio.EncDecFeatureConverter`, as T5X's class attribute, imported on first use (seqio
    imports TensorFlow, which decoding alone never needs)."""

    def __get__(self, obj, owner=None):
        import seqio

        return seqio.EncDecFeatureConverter


def _require(batch: Mapping[str, Array], *keys: str) -> None:
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


def one_token_logits_fn(block_step: BlockStep) -> decoding.TokensToLogits:
    """Adapts a block step to T5X's `tokens_to_logits(DecodingState) -> ([B, vocab], cache)`."""

    def tokens_to_logits(state: decoding.DecodingState):
        logits, cache = block_step(state.cur_token, state.cur_index, state.cache)
        return logits[:, 0], cache  # [B, 1, V] -> [B, V]

    return tokens_to_logits


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
        _require(batch, "encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")
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
        _require(batch, "encoder_input_tokens", "decoder_input_tokens")
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


class SpeculativeEncoderDecoderModel(EncoderDecoderModel):
    """An `EncoderDecoderModel` whose predictions come from speculative decoding.

    Holds the target network (`module`, M_p) and a draft (`drafts.Draft`, M_q). Training and
    scoring stay target-only. The draft's parameters reach the decode in one of two ways:

    * `draft_in_params=False` (default): they travel separately (`draft_params`, default
      `draft.params`); initial variables are the target's alone.
    * `draft_in_params=True` (T5X's binaries, which pass one parameter tree to
      `predict_batch_with_aux`): a T5 draft's parameters are the subtree `params['draft']`, so
      they enter T5X's jit as an argument and T5X's partitioner shards them by their own logical
      axes. `get_initial_variables` then adds the draft's variables under 'draft'; a T5X
      checkpoint of the target gets them at restore from the draft's own T5X checkpoint
      (`t5x_binaries.AddDraftParams`, a T5X state transformation function).

    Args:
      module: target `network.Transformer`.
      draft: a `drafts.Draft` (T5 model, unigram, bigram or source-copy).
      decode_fn: the speculative decode function (default `speculative.speculative_sample`), a
        `SpeculativeDecodeFnCallable`; gin binds gamma / temperature / topk / topp on it.
      draft_in_params: see above (needs a T5 draft, one with a `network.Transformer` module).
      Other arguments as `EncoderDecoderModel`, except `sampler`.

    Raises:
      ValueError: a `sampler` (the speculative loop always draws by inverse CDF; `sampler` picks
        the draw of an `EncoderDecoderModel` baseline); `draft_in_params` with a draft that has
        no network; or as `EncoderDecoderModel`.
    """

    def __init__(
        self,
        module,
        draft,
        input_vocabulary=None,
        output_vocabulary=None,
        draft_in_params: bool = False,
        **kwargs,
    ):
        from specdec_t5x import speculative  # local: speculative imports nothing from here

        if kwargs.get("sampler") is not None:
            raise ValueError(
                f"SpeculativeEncoderDecoderModel takes no sampler (got sampler="
                f"{kwargs['sampler']!r}): the speculative loop always draws by inverse CDF; "
                "sampler sets the draw of a models.EncoderDecoderModel baseline."
            )

        if draft_in_params and not isinstance(getattr(draft, "module", None), network.Transformer):
            raise ValueError(
                f"draft_in_params=True needs a T5 draft (drafts.T5Draft); got {type(draft).__name__}."
            )
        kwargs.setdefault("decode_fn", speculative.speculative_sample)
        super().__init__(module, input_vocabulary, output_vocabulary, **kwargs)
        self.draft = draft
        self.draft_in_params = bool(draft_in_params)

    def get_initial_variables(self, rng, input_shapes, input_types=None) -> dict[str, Any]:
        """The target's initial variables (`EncoderDecoderModel.get_initial_variables`); with
        `draft_in_params`, the draft's `params` and `params_axes` are added under 'draft'."""
        variables = super().get_initial_variables(rng, input_shapes, input_types)
        if not self.draft_in_params:
            return variables
        draft = EncoderDecoderModel(self.draft.module).get_initial_variables(
            jax.random.fold_in(rng, 1), input_shapes, input_types
        )
        return {
            name: {**variables[name], "draft": draft[name]} for name in ("params", "params_axes")
        }

    def split_params(self, params, draft_params=None) -> tuple[Any, Any]:
        """`(target params, draft params)` from the arguments of `predict_batch_with_aux`.

        Raises:
          ValueError: `draft_in_params` and no 'draft' subtree in `params`, or draft parameters
            given both ways.
        """
        if not self.draft_in_params:
            return params, self.draft.params if draft_params is None else draft_params
        if "draft" not in params:
            raise ValueError(
                "draft_in_params=True but params has no 'draft' subtree: restore the draft with "
                "t5x_binaries.AddDraftParams (gin/t5x/speculative.gin binds it) or pass a tree "
                "from get_initial_variables."
            )
        if draft_params is not None:
            raise ValueError("draft_params given, but the draft is in params['draft']: pass one.")
        target = {k: v for k, v in params.items() if k != "draft"}
        return target, params["draft"]

    def states(self, params, draft_params, encoder_input_tokens: Array, max_decode_len: int):
        """`((target_cache, target_step), (draft_cache, draft_step))` for one batch.

        The source is encoded once by the target; a draft that shares the target's encoder
        (`drafts.T5Draft(share_target_encoder=True)`) builds its cache from that output instead of
        encoding again.

        Args:
          params: target parameters (raw or packed); draft_params: the draft's.
          encoder_input_tokens: int32 [batch, enc_len]; max_decode_len: L.
        """
        if not getattr(self.draft, "shares_target_encoder", False):
            target = self.decoder_state(params, encoder_input_tokens, max_decode_len)
            return target, self.draft.prepare(draft_params, encoder_input_tokens, max_decode_len)
        params = self.pack_params(params)
        draft_params = self.draft.pack_params(draft_params)  # once, outside the decode loop

        def setup(tokens):  # at the sources' length bucket on the CPU path (`steps.bucketed`)
            encoded = steps.encode(self.module, params, tokens, buckets=False)
            cache = steps.init_cache(self.module, params, encoded, tokens, max_decode_len)
            return cache, self.draft.init_cache(draft_params, tokens, max_decode_len, encoded)

        def pad(caches, enc_len):
            return tuple(steps.pad_cross_cache(c, enc_len) for c in caches)

        cache, draft_cache = steps.bucketed(params, encoder_input_tokens, setup, pad)
        target = cache, steps.make_block_step(self.module, params, encoder_input_tokens)
        draft = draft_cache, self.draft.make_step(draft_params, encoder_input_tokens)
        return target, draft

    def draft_state(self, params, draft_params, encoder_input_tokens: Array, max_decode_len: int):
        """`(draft_cache, draft_step)` alone (e.g. to time the draft): a draft sharing the
        target's encoder gets the target's encoder output (computed here from `params`).

        Args:
          params: target parameters (read only by a draft that shares the target's encoder).
          draft_params: the draft's parameters.
          encoder_input_tokens: int32 [batch, enc_len]; max_decode_len: L (tokens).

        Returns:
          (draft_cache, draft_step: a `steps.BlockStep`, logits float32 [batch, k, vocab]).
        """
        encoded = None
        if getattr(self.draft, "shares_target_encoder", False):
            encoded = steps.encode(self.module, params, encoder_input_tokens)
        return self.draft.prepare(draft_params, encoder_input_tokens, max_decode_len, encoded)

    def predict_batch_with_aux(
        self,
        params,
        batch: Mapping[str, Array],
        rng: Array | None = None,
        decoder_params: Mapping[str, Any] | None = None,
        return_all_decodes: bool = False,
        num_decodes: int = 1,
        prompt_with_targets: bool = False,
        *,
        draft_params=None,
    ) -> tuple[Array, dict[str, Any]]:
        """Speculative decodes and their aux (T5X's `predict_batch_with_aux` signature).

        Args:
          params: target parameters (with `draft_in_params`: and the draft's under 'draft').
          batch: as `EncoderDecoderModel.predict_batch_with_aux`.
          rng: PRNG key for sampling.
          decoder_params: extra keyword arguments for the decode fn (gamma, temperature, ...).
          return_all_decodes: return [batch, 1, L] decodes and [batch, 1] scores (T5X's layout).
          num_decodes: must be 1: one decode per example (T5X's beam search and several samples
            per example are `EncoderDecoderModel`'s).
          prompt_with_targets: use the decoder inputs (EOS zeroed) as a forced prompt.
          draft_params: draft parameters (default `self.draft.params`). Pass them explicitly under
            `jax.jit` so they are arguments, not compile-time constants.

        Returns:
          (decodes int32 [batch, max_decode_len]: prompt, generated tokens, EOS, then zeros;
          {'scores': float32 [batch], the log-probability of each decode's generated tokens under
          the target's adjusted distribution (T5X's `temperature_sample` scores: 0 at T = 0),
          'stats': `speculative.SpeculativeStats` of per-row [batch] counts (iterations = target
          calls, accepted and proposed drafts, ...)}).

        Raises:
          ValueError: `num_decodes` other than 1; a feature missing from `batch` or not int token
            ids [batch, length]; no `gamma` (nor `tree`) given or bound (from the decode fn); bad
            γ, tree or sampling settings (from the decode fn); see `split_params`.
        """
        if num_decodes != 1:
            raise ValueError(
                f"speculative decoding returns one decode per example; got num_decodes="
                f"{num_decodes} (beam search or several samples per example: decode with "
                "models.EncoderDecoderModel)."
            )
        _require(batch, "encoder_input_tokens", "decoder_input_tokens")
        params, draft_params = self.split_params(params, draft_params)
        kwargs = {**self.default_decoder_params, **dict(decoder_params or {})}
        from specdec_t5x import tree as tree_lib

        tree = kwargs.get("tree")
        enc = batch["encoder_input_tokens"]
        inputs = decoder_prompt_inputs(batch, self.eos_id, prompt_with_targets)
        # A token tree of K nodes needs K - 1 slots past max_decode_len to stay whole near the
        # length limit (`tree.TreeStep.cache_slots`); the chain keeps max_decode_len.
        extra_slots = 0 if tree is None else tree_lib.parse_tree(tree).num_nodes - 1
        (target_cache, target_step), (draft_cache, draft_step) = self.states(
            params, draft_params, enc, inputs.shape[1] + extra_slots
        )
        decodes, stats = self.decode_fn(
            inputs,
            target_cache,
            target_step,
            draft_cache,
            draft_step,
            self.eos_id,
            decode_rng=rng,
            **kwargs,
        )
        scores = getattr(stats, "log_prob", None)  # token trees keep no score
        if scores is None:
            scores = jnp.full(decodes.shape[:1], jnp.nan, jnp.float32)
        if return_all_decodes:
            decodes, scores = decodes[:, None], scores[:, None]  # [b, L] -> [b, 1, L]
        return decodes, {"scores": scores, "stats": stats}
