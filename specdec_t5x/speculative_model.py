"""`SpeculativeEncoderDecoderModel`: T5X's model contract around speculative decoding.

T5X's "Option 2" (like `contrib/calm`): a `models.EncoderDecoderModel` that holds a target network
and a draft (`drafts.Draft`) and whose predictions come from `speculative.speculative_sample`
(`predict_batch_with_aux`, T5X's signature, with the statistics in the aux dict), so a T5X-shaped
eval loop runs it unchanged; `decode` is the same decode under typed settings
(`sampling.SamplingSettings`, `speculation.Speculation`). `models` re-exports the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x import models, network, speculative, steps, tree_shape
from specdec_t5x.sampling import SamplingSettings
from specdec_t5x.speculation import Speculation, split_decoder_params

Array = jax.Array


class SpeculativeEncoderDecoderModel(models.EncoderDecoderModel):
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
        draft = models.EncoderDecoderModel(self.draft.module).get_initial_variables(
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
        models.require_features(batch, "encoder_input_tokens", "decoder_input_tokens")
        kwargs = {**self.default_decoder_params, **dict(decoder_params or {})}
        sampling, speculation, rest = split_decoder_params(kwargs)
        decodes, aux = self.decode(
            params,
            batch,
            rng,
            sampling=sampling,
            speculation=speculation,
            draft_params=draft_params,
            prompt_with_targets=prompt_with_targets,
            **rest,
        )
        if return_all_decodes:  # [b, L] -> [b, 1, L]
            return decodes[:, None], {**aux, "scores": aux["scores"][:, None]}
        return decodes, aux

    def decode(
        self,
        params,
        batch: Mapping[str, Array],
        rng: Array | None = None,
        *,
        sampling: SamplingSettings | None,
        speculation: Speculation | None,
        draft_params=None,
        prompt_with_targets: bool = False,
        **decoder_params: Any,
    ) -> tuple[Array, dict[str, Any]]:
        """Speculative decodes of a batch under typed settings (the eval job's path).

        `predict_batch_with_aux` converts its `decoder_params` dict with
        `speculation.split_decoder_params` and calls this. The decode fn (`decode_fn`, default
        `speculative.speculative_sample`) gets every field of `sampling`, the set fields of
        `speculation`, and `decoder_params`, over `default_decoder_params`.

        Args:
          params: target parameters (with `draft_in_params`: and the draft's under 'draft').
          batch: `encoder_input_tokens` int32 [batch, enc_len] and `decoder_input_tokens` int32
            [batch, max_decode_len] (its shape sets the decode length).
          rng: PRNG key for sampling (None: `PRNGKey(0)` in the decode fn); unused in argmax mode.
          sampling: `sampling.SamplingSettings` (temperature, topk, topp), applied to target and
            draft alike; None: the decode fn's own (its defaults or gin bindings, as T5X's
            binaries bind them).
          speculation: `speculation.Speculation` (gamma or tree, tree_rule, verification,
            draft_confidence_threshold, max_decode_steps); None, or a field None: the decode fn's
            own.
          draft_params: draft parameters (default `self.draft.params`). Pass them explicitly under
            `jax.jit` so they are arguments, not compile-time constants.
          prompt_with_targets: use the decoder inputs (EOS zeroed) as a forced prompt.
          **decoder_params: further keyword arguments of the decode fn, passed on as given.

        Returns:
          (decodes int32 [batch, max_decode_len]: prompt, generated tokens, EOS, then zeros;
          {'scores': float32 [batch], the log-probability of each decode's generated tokens under
          the target's adjusted distribution (T5X's `temperature_sample` scores: 0 at T = 0; NaN
          with a token tree, which keeps no score), 'stats': `speculative.SpeculativeStats` (with
          a tree: `tree.TreeStats`) of per-row [batch] counts (iterations = target calls,
          accepted and proposed drafts, ...)}).

        Raises:
          ValueError: a feature missing from `batch` or not int token ids [batch, length]; no
            `gamma` (nor `tree`) given or bound, bad γ, tree or sampling settings (from the decode
            fn); see `split_params`.
        """
        models.require_features(batch, "encoder_input_tokens", "decoder_input_tokens")
        params, draft_params = self.split_params(params, draft_params)
        kwargs = {**self.default_decoder_params, **decoder_params}
        if sampling is not None:
            kwargs.update(sampling.decoder_params())
        if speculation is not None:
            kwargs.update(speculation.decoder_params())
        tree = kwargs.get("tree")
        enc = batch["encoder_input_tokens"]
        inputs = models.decoder_prompt_inputs(batch, self.eos_id, prompt_with_targets)
        # A token tree of K nodes needs K - 1 slots past max_decode_len to stay whole near the
        # length limit (`tree.TreeStep.cache_slots`); the chain keeps max_decode_len.
        extra_slots = 0 if tree is None else tree_shape.parse_tree(tree).num_nodes - 1
        (target_cache, target_step), (draft_cache, draft_step) = self.states(
            params, draft_params, enc, inputs.shape[1] + extra_slots
        )
        decodes, stats = self.decode_fn(
            inputs=inputs,
            target_cache=target_cache,
            target_tokens_to_logits=target_step,
            draft_cache=draft_cache,
            draft_tokens_to_logits=draft_step,
            eos_id=self.eos_id,
            decode_rng=rng,
            **kwargs,
        )
        scores = getattr(stats, "log_prob", None)  # token trees keep no score
        if scores is None:
            scores = jnp.full(decodes.shape[:1], jnp.nan, jnp.float32)
        return decodes, {"scores": scores, "stats": stats}
