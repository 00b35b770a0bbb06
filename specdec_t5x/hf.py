"""Hugging Face T5 files ⇄ our (T5X-named) parameter tree and `network.T5Config`.

Files: `model.safetensors` (or a sharded `model.safetensors.index.json`) through
`safetensors.numpy`; `pytorch_model.bin` (or its index) only when torch is importable. The name
mapping and transposes follow HF's `convert_t5x_checkpoint_to_pytorch.py`
(`transformers/models/t5/`): every projection kernel is transposed (T5X `[in, out]`, torch
`[out, in]`), the relative bias table too (`[heads, 32]` vs `[32, heads]`, block 0 only), norms
and the embedding map 1:1.

Logits and output scaling (the transformers 5.x trap: a tied-embedding default). Reading rule:

* output scaling by d_model^-0.5 = `scale_decoder_outputs` if the config has it, else
  `tie_word_embeddings` (HF's default True);
* logits weights = `lm_head.weight` if the file has it, else `shared.weight`.

Writing: v1.1 (`logits_via_embedding=False`) stores `lm_head.weight` and says
`tie_word_embeddings: false` *and* `scale_decoder_outputs: false`, which transformers 4.x and 5.x
both read as "unscaled, separate head" (5.x reports `tie_word_embeddings: true` after loading but
keeps a stored head that differs from `shared.weight`; `load_torch_model` checks it did).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors import numpy as safetensors_numpy

from specdec_t5x import cpu_kernel, network, steps

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_FILE = "pytorch_model.bin"
PYTORCH_INDEX = "pytorch_model.bin.index.json"
CONFIG_FILE = "config.json"

_ATTENTION = {"query": "q", "key": "k", "value": "v", "out": "o"}
# Keys HF files may hold that carry no extra information (tied copies, an unused bias table).
_REDUNDANT = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
)
# Our (activation, ...) tuples <-> HF feed_forward_proj. Flax's nn.gelu is the tanh
# approximation, HF's `gelu_new`; HF's plain 'gelu' (erf) has no counterpart here.
_FEED_FORWARD = {
    ("gelu", "linear"): "gated-gelu",
    ("relu", "linear"): "gated-relu",
    ("silu", "linear"): "gated-silu",
    ("relu",): "relu",
    ("gelu",): "gelu_new",
    ("silu",): "silu",
}

Name = tuple[str, ...]


def name_map(config: network.T5Config) -> list[tuple[Name, str, bool]]:
    """(our parameter path, HF key, transpose?) for every parameter but the logits layer."""
    mlp = ["wi"] if len(config.mlp_activations) == 1 else ["wi_0", "wi_1"]
    entries: list[tuple[Name, str, bool]] = [
        (("token_embedder", "embedding"), "shared.weight", False),
        (("encoder", "encoder_norm", "scale"), "encoder.final_layer_norm.weight", False),
        (("decoder", "decoder_norm", "scale"), "decoder.final_layer_norm.weight", False),
    ]
    for stack in ("encoder", "decoder"):
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        entries.append(((stack, "relpos_bias", "rel_embedding"), bias, True))
    for i in range(config.num_encoder_layers):
        ours, hf = ("encoder", f"layers_{i}"), f"encoder.block.{i}.layer"
        entries.append(
            (ours + ("pre_attention_layer_norm", "scale"), f"{hf}.0.layer_norm.weight", False)
        )
        for name, short in _ATTENTION.items():
            entries.append(
                (ours + ("attention", name, "kernel"), f"{hf}.0.SelfAttention.{short}.weight", True)
            )
        entries.append((ours + ("pre_mlp_layer_norm", "scale"), f"{hf}.1.layer_norm.weight", False))
        for name in [*mlp, "wo"]:
            entries.append(
                (ours + ("mlp", name, "kernel"), f"{hf}.1.DenseReluDense.{name}.weight", True)
            )
    for i in range(config.num_decoder_layers):
        ours, hf = ("decoder", f"layers_{i}"), f"decoder.block.{i}.layer"
        norms = (
            "pre_self_attention_layer_norm",
            "pre_cross_attention_layer_norm",
            "pre_mlp_layer_norm",
        )
        for j, norm in enumerate(norms):
            entries.append((ours + (norm, "scale"), f"{hf}.{j}.layer_norm.weight", False))
        for name, short in _ATTENTION.items():
            entries.append(
                (
                    ours + ("self_attention", name, "kernel"),
                    f"{hf}.0.SelfAttention.{short}.weight",
                    True,
                )
            )
            entries.append(
                (
                    ours + ("encoder_decoder_attention", name, "kernel"),
                    f"{hf}.1.EncDecAttention.{short}.weight",
                    True,
                )
            )
        for name in [*mlp, "wo"]:
            entries.append(
                (ours + ("mlp", name, "kernel"), f"{hf}.2.DenseReluDense.{name}.weight", True)
            )
    return entries


# ----------------------------------------------------------------------------------------------
# Configs.


def hf_config(config: network.T5Config) -> dict[str, Any]:
    """The HF `config.json` dict of a T5Config (T5 v1.1: gated-GELU, untied unscaled head).

    Raises:
      ValueError: activations HF's T5 cannot express.
    """
    activations = tuple(config.mlp_activations)
    if activations not in _FEED_FORWARD:
        raise ValueError(f"mlp_activations {activations} have no HF feed_forward_proj equivalent.")
    proj = _FEED_FORWARD[activations]
    tied = bool(config.logits_via_embedding)
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.emb_dim,
        "d_kv": config.head_dim,
        "d_ff": config.mlp_dim,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "relative_attention_num_buckets": network.NUM_BUCKETS,
        "relative_attention_max_distance": network.MAX_DISTANCE,
        "dropout_rate": float(config.dropout_rate),
        "layer_norm_epsilon": float(config.layer_norm_epsilon),
        "initializer_factor": 1.0,
        "feed_forward_proj": proj,
        "dense_act_fn": "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1],
        "is_gated_act": proj.startswith("gated-"),
        "is_encoder_decoder": True,
        "tie_word_embeddings": tied,
        "scale_decoder_outputs": tied,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "use_cache": True,
    }


def config_from_hf(hf: Mapping[str, Any], dtype=jnp.float32) -> network.T5Config:
    """The `network.T5Config` of an HF T5 `config.json` dict (logits handled by `import_hf`).

    Raises:
      ValueError: settings our network does not implement (bucket count, distance, activation).
    """
    for key, want in (
        ("relative_attention_num_buckets", network.NUM_BUCKETS),
        ("relative_attention_max_distance", network.MAX_DISTANCE),
    ):
        if int(hf.get(key, want)) != want:
            raise ValueError(f"HF config {key}={hf[key]} unsupported (our T5 uses {want}).")
    by_proj = {v: k for k, v in _FEED_FORWARD.items()}
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in by_proj:
        raise ValueError(f"HF feed_forward_proj={proj!r} unsupported; known: {sorted(by_proj)}.")
    return network.T5Config(
        vocab_size=int(hf["vocab_size"]),
        dtype=dtype,
        emb_dim=int(hf["d_model"]),
        num_heads=int(hf["num_heads"]),
        num_encoder_layers=int(hf["num_layers"]),
        num_decoder_layers=int(hf.get("num_decoder_layers") or hf["num_layers"]),
        head_dim=int(hf["d_kv"]),
        mlp_dim=int(hf["d_ff"]),
        mlp_activations=by_proj[proj],
        dropout_rate=float(hf.get("dropout_rate", 0.1)),
        logits_via_embedding=False,
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-6)),
    )


def scales_decoder_outputs(hf: Mapping[str, Any]) -> bool:
    """HF's output scaling: `scale_decoder_outputs` if present, else `tie_word_embeddings`."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return bool(hf.get("tie_word_embeddings", True))


# ----------------------------------------------------------------------------------------------
# Export.


def _get(tree: Mapping[str, Any], path: Name) -> Any:
    node = tree
    for key in path:
        node = node[key]
    return node


def export_hf(
    params: Mapping[str, Any],
    config: network.T5Config,
    out_dir: str | os.PathLike,
    *,
    dtype=None,
    file_format: str = "safetensors",
) -> pathlib.Path:
    """Writes `params` as an HF T5 model folder: weights plus `config.json`.

    Args:
      params: our parameter tree (T5X names) of `config`; a decode-ready tree from
        `steps.pack_params` is written in the T5X layout (`steps.unpack_params`).
      config: its `network.T5Config`.
      out_dir: folder to write (created).
      dtype: weights dtype on disk (None: as given, float32 for our params).
      file_format: `'safetensors'` (`model.safetensors`) or `'pytorch'` (`pytorch_model.bin`,
        needs torch).

    Returns:
      `out_dir` as a Path.

    Raises:
      ValueError: unknown format, activations HF cannot express, or a tree with an output
        shortlist (`drafts.shortlist_params`).
      ImportError: `'pytorch'` without torch.
    """
    if file_format not in ("safetensors", "pytorch"):
        raise ValueError(f"file_format must be 'safetensors' or 'pytorch'; got {file_format!r}.")
    params = steps.unpack_params(network.Transformer(config), params)
    if cpu_kernel.SHORTLIST_INDEX_NAME in params.get("decoder", {}).get("logits_dense", {}):
        raise ValueError(
            "export_hf needs the full logits layer; this tree has an output shortlist "
            "(drafts.shortlist_params). Export the draft's parameters before shortlisting (gin: "
            "DRAFT_SHORTLIST = None)."
        )
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = name_map(config)
    if not config.logits_via_embedding:
        entries.append((("decoder", "logits_dense", "kernel"), "lm_head.weight", True))
    tensors = {}
    for path, key, transpose in entries:
        array = np.asarray(_get(params, path))
        array = array.T if transpose else array
        tensors[key] = np.ascontiguousarray(array if dtype is None else array.astype(dtype))
    if file_format == "safetensors":
        safetensors_numpy.save_file(tensors, str(out / SAFETENSORS_FILE), metadata={"format": "pt"})
    else:
        import torch  # optional dependency (the [hf] extra)

        def to_torch(array):
            if array.dtype == jnp.bfloat16:  # numpy has no bfloat16: move the bits
                return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
            return torch.from_numpy(array.copy())

        torch.save({k: to_torch(v) for k, v in tensors.items()}, out / PYTORCH_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(config), indent=2) + "\n")
    generation = {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------------------------
# Import.


def _read_tensors(folder: pathlib.Path) -> dict[str, np.ndarray]:
    """All tensors of an HF folder (safetensors preferred; `.bin` only with torch)."""
    if (folder / SAFETENSORS_FILE).is_file():
        return safetensors_numpy.load_file(str(folder / SAFETENSORS_FILE))
    if (folder / SAFETENSORS_INDEX).is_file():
        shards = sorted(
            set(json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"].values())
        )
        tensors = {}
        for shard in shards:
            tensors.update(safetensors_numpy.load_file(str(folder / shard)))
        return tensors
    bins = [PYTORCH_FILE] if (folder / PYTORCH_FILE).is_file() else []
    if not bins and (folder / PYTORCH_INDEX).is_file():
        bins = sorted(set(json.loads((folder / PYTORCH_INDEX).read_text())["weight_map"].values()))
    if not bins:
        raise FileNotFoundError(
            f"no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}, {PYTORCH_FILE} or {PYTORCH_INDEX} in {folder}."
        )
    try:
        import torch  # optional dependency (the [hf] extra)
    except ImportError as err:
        raise ImportError(f"{folder} holds only {bins[0]}; reading it needs torch.") from err
    tensors = {}
    for name in bins:
        state = torch.load(folder / name, map_location="cpu", weights_only=True)
        tensors.update(
            {
                k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
                for k, v in state.items()
            }
        )
    return tensors


def import_hf(
    path: str | os.PathLike, dtype=np.float32, activation_dtype=jnp.float32
) -> tuple[dict[str, Any], network.T5Config]:
    """Reads an HF T5 folder into our parameter tree and `network.T5Config`.

    Args:
      path: folder with `config.json` and safetensors (or `pytorch_model.bin`) weights.
      dtype: numpy dtype of the returned parameters (None: as stored).
      activation_dtype: `T5Config.dtype` of the returned config.

    Returns:
      (params: nested dict of np.ndarray with T5X names, config). Scaled output with a separate
      head different from `shared.weight` has no T5X form; its scale is folded into
      `logits_dense` (the only case that is not bit-exact).

    Raises:
      FileNotFoundError: no config or weights.
      ValueError: missing or unexpected tensors, wrong shapes, unsupported config.
    """
    folder = pathlib.Path(path)
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {str(folder)!r}.")
    hf = json.loads((folder / CONFIG_FILE).read_text())
    config = config_from_hf(hf, activation_dtype)
    tensors = dict(_read_tensors(folder))
    if "shared.weight" not in tensors:  # some files keep only a tied copy
        for copy_key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            if copy_key in tensors:
                tensors["shared.weight"] = tensors[copy_key]
                break
    scale = scales_decoder_outputs(hf)
    head = tensors.pop("lm_head.weight", None)
    if head is None and scale:
        config = network.T5Config(**{**_fields(config), "logits_via_embedding": True})
    entries = name_map(config)
    missing = [key for _, key, _ in entries if key not in tensors]
    unexpected = sorted(set(tensors) - {key for _, key, _ in entries} - set(_REDUNDANT))
    if missing or unexpected:
        raise ValueError(
            f"HF weights in {folder} do not match config.json: missing {missing}, unexpected {unexpected}."
        )
    flat = {}
    for path_, key, transpose in entries:
        flat[path_] = tensors[key].T if transpose else tensors[key]
    if not config.logits_via_embedding:
        if head is None:  # unscaled output through the shared table
            head = tensors["shared.weight"]
        elif scale:  # scaled output through a separate head: fold the scale in
            head = (np.asarray(head, np.float32) * np.float32(config.emb_dim**-0.5)).astype(
                head.dtype
            )
        flat[("decoder", "logits_dense", "kernel")] = head.T
    from specdec_t5x import checkpoints  # local: only for the expected shapes

    expected = checkpoints.param_shapes(config)
    params: dict[str, Any] = {}
    for path_, array in flat.items():
        want = tuple(_get(expected, path_).shape)
        if array.shape != want:
            raise ValueError(
                f"HF tensor for {'/'.join(path_)} has shape {array.shape} (after transpose); the config implies {want}."
            )
        node = params
        for key in path_[:-1]:
            node = node.setdefault(key, {})
        node[path_[-1]] = np.ascontiguousarray(array if dtype is None else array.astype(dtype))
    return params, config


def _fields(config: network.T5Config) -> dict[str, Any]:
    return {f: getattr(config, f) for f in network.T5Config.__dataclass_fields__}


def load_torch_model(path: str | os.PathLike, torch_dtype: str = "float32"):
    """`T5ForConditionalGeneration.from_pretrained(path)` with its logits head checked.

    Guards the transformers 5.x trap (see the module docstring): if the loaded `lm_head` is not the stored
    `lm_head.weight` (e.g. force-tied to `shared`), it is replaced by the stored one, and
    `config.scale_decoder_outputs` is set by the reading rule. Needs torch and transformers.
    """
    import torch  # optional dependencies (the [hf] extra)
    import transformers

    folder = pathlib.Path(path)
    hf = json.loads((folder / CONFIG_FILE).read_text())
    model = transformers.T5ForConditionalGeneration.from_pretrained(
        str(folder), dtype=getattr(torch, torch_dtype)
    )
    model.config.scale_decoder_outputs = scales_decoder_outputs(hf)
    stored = _read_tensors(folder).get("lm_head.weight")
    if stored is not None:
        stored = torch.from_numpy(np.asarray(stored, np.float32)).to(model.lm_head.weight.dtype)
        if not torch.equal(model.lm_head.weight.detach(), stored):
            head = torch.nn.Linear(stored.shape[1], stored.shape[0], bias=False)
            head.weight = torch.nn.Parameter(stored.clone())
            model.lm_head = head
    return model.eval()
