"""Random target/draft pairs of any T5 shape, for measuring c and verify/step without trained weights.

`measure_step_costs(target_config, draft_config, ...)` builds both networks with random
parameters (`random_params`), fills their decode caches and times the target's one-token step, the
draft's step and the γ + 1-token verify call with the step timer (`timing.step_timer`): the
paper's c (§3.4, Table 4) and the verify-call ratio for model sizes we have no weights for.
Behind `scripts/measure_c.py`, `scripts/bench_vs_hf.py` and the accelerator benchmark; never
imported by the eval job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import network, steps
from specdec_t5x.timing import step_timer


@dataclasses.dataclass
class _Decoder:
    """A randomly initialised model, its encoder inputs, a fresh cache and its jitted step."""

    params: Any
    encoder_input_tokens: jax.Array  # int32 [batch, enc_len]
    cache: Any
    step: Any  # (params, enc_tokens, tokens [b, k], positions [b], cache) -> (logits, cache)


def _random_decoder(config: network.T5Config, batch: int, enc_len: int, max_len: int, seed: int):
    module = network.Transformer(config)
    params = steps.pack_params(module, random_params(module, seed))  # CPU kernel: pack once
    key = jax.random.PRNGKey(seed + 1)
    tokens = jax.random.randint(key, (batch, enc_len), 2, config.vocab_size).astype(jnp.int32)

    def new_cache(params, tokens):
        return steps.prepare_cache(module, params, tokens, max_len)

    cache = jax.jit(new_cache)(params, tokens)
    return _Decoder(
        params, tokens, cache, jax.jit(step_timer.decoder_step(module), donate_argnums=(4,))
    )


def random_params(module: network.Transformer, seed: int = 0) -> Any:
    """Parameters of `module` drawn with NumPy: N(0, 1/fan_in) matrices, unit norm scales.

    Cheaper than `module.init` (whose jitted initialisers take seconds to compile even for tiny
    models with T5's 32k vocabulary); timings do not depend on the values.
    """
    ones = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    init = lambda e, d: module.init(jax.random.PRNGKey(0), e, d, d, enable_dropout=False)
    shapes = jax.eval_shape(init, ones, ones)["params"]
    rng = np.random.default_rng(seed)

    def draw(leaf):
        if len(leaf.shape) == 1:
            return jnp.ones(leaf.shape, leaf.dtype)
        values = rng.standard_normal(leaf.shape, np.float32) / np.sqrt(leaf.shape[0])
        return jnp.asarray(values, leaf.dtype)

    return jax.tree_util.tree_map(draw, shapes)


def count_params(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def config_dict(config: network.T5Config) -> dict[str, Any]:
    """`config` as JSON-ready values (dtype by name, activations as a list)."""
    out = dataclasses.asdict(config)
    out["dtype"] = jnp.dtype(config.dtype).name
    out["mlp_activations"] = list(config.mlp_activations)
    return out


def measure_step_costs(
    target_config: network.T5Config,
    draft_config: network.T5Config,
    batch: int = 1,
    enc_len: int = 64,
    max_len: int = 128,
    gamma: int = 5,
    repeats: int = 30,
    warmup: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Median wall time of target, draft and verify decoder steps, and the ratios c and verify.

    Args:
      target_config, draft_config: the two models (random weights).
      batch: decode batch size.
      enc_len: encoder input length (all tokens valid).
      max_len: decoder cache length; steps run at position max_len // 2 (attention reads the whole
        position-masked cache anyway).
      gamma: draft tokens per iteration; the verify step scores γ + 1 tokens.
      repeats: timed rounds (each times all three steps once).
      warmup: untimed rounds after compilation.
      seed: PRNG seed of weights and inputs.

    Returns:
      dict with `target_step_ms`, `draft_step_ms`, `verify_step_ms` (medians), their
      `*_ms_iqr` ([p25, p75]), `c` = draft / target, `verify_cost_ratio` = verify / target,
      the settings, both configs and parameter counts, and `jax_backend`.

    Raises:
      ValueError: γ < 1, repeats < 1, or max_len too short for the verify block.
    """
    if gamma < 1 or repeats < 1 or max_len < gamma + 2:
        raise ValueError(
            f"need gamma >= 1, repeats >= 1, max_len >= gamma + 2; got {gamma}, {repeats}, {max_len}."
        )
    target = _random_decoder(target_config, batch, enc_len, max_len, seed)
    draft = _random_decoder(draft_config, batch, enc_len, max_len, seed + 2)
    result = step_timer.time_decoder_steps(
        target.step,
        (target.params, target.encoder_input_tokens),
        target.cache,
        draft.step,
        (draft.params, draft.encoder_input_tokens),
        draft.cache,
        batch=batch,
        position=min(max_len // 2, max_len - gamma - 1),
        gamma=gamma,
        repeats=repeats,
        warmup=warmup,
    )
    result.update(
        batch=batch,
        enc_len=enc_len,
        max_len=max_len,
        gamma=gamma,
        repeats=repeats,
        warmup=warmup,
        target_params=count_params(target.params),
        draft_params=count_params(draft.params),
        target_config=config_dict(target_config),
        draft_config=config_dict(draft_config),
        jax_backend=jax.default_backend(),
    )
    return result


def embedded_step_costs() -> dict[str, Any]:
    """`measure_step_costs` of the shipped En→De pair's shapes (gin/models/embedded_ende_*.gin): one
    cached decoder step, batch 1, 64-token source (`scripts/train_embedded.sh report`)."""
    from specdec_t5x import gin_utils  # local: gin stays unimported for the other callers

    gin_utils.parse(
        ["models/embedded_ende_target.gin", "models/embedded_ende_draft.gin"],
        ["VOCABULARY = None", "gin_utils.build.obj = (%TARGET_MODULE, %DRAFT_MODULE)"],
    )
    target, draft = gin_utils.build()
    return measure_step_costs(target.config, draft.config, batch=1, enc_len=64, max_len=128)
