"""Shared tiny fixtures: T5X's `tiny` config and random target/draft pairs."""

import hashlib
import json
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x import network
from specdec_t5x.data import corpora

# The command-line tools keep JAX's compiled programs in ~/.cache (`eval.cli`); tests that run
# them in-process or as subprocesses leave it alone unless asked.
os.environ.setdefault("SPECDEC_COMPILATION_CACHE", "0")
# ... and auto γ's cost-curve cache (`cost_cache`): tests that use it pass a temporary one.
os.environ.setdefault("SPECDEC_COST_CURVE_CACHE", "0")
# With SPECDEC_CPU_CHOICE=auto packing times the kernel against XLA per shape (`cpu_kernel.choice`)
# and caches it in ~/.cache; tests keep the size rule (deterministic, no timing) unless they set
# the choice themselves, whatever the environment says.
os.environ["SPECDEC_CPU_CHOICE"] = "threshold"
os.environ.setdefault("SPECDEC_CPU_CHOICE_CACHE", "0")

TINY = dict(
    emb_dim=8,
    num_heads=4,
    num_encoder_layers=2,
    num_decoder_layers=2,
    head_dim=3,
    mlp_dim=16,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
)


@pytest.fixture
def clean_gin():
    """A gin configuration cleared before and after the test."""
    import gin

    gin.clear_config(clear_constants=True)
    yield
    gin.clear_config(clear_constants=True)


def tiny_config(vocab_size=32, **overrides) -> network.T5Config:
    return network.T5Config(vocab_size=vocab_size, **{**TINY, **overrides})


def machine_fingerprint() -> str:
    """12 hex digits naming what decides XLA:CPU's float32 kernels here: CPU vendor, family, model,
    feature flags (Linux /proc/cpuinfo; `platform.processor()` elsewhere) and the jaxlib version.

    Float32 summation order inside XLA's dot kernels depends on the CPU they are chosen for, so a
    T5X golden is bitwise only on a machine with the same fingerprint (tests/golden/README.md).
    """
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model", "flags") and key not in fields:
                    fields[key] = " ".join(sorted(value.split()))
    except OSError:
        fields["processor"] = platform.processor()
    import jaxlib

    fields["jaxlib"] = jaxlib.__version__
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def init_params(module: network.Transformer, seed: int):
    ones = jnp.ones((1, 4), jnp.int32)
    return module.init(jax.random.PRNGKey(seed), ones, ones, ones, enable_dropout=False)["params"]


def perturbed(params, scale: float, seed: int):
    """params + scale * N(0, 1) noise: a draft that agrees with the target often, not always."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def tiny_spec_pair():
    """(SpeculativeEncoderDecoderModel, target params): a tiny random target on the shipped
    SentencePiece vocabulary and a draft of its weights perturbed by 5 % noise."""
    from specdec_t5x import drafts, models, vocab

    vocabulary = vocab.get_vocabulary()
    module = network.Transformer(tiny_config(vocab_size=vocab.model_vocab_size(vocabulary)))
    params = init_params(module, 3)
    draft = drafts.T5Draft(module, perturbed(params, 0.05, 4))
    return models.SpeculativeEncoderDecoderModel(module, draft, vocabulary, vocabulary), params


def encoder_inputs(batch: int, length: int, lengths, vocab: int = 32, seed: int = 0):
    """int32 [batch, length] random tokens in [3, vocab) with row b padded after lengths[b]."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(3, vocab, (batch, length))
    tokens[np.arange(length)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return jnp.asarray(tokens, jnp.int32)


def recipe_params(module: network.Transformer, enc_len: int, dec_len: int):
    """The golden weights: NumPy default_rng(1234) over the sorted '/'-joined parameter paths."""
    ones_enc, ones_dec = jnp.ones((1, enc_len), jnp.int32), jnp.ones((1, dec_len), jnp.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.PRNGKey(0), ones_enc, ones_dec, ones_dec)["params"]
    )
    flat = {
        "/".join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]
    }
    rng = np.random.default_rng(1234)
    params: dict = {}
    for name in sorted(flat):
        z = rng.standard_normal(flat[name]).astype(np.float32)
        if name.endswith("/scale"):
            value = 1.0 + 0.1 * z
        elif name.endswith("rel_embedding"):
            value = 0.5 * z
        elif name.endswith("embedding"):
            value = z
        else:
            value = z / np.sqrt(flat[name][0])
        *parents, leaf = name.split("/")
        node = params
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = jnp.asarray(value, jnp.float32)
    return params


@pytest.fixture(scope="session")
def tiny_target():
    module = network.Transformer(tiny_config())
    return module, init_params(module, 1)


DDTP_ROWS = [
    {
        "en": "This package contains the documentation.",
        "de": "Dieses Paket enthält die Dokumentation.",
    },
    {"en": "It is fast.", "de": "Es ist schnell."},
    {"en": "Widgets are frobnicated in place.", "de": "Widgets werden vor Ort frobniziert."},
]
SUMMARY_ROWS = [
    {
        "document": "Acme reads text files and counts the words in them. It is fast and small.",
        "synopsis": "word counter",
    },
    {
        "document": "Zed parses zed files. This package contains the library.",
        "synopsis": "zed library",
    },
]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A data directory with both corpora: every split holds the same few rows."""
    provenance = {"package": "acme", "source": "acmetools"}
    for corpus, rows in ((corpora.DDTP, DDTP_ROWS), (corpora.SUMMARIZE, SUMMARY_ROWS)):
        (tmp_path / corpus).mkdir()
        for split in corpora.SPLITS:
            lines = [
                json.dumps({**row, **provenance, "kind": "sentence"}, ensure_ascii=False)
                for row in rows
            ]
            (tmp_path / corpus / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))
    return tmp_path
