"""A draft decoder over the target's encoder, warm-started from a draft with its own encoder.

`network.TargetEncoderTransformer` drafts skip the draft's encoder pass at decode time (the target
encodes the source anyway) and read the target's richer encoding. Training one from scratch would
throw away a distilled draft, so it starts from one: every part of the draft's decoder is kept,
and only its cross-attention key / value projections, which must now read the target's encoder
width, are re-derived. With a linear map A (target encoder width -> draft encoder width) fitted by
least squares so that `target_encoded @ A ≈ draft_encoded` over real sources, the new projections
are `A @ W_k` and `A @ W_v`: the keys and values the draft's cross-attention sees are then the
best linear prediction of the old ones (T5 projects the encoder output with no bias, so the map
composes exactly). Distillation (`train.train` with the target's encoder frozen) continues from
there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CROSS_ATTENTION = "encoder_decoder_attention"


def fit_encoder_map(
    target_encoded: np.ndarray,
    draft_encoded: np.ndarray,
    weights: np.ndarray,
    ridge: float = 1e-3,
) -> tuple[np.ndarray, float]:
    """Least-squares A with `target_encoded @ A ≈ draft_encoded` over the weighted tokens.

    Args:
      target_encoded: float [batch, enc_len, target_emb] (the target's encoder output).
      draft_encoded: float [batch, enc_len, draft_emb] (the draft's, same tokens).
      weights: float or bool [batch, enc_len]; 0 marks padding (left out of the fit).
      ridge: Tikhonov term, relative to the mean diagonal of XᵀX (numerical safety only).

    Returns:
      (A float32 [target_emb, draft_emb], R² of the fit over the weighted tokens).

    Raises:
      ValueError: shapes disagree, or fewer weighted tokens than target_emb.
    """
    t, d, w = np.asarray(target_encoded), np.asarray(draft_encoded), np.asarray(weights)
    if t.shape[:2] != d.shape[:2] or t.shape[:2] != w.shape or t.ndim != 3 or d.ndim != 3:
        raise ValueError(
            f"fit_encoder_map needs [batch, len, emb] encodings and [batch, len] weights with the "
            f"same batch and length; got {t.shape}, {d.shape}, {w.shape}."
        )
    keep = w.reshape(-1) > 0
    x = t.reshape(-1, t.shape[-1])[keep].astype(np.float64)
    y = d.reshape(-1, d.shape[-1])[keep].astype(np.float64)
    if x.shape[0] < x.shape[1]:
        raise ValueError(
            f"fit_encoder_map needs at least {x.shape[1]} weighted tokens; got {x.shape[0]}."
        )
    gram = x.T @ x
    gram += ridge * np.mean(np.diag(gram)) * np.eye(gram.shape[0])
    a = np.linalg.solve(gram, x.T @ y)
    residual = y - x @ a
    r2 = 1.0 - float(np.sum(residual**2) / np.sum((y - y.mean(0)) ** 2))
    return a.astype(np.float32), r2


def map_cross_attention(draft_params: Any, encoder_map: np.ndarray) -> dict[str, Any]:
    """The draft's own subtrees (`token_embedder`, `decoder`) with every decoder layer's
    cross-attention key and value kernels replaced by `encoder_map @ kernel`.

    Args:
      draft_params: a `network.Transformer` draft's tree (T5X names, unscanned layers
        `decoder/layers_{i}`).
      encoder_map: float32 [target_emb, draft_emb] from `fit_encoder_map`.

    Returns:
      A tree for `network.TargetEncoderTransformer` without the target's encoder
      (`drafts.with_target_encoder` adds it).

    Raises:
      ValueError: no unscanned decoder layers, or a kernel whose input width is not draft_emb.
    """
    decoder = dict(draft_params["decoder"])
    layers = sorted(k for k in decoder if k.startswith("layers_"))
    if not layers:
        raise ValueError(
            f"map_cross_attention needs unscanned decoder layers (layers_0, ...); got "
            f"{sorted(decoder)}."
        )
    a = np.asarray(encoder_map, np.float32)
    for name in layers:
        layer = dict(decoder[name])
        attention = dict(layer[CROSS_ATTENTION])
        for proj in ("key", "value"):
            kernel = np.asarray(attention[proj]["kernel"], np.float32)
            if kernel.shape[0] != a.shape[1]:
                raise ValueError(
                    f"decoder/{name}/{CROSS_ATTENTION}/{proj}/kernel has input width "
                    f"{kernel.shape[0]}; the encoder map gives {a.shape[1]}."
                )
            attention[proj] = {**attention[proj], "kernel": a @ kernel}
        layer[CROSS_ATTENTION] = attention
        decoder[name] = layer
    return {"token_embedder": draft_params["token_embedder"], "decoder": decoder}
