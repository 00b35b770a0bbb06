"""Function-preserving widening of a T5 v1.1 network to a larger shape (same vocabulary).

`widen(params, config, new_config)` returns parameters of the `new_config` network that compute
exactly the same logits as `params` in the `config` network (up to float rounding). It lets a model
trained here stand in for a paper-scale one: the shipped embedded target widened to the T5-XXL shape
and the embedded draft widened to the T5-small shape have our real α at the paper's real cost ratio
(`benchmarks.accelerator`).

Why the function is kept (T5 v1.1, `network`):

* d_model, heads, head_dim and MLP units are zero-padded. New residual dimensions stay 0 in every
  layer (the embedding and every output projection write zeros there). Padded head_dim components
  add 0 to q·k (T5 does not scale logits by 1/sqrt(head_dim); the scale is folded into the query
  kernel), new heads have zero query/key/value/out kernels and zero relative-position biases, so
  they attend uniformly to zero values and their zero `out` rows add nothing. New MLP units
  compute gelu(0) * 0 = 0 and have zero `wo` rows.
* RMSNorm: the mean of x² over D dims is (d/D) times the mean over the d real dims, so
  x * rsqrt((d/D) m + ε') * s' equals x * rsqrt(m + ε) * s when s' = s * sqrt(d/D) and
  ε' = ε * d/D (`T5Config.layer_norm_epsilon`; `widen_config` sets it).
* Extra layers are copies of existing layers (layer i copies layer i mod n_old) whose attention
  `out` and MLP `wo` kernels are zero: they compute real activations but add nothing to the
  residual stream.

The logits layer must be untied (`logits_via_embedding=False`, T5 v1.1): a tied one divides by
sqrt(d_model), which widening changes. The vocabulary is kept: padded vocabulary rows would give
logit 0, which could win an argmax.

At load time (`T5_1_1_SHAPES`, `shape_config`, `widen_to_shape`): the eval job's TARGET_SHAPE
macro (gin/models/embedded_ende_target.gin) widens the shipped target to T5 1.1 small, base or
large as it loads, so the shipped drafts run against a target at the paper's cost ratios with the
embedded pair's α (same logits, hence the same greedy outputs and distributions).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import network

_SHAPE_FIELDS = ("emb_dim", "num_heads", "head_dim", "mlp_dim")
_LAYER = re.compile(r"layers_(\d+)$")


def _t5_shape(emb_dim: int, num_heads: int, mlp_dim: int, layers: int) -> dict[str, int]:
    return dict(
        emb_dim=emb_dim,
        num_heads=num_heads,
        head_dim=64,
        mlp_dim=mlp_dim,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
    )


# Widths and depths of T5X's t5_1_1/{small,base,large}.gin (gin/models/t5_1_1_*.gin).
T5_1_1_SHAPES = {
    "small": _t5_shape(512, 6, 1024, 8),
    "base": _t5_shape(768, 12, 2048, 12),
    "large": _t5_shape(1024, 16, 2816, 24),
}


def widen_config(config: network.T5Config, shape: network.T5Config) -> network.T5Config:
    """`shape`'s widths and depths with `config`'s vocabulary, activations, logits layer and the
    layer-norm ε that keeps the function (ε * d_old / d_new).

    Args:
      config: the original model's config.
      shape: a config giving the new emb_dim, num_heads, head_dim, mlp_dim, layer counts, dtype and
        scan_layers (e.g. T5 1.1 XXL's).
    """
    return dataclasses.replace(
        shape,
        vocab_size=config.vocab_size,
        mlp_activations=tuple(config.mlp_activations),
        logits_via_embedding=config.logits_via_embedding,
        dropout_rate=config.dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon * config.emb_dim / shape.emb_dim,
    )


def shape_config(config: network.T5Config, shape: str | None) -> network.T5Config:
    """The config of `config`'s model widened to a named T5 1.1 shape (`T5_1_1_SHAPES`).

    Args:
      config: the shipped model's config.
      shape: 'small', 'base' or 'large'; None returns `config` itself.

    Returns:
      `widen_config(config, ...)` at that shape's widths and depths: `config`'s vocabulary,
      activations, dtype and layer layout, the layer-norm ε that keeps the function.

    Raises:
      ValueError: an unknown shape name (listing the valid ones).
    """
    if shape is None:
        return config
    if not isinstance(shape, str) or shape not in T5_1_1_SHAPES:
        raise ValueError(
            f"target shape must be one of {sorted(T5_1_1_SHAPES)} (T5 1.1 widths and depths) or "
            f"None (as shipped); got {shape!r}."
        )
    return widen_config(config, dataclasses.replace(config, **T5_1_1_SHAPES[shape]))


def widen_to_shape(
    params: Any, config: network.T5Config, shape: str | None, dtype: Any = None
) -> Any:
    """`params` widened to a named T5 1.1 shape as they load (the eval job's TARGET_SHAPE).

    The widened tree is built leaf by leaf from `params` (`widen`); gin passes the freshly loaded
    tree and keeps only the result, so the one full-size copy is the widened one.

    Args:
      params: parameter tree of `network.Transformer(config)` (e.g. `embedded.load_params`).
      config: its config.
      shape: 'small', 'base' or 'large' (`T5_1_1_SHAPES`); None returns `params` unchanged.
      dtype: as `widen` (None keeps each leaf's dtype: float32 from `embedded.load_params`).

    Returns:
      Parameters of `network.Transformer(shape_config(config, shape))` computing the same logits
      (float32: to ~1e-5).

    Raises:
      ValueError: an unknown shape name, or a shape smaller than `config` in some width or depth.
    """
    if shape is None:
        return params
    return widen(params, config, shape_config(config, shape), dtype)


def unwidened_encoder_config(config: network.T5Config, target_shape: str | None):
    """The target's encoder config for a draft that reads the target's encoder output.

    Such a draft (`network.TargetEncoderTransformer`, gin/models/embedded_*_draft_te.gin) was
    trained on the shipped target's encoder and cross-attends over its width, so it cannot follow
    a widened target.

    Args:
      config: the shipped target's config.
      target_shape: the target's TARGET_SHAPE; must be None.

    Returns:
      `config`.

    Raises:
      ValueError: `target_shape` is not None (naming the drafts to use instead).
    """
    if target_shape is not None:
        raise ValueError(
            "a draft that reads the target's encoder output (gin/models/embedded_sum_draft_te.gin, "
            "gin/models/embedded_ende_draft_te.gin) cannot follow a target widened to "
            f"TARGET_SHAPE={target_shape!r}: it cross-attends over the shipped target's encoder "
            "width. Use the draft with its own encoder instead (gin/models/embedded_sum_draft.gin "
            "for summarization, gin/models/embedded_ende_draft.gin for En->De), or TARGET_SHAPE="
            "None."
        )
    return config


def _check(config: network.T5Config, new: network.T5Config) -> None:
    if new.vocab_size != config.vocab_size:
        raise ValueError(
            f"widen keeps the vocabulary: new vocab_size={new.vocab_size}, expected "
            f"{config.vocab_size}."
        )
    if config.logits_via_embedding or new.logits_via_embedding:
        raise ValueError(
            "widen needs an untied logits layer (logits_via_embedding=False, T5 v1.1); a tied one "
            "divides by sqrt(emb_dim), which widening changes."
        )
    if tuple(new.mlp_activations) != tuple(config.mlp_activations):
        raise ValueError(
            f"mlp_activations differ: {tuple(new.mlp_activations)} vs "
            f"{tuple(config.mlp_activations)}."
        )
    for name in (*_SHAPE_FIELDS, "num_encoder_layers", "num_decoder_layers"):
        if getattr(new, name) < getattr(config, name):
            raise ValueError(
                f"widen only grows a model: new {name}={getattr(new, name)} < "
                f"{getattr(config, name)}."
            )
    eps = config.layer_norm_epsilon * config.emb_dim / new.emb_dim
    if not math.isclose(new.layer_norm_epsilon, eps, rel_tol=1e-6):
        raise ValueError(
            f"new layer_norm_epsilon={new.layer_norm_epsilon} does not keep the function; expected "
            f"{eps} (= {config.layer_norm_epsilon} * {config.emb_dim} / {new.emb_dim}); use "
            "widen_config."
        )


def _pad(x, shape):
    """Zero-pads `x` at the end of each axis to `shape` (NumPy in, NumPy out; jax in, jax out)."""
    pads = [(0, n - m) for m, n in zip(x.shape, shape, strict=True)]
    return jnp.pad(x, pads) if isinstance(x, jax.Array) else np.pad(x, pads)


def _widen_leaf(path: tuple[str, ...], x, c: network.T5Config, n: network.T5Config):
    """The widened value of one parameter (see the module docstring)."""
    leaf, parent = path[-1], path[-2] if len(path) > 1 else ""
    d, h, k = c.emb_dim, c.num_heads, c.head_dim
    D, H, K, M = n.emb_dim, n.num_heads, n.head_dim, n.mlp_dim
    if leaf == "embedding":  # [vocab, d]
        return _pad(x, (x.shape[0], D))
    if leaf == "rel_embedding":  # [heads, buckets]
        return _pad(x, (H, x.shape[1]))
    if leaf == "scale":  # [d]
        return _pad(x * np.float32(math.sqrt(d / D)).astype(x.dtype), (D,))
    if parent in ("query", "key", "value"):  # [d, heads * head_dim]
        return _pad(x.reshape(d, h, k), (D, H, K)).reshape(D, H * K)
    if parent == "out":  # [heads * head_dim, d]
        return _pad(x.reshape(h, k, d), (H, K, D)).reshape(H * K, D)
    if parent.startswith("wi"):  # [d, mlp]
        return _pad(x, (D, M))
    if parent == "wo":  # [mlp, d]
        return _pad(x, (M, D))
    if parent == "logits_dense":  # [d, vocab]
        return _pad(x, (D, x.shape[1]))
    raise ValueError(f"widen does not know parameter {'/'.join(path)}.")


def _zero_outputs(tree: dict) -> dict:
    """A copy of a layer's tree whose attention `out` and MLP `wo` kernels are zero."""
    out = {}
    for key, value in tree.items():
        if key in ("out", "wo"):
            zeros = jnp.zeros_like if isinstance(value["kernel"], jax.Array) else np.zeros_like
            out[key] = {"kernel": zeros(value["kernel"])}
        else:
            out[key] = _zero_outputs(value) if isinstance(value, dict) else value
    return out


def widen(
    params: Any, config: network.T5Config, new_config: network.T5Config, dtype: Any = None
) -> Any:
    """Parameters of the `new_config` network computing the same function as `params`.

    Works leaf by leaf (NumPy leaves stay NumPy, jax leaves stay on their device), so a
    paper-scale tree is never held in float32 at once when `dtype` is narrower.

    Args:
      params: parameter tree of a `network.Transformer(config)` (T5X names; `layers_{i}` or, with
        `config.scan_layers`, stacked `layers`). Floating leaves of any dtype.
      config: its config.
      new_config: the larger shape; build it with `widen_config` (vocabulary, activations and ε).
        Its `scan_layers` decides the layout of the result.
      dtype: cast every widened leaf to this dtype (e.g. `jnp.bfloat16`); None keeps each leaf's.

    Returns:
      Parameter tree of `network.Transformer(new_config)`; float32 [..] leaves keep logits equal
      to the original's up to rounding (tested to 1e-5).

    Raises:
      ValueError: a smaller shape, different vocabulary or activations, a tied logits layer, an ε
        that does not keep the function, or an unknown parameter name.
    """
    _check(config, new_config)
    if config.scan_layers:
        params = unstack_layers(params)
    cast = (lambda x: x) if dtype is None else (lambda x: x.astype(dtype))

    def widen_tree(tree, path):
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out[key] = widen_tree(value, (*path, key))
            else:
                out[key] = cast(_widen_leaf((*path, key), value, config, new_config))
        return out

    new = {}
    for stack, value in params.items():
        if stack not in ("encoder", "decoder"):
            new[stack] = widen_tree(value, (stack,))
            continue
        old_layers = getattr(config, f"num_{stack}_layers")
        new_layers = getattr(new_config, f"num_{stack}_layers")
        tree = widen_tree(value, (stack,))
        for i in range(old_layers, new_layers):
            tree[f"layers_{i}"] = _zero_outputs(tree[f"layers_{i % old_layers}"])
        new[stack] = tree
    return stack_layers(new) if new_config.scan_layers else new


def stack_layers(params: Any) -> Any:
    """`layers_{i}` subtrees of each stack -> one `layers` subtree with a leading layer axis (the
    layout of `T5Config(scan_layers=True)`)."""

    def stack(tree):
        names = sorted((k for k in tree if _LAYER.match(k)), key=lambda k: int(k[7:]))
        if not names:
            return tree
        rest = {k: v for k, v in tree.items() if k not in names}
        layers = [tree[k] for k in names]
        xp = jnp if isinstance(jax.tree_util.tree_leaves(layers[0])[0], jax.Array) else np
        return {**rest, "layers": jax.tree_util.tree_map(lambda *x: xp.stack(x), *layers)}

    return {k: stack(v) if k in ("encoder", "decoder") else v for k, v in params.items()}


def unstack_layers(params: Any) -> Any:
    """Inverse of `stack_layers`: a stacked `layers` subtree -> `layers_{i}` subtrees."""

    def unstack(tree):
        if "layers" not in tree:
            return tree
        rest = {k: v for k, v in tree.items() if k != "layers"}
        num = jax.tree_util.tree_leaves(tree["layers"])[0].shape[0]
        for i in range(num):
            rest[f"layers_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], tree["layers"])
        return rest

    return {k: unstack(v) if k in ("encoder", "decoder") else v for k, v in params.items()}
