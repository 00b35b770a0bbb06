"""Training loop for targets and drafts: teacher-forced cross-entropy or token-level distillation.

One function, `train`, configured from outside by gin (`gin/runs/train.gin`); everything else here
is a small piece it is built from and that tests call directly.

* Data: JSONL text pairs (`read_jsonl_pairs`), tokenized once up front with the project vocabulary
  (plain SentencePiece calls, no TensorFlow in the loop), then **packed** T5X-style
  (`pack_rows` / `make_batch`): several examples share a row, told apart by
  `{encoder,decoder}_segment_ids` and restarting `{encoder,decoder}_positions`, so almost no
  compute goes to padding and every step has the same shapes (one compilation).
* Loss: `models.EncoderDecoderModel.loss_fn` (T5X cross-entropy, optional z-loss), or, when a frozen
  teacher is given, `distillation_loss`: (1 - w) CE(data) + w KL(p_target || q_draft) per token on
  the same batch (DistillSpec's forward KL on the data distribution; Zhou et al., 2023). α, the
  acceptance rate of speculative decoding, is 1 - E[TV(p, q)], which this KL bounds (Pinsker).
* State: `TrainState` (step, params, optax state) in an orbax `CheckpointManager` together with the
  data position and the wall time spent, so a killed run resumes where its last checkpoint left
  off and replays the same batches.
* Monitoring: tqdm bar (loss, non-padding input + target tokens/s); `metrics.jsonl` in the run
  folder (training loss every `log_every` steps; validation loss and greedy-decode BLEU every
  `eval_every`); `plot_curves`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm

from specdec_t5x import embedded, metrics, models

Array = jax.Array
Batch = dict[str, np.ndarray]
logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Data.


def read_jsonl_pairs(
    corpus: str,
    split: str,
    input_field: str,
    target_field: str,
    data_dir: str | os.PathLike | None = None,
    max_examples: int | None = None,
) -> list[tuple[str, str]]:
    """Reads `(input, target)` text pairs from `<data_dir>/<corpus>/<split>.jsonl`.

    Args:
      corpus, split: e.g. `'ddtp_ende'`, `'train'` (layout of `specdec_t5x.data.build`).
      input_field, target_field: JSON keys, e.g. `'en'`, `'de'`.
      data_dir: default `$SPECDEC_DATA_DIR` or `~/.cache/specdec_t5x/data`.
      max_examples: keep the first this many rows (file order), or all when None.
    """
    if data_dir is None:
        data_dir = os.environ.get("SPECDEC_DATA_DIR") or "~/.cache/specdec_t5x/data"
    path = pathlib.Path(data_dir).expanduser() / corpus / f"{split}.jsonl"
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            pairs.append((row[input_field], row[target_field]))
            if max_examples is not None and len(pairs) >= max_examples:
                break
    return pairs


def tokenize(
    pairs: Sequence[tuple[str, str]],
    vocabulary,
    input_prefix: str,
    max_input_len: int,
    max_target_len: int,
    drop_long: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids of each pair, EOS appended (T5 convention: no BOS, EOS ends both sides).

    Args:
      pairs: `(input, target)` strings.
      vocabulary: anything with `encode(str) -> list[int]` and `eos_id` (a seqio vocabulary).
      input_prefix: prepended to every input (T5 task prefix, e.g. "translate English to German: ").
      max_input_len, max_target_len: token limits, EOS included.
      drop_long: drop pairs over a limit (training); otherwise truncate them, keeping EOS last.

    Returns:
      `(inputs int32 [n_in], targets int32 [n_tgt])` per kept pair.
    """
    eos = int(vocabulary.eos_id)
    out = []
    for source, target in pairs:
        x = list(vocabulary.encode(input_prefix + source)) + [eos]
        y = list(vocabulary.encode(target)) + [eos]
        if len(x) > max_input_len or len(y) > max_target_len:
            if drop_long:
                continue
            x, y = x[: max_input_len - 1] + [eos], y[: max_target_len - 1] + [eos]
        out.append((np.asarray(x, np.int32), np.asarray(y, np.int32)))
    return out


def pack_rows(
    lengths: np.ndarray, order: Sequence[int], input_len: int, target_len: int, open_rows: int = 8
) -> list[list[int]]:
    """Greedy first-fit packing of examples into rows of `input_len` / `target_len` tokens.

    Examples are taken in `order` and placed into the first of the last `open_rows` rows with room
    on both sides, else into a new row. E.g. lengths (in, tgt) [(3, 2), (4, 4), (2, 3)] with
    input_len = target_len = 6 give rows [[0, 2], [1]].

    Args:
      lengths: int [n, 2] input and target length of each example (each within the row lengths).
      order: example indices in placement order.
      input_len, target_len: row lengths.
      open_rows: how many recent rows stay candidates.

    Returns:
      Rows, each a list of example indices.
    """
    rows: list[list[int]] = []
    room: list[list[int]] = []  # [input room, target room] of each row
    candidates: list[int] = []  # indices of open rows
    for i in order:
        n_in, n_tgt = int(lengths[i, 0]), int(lengths[i, 1])
        for r in candidates:
            if room[r][0] >= n_in and room[r][1] >= n_tgt:
                break
        else:
            r = len(rows)
            rows.append([])
            room.append([input_len, target_len])
            candidates = (candidates + [r])[-open_rows:]
        rows[r].append(int(i))
        room[r][0] -= n_in
        room[r][1] -= n_tgt
    return rows


def make_batch(
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    rows: Sequence[Sequence[int]],
    input_len: int,
    target_len: int,
) -> Batch:
    """T5X packed feature dict for `rows` (from `pack_rows`): int32 [len(rows), len] arrays.

    Segment ids count from 1 within each row (0 = padding); positions restart at 0 in each segment;
    `decoder_input_tokens` are the targets shifted right per segment, starting with 0. A row
    holding examples ([5, 1] -> [7, 8, 1]) and ([6, 1] -> [9, 1]) gives
    `encoder_input_tokens` [5 1 6 1 0 ..], `encoder_segment_ids` [1 1 2 2 0 ..],
    `decoder_target_tokens` [7 8 1 9 1 0 ..], `decoder_input_tokens` [0 7 8 0 9 0 ..],
    `decoder_positions` [0 1 2 0 1 0 ..].
    """
    shape_in, shape_tgt = (len(rows), input_len), (len(rows), target_len)
    b = {
        "encoder_input_tokens": np.zeros(shape_in, np.int32),
        "encoder_segment_ids": np.zeros(shape_in, np.int32),
        "encoder_positions": np.zeros(shape_in, np.int32),
        "decoder_input_tokens": np.zeros(shape_tgt, np.int32),
        "decoder_target_tokens": np.zeros(shape_tgt, np.int32),
        "decoder_segment_ids": np.zeros(shape_tgt, np.int32),
        "decoder_positions": np.zeros(shape_tgt, np.int32),
    }
    for r, row in enumerate(rows):
        p_in = p_tgt = 0
        for segment, i in enumerate(row, start=1):
            x, y = examples[i]
            s_in, s_tgt = slice(p_in, p_in + len(x)), slice(p_tgt, p_tgt + len(y))
            b["encoder_input_tokens"][r, s_in] = x
            b["encoder_segment_ids"][r, s_in] = segment
            b["encoder_positions"][r, s_in] = np.arange(len(x))
            b["decoder_target_tokens"][r, s_tgt] = y
            b["decoder_input_tokens"][r, p_tgt + 1 : p_tgt + len(y)] = y[:-1]
            b["decoder_segment_ids"][r, s_tgt] = segment
            b["decoder_positions"][r, s_tgt] = np.arange(len(y))
            p_in, p_tgt = p_in + len(x), p_tgt + len(y)
    b["decoder_loss_weights"] = (b["decoder_target_tokens"] > 0).astype(np.float32)
    return b


class PackedBatches:
    """Endless, resumable stream of packed training batches (reshuffled and repacked per epoch).

    The order of epoch e is a permutation drawn from `(seed, e)`, so the position `(epoch, index)`
    alone reproduces the stream after a restart.

    Args:
      examples: tokenized pairs (`tokenize`).
      batch_size: rows per batch (a partial last batch of an epoch is dropped).
      input_len, target_len: row lengths.
      seed: shuffling seed.
    """

    def __init__(self, examples, batch_size: int, input_len: int, target_len: int, seed: int):
        self.examples, self.batch_size = examples, batch_size
        self.input_len, self.target_len, self.seed = input_len, target_len, seed
        self.lengths = np.asarray([(len(x), len(y)) for x, y in examples], np.int32)
        self.epoch, self.index = 0, 0
        self._rows: list[list[int]] | None = None

    def _epoch_rows(self) -> list[list[int]]:
        if self._rows is None:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.examples))
            self._rows = pack_rows(self.lengths, order, self.input_len, self.target_len)
            if len(self._rows) < self.batch_size:
                raise ValueError(
                    f"{len(self.examples)} examples pack into {len(self._rows)} rows, fewer than "
                    f"batch_size={self.batch_size}."
                )
        return self._rows

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.index, self._rows = int(state["epoch"]), int(state["index"]), None

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        rows = self._epoch_rows()
        if (self.index + 1) * self.batch_size > len(rows):
            self.epoch, self.index, self._rows = self.epoch + 1, 0, None
            rows = self._epoch_rows()
        batch_rows = rows[self.index * self.batch_size : (self.index + 1) * self.batch_size]
        self.index += 1
        return make_batch(self.examples, batch_rows, self.input_len, self.target_len)


def fixed_batches(examples, batch_size: int, input_len: int, target_len: int) -> list[Batch]:
    """Packed batches of `examples` in file order (validation loss); the last one may be short."""
    lengths = np.asarray([(len(x), len(y)) for x, y in examples], np.int32)
    rows = pack_rows(lengths, range(len(examples)), input_len, target_len)
    return [
        make_batch(examples, rows[i : i + batch_size], input_len, target_len)
        for i in range(0, len(rows), batch_size)
    ]


# ----------------------------------------------------------------------------------------------
# Optimisation.


def make_optimizer(
    name: str = "adamw",
    learning_rate: float = 1e-3,
    warmup_steps: int = 1000,
    num_steps: int = 10_000,
    end_learning_rate_fraction: float = 0.1,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """AdamW (b2 = 0.98) or Adafactor with linear warmup and cosine decay to a fraction of the peak.

    Args:
      name: `'adamw'` or `'adafactor'` (T5X's default family, factored second moments).
      learning_rate: peak learning rate, reached after `warmup_steps`.
      warmup_steps, num_steps: schedule length (`num_steps` should match `train(num_steps=...)`).
      end_learning_rate_fraction: final learning rate / peak.
      weight_decay: decoupled weight decay (AdamW) or Adafactor's `weight_decay_rate`.
      clip_norm: global gradient-norm clip, or None.

    Raises:
      ValueError: unknown `name`.
    """
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        learning_rate,
        warmup_steps,
        max(num_steps, warmup_steps + 1),
        learning_rate * end_learning_rate_fraction,
    )
    if name == "adamw":
        opt = optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=weight_decay)
    elif name == "adafactor":
        opt = optax.adafactor(schedule, weight_decay_rate=weight_decay or None)
    else:
        raise ValueError(f"optimizer name must be 'adamw' or 'adafactor'; got {name!r}.")
    return opt if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), opt)


@flax.struct.dataclass
class TrainState:
    """What a checkpoint holds besides the data position.

    Attributes:
      step: int32 [] optimizer steps taken.
      params: the model's parameter tree.
      opt_state: the optax state.
    """

    step: Array
    params: Any
    opt_state: Any


def distillation_loss(
    model: models.EncoderDecoderModel,
    params,
    target_logits: Array,
    batch: Mapping[str, Array],
    dropout_rng: Array | None,
    distill_weight: float,
) -> tuple[Array, dict[str, Array]]:
    """Token-level distillation: (1 - w) CE(data) + w KL(p || q), averaged over target tokens.

    Args:
      model: the draft being trained (q).
      params: its parameters.
      target_logits: float32 [batch, len, vocab] logits of the frozen target (p) on `batch`.
      batch: packed features with `decoder_target_tokens` and `decoder_loss_weights`.
      dropout_rng: PRNG key enabling dropout, or None.
      distill_weight: w in [0, 1]; 1 is pure distillation.

    Returns:
      (loss float32 [], metrics float32 []: `loss`, `xent`, `kl`, `alpha` (the acceptance rate
      of speculative sampling at temperature 1, sum_x min(p, q), teacher-forced on the data),
      `z_loss`, `num_tokens`, `accuracy`).
    """
    q_logits = model.logits(params, batch, dropout_rng)  # [b, L, V]
    targets = batch["decoder_target_tokens"]
    weights = batch["decoder_loss_weights"]
    q_log_probs = jax.nn.log_softmax(q_logits, axis=-1)
    p_log_probs = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits), axis=-1)
    xent = -jnp.take_along_axis(q_log_probs, targets[..., None], axis=-1)[..., 0]  # [b, L]
    p_probs, q_probs = jnp.exp(p_log_probs), jnp.exp(q_log_probs)
    kl = jnp.sum(p_probs * (p_log_probs - q_log_probs), axis=-1)  # [b, L]
    alpha = jnp.sum(jnp.minimum(p_probs, q_probs), axis=-1)  # [b, L] 1 - TV(p, q), T = 1
    z = model.z_loss * jnp.square(jax.nn.logsumexp(q_logits, axis=-1))
    num_tokens = jnp.maximum(jnp.sum(weights), 1.0)

    def mean(x):
        return jnp.sum(x * weights) / num_tokens

    loss = mean((1.0 - distill_weight) * xent + distill_weight * kl + z)
    correct = (jnp.argmax(q_logits, -1) == targets).astype(jnp.float32)
    return loss, {
        "loss": loss,
        "xent": mean(xent),
        "kl": mean(kl),
        "alpha": jax.lax.stop_gradient(mean(alpha)),
        "z_loss": mean(z),
        "num_tokens": jnp.sum(weights),
        "accuracy": mean(correct),
    }


def make_train_step(
    model: models.EncoderDecoderModel,
    optimizer: optax.GradientTransformation,
    dropout: bool,
    distill_from: models.EncoderDecoderModel | None = None,
    distill_weight: float = 0.5,
) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """Jitted `step(state, batch, rng, distill_params) -> (state, metrics)`; `state` is donated.

    The dropout key of step t is `fold_in(rng, t)`, so a resumed run draws the same masks.
    `distill_params` are the frozen target's parameters (ignored, pass None, without a teacher).
    """

    def step(state: TrainState, batch, rng, distill_params):
        dropout_rng = jax.random.fold_in(rng, state.step) if dropout else None
        if distill_from is None:
            loss_fn = lambda p: model.loss_fn(p, batch, dropout_rng)
        else:
            p_logits = distill_from.logits(distill_params, batch)
            loss_fn = lambda p: distillation_loss(
                model, p, p_logits, batch, dropout_rng, distill_weight
            )
        (_, step_metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step_metrics["grad_norm"] = optax.global_norm(grads)
        return TrainState(state.step + 1, params, opt_state), step_metrics

    return jax.jit(step, donate_argnums=(0,))


# ----------------------------------------------------------------------------------------------
# Evaluation.


def make_eval_loss(model: models.EncoderDecoderModel) -> Callable[..., dict[str, Array]]:
    """Jitted `(params, batch) -> {'loss_sum', 'num_tokens'}` (teacher-forced, no dropout)."""

    def eval_loss(params, batch):
        loss, m = model.loss_fn(params, batch, None)
        return {"loss_sum": loss * m["num_tokens"], "num_tokens": m["num_tokens"]}

    return jax.jit(eval_loss)


def validation_loss(eval_loss, params, batches: Sequence[Batch]) -> float:
    """Token-weighted mean cross-entropy over `batches`."""
    totals = [eval_loss(params, b) for b in batches]
    loss_sum = sum(float(t["loss_sum"]) for t in totals)
    return loss_sum / max(sum(float(t["num_tokens"]) for t in totals), 1.0)


def make_greedy_decode(model: models.EncoderDecoderModel) -> Callable[[Any, Batch], Array]:
    """Jitted `(params, batch) -> int32 [batch, decode_len]` greedy decodes (argmax, no top-k)."""

    def decode(params, batch):
        decoder_params = {"temperature": 0.0, "topk": 0}
        return model.predict_batch_with_aux(params, batch, decoder_params=decoder_params)[0]

    return jax.jit(decode)


def greedy_translations(
    greedy_decode,
    params,
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    vocabulary,
    batch_size: int,
    input_len: int,
    decode_len: int,
) -> list[str]:
    """Greedy decodes of each example's inputs, detokenized (EOS and padding removed).

    Batches have fixed shapes `[batch_size, input_len]` / `[batch_size, decode_len]` (the last one
    padded with empty rows), so one compilation serves every call.
    """
    outputs = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        enc = np.zeros((batch_size, input_len), np.int32)
        for r, (x, _) in enumerate(chunk):
            enc[r, : len(x)] = x[:input_len]
        batch = {
            "encoder_input_tokens": enc,
            "decoder_input_tokens": np.zeros((batch_size, decode_len), np.int32),
        }
        decodes = np.asarray(greedy_decode(params, batch))
        for row in decodes[: len(chunk)]:
            ids = row.tolist()
            ids = ids[: ids.index(vocabulary.eos_id)] if vocabulary.eos_id in ids else ids
            outputs.append(vocabulary.decode([i for i in ids if i > 0]))
    return outputs


def evaluate_bleu(greedy_decode, params, examples, references, vocabulary, **kwargs):
    """`(metrics.bleu(...)['bleu'], predictions)` of greedy decodes; kwargs as above."""
    predictions = greedy_translations(greedy_decode, params, examples, vocabulary, **kwargs)
    return metrics.bleu(list(references), predictions)["bleu"], predictions


# ----------------------------------------------------------------------------------------------
# The loop.


def _append_jsonl(path: pathlib.Path, record: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class _Checkpoints:
    """Orbax checkpoints of a `TrainState` plus the data position and training wall time."""

    def __init__(self, directory: pathlib.Path, keep: int):
        self.manager = ocp.CheckpointManager(
            directory.absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_names=("state", "data"),
        )

    def restore(self, state: TrainState, stream: PackedBatches) -> tuple[TrainState, float]:
        """The latest checkpoint (state shaped like `state`; `stream` repositioned), or as is."""
        step = self.manager.latest_step()
        if step is None:
            return state, 0.0
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(state), data=ocp.args.JsonRestore()
        )
        restored = self.manager.restore(step, args=args)
        stream.restore(restored["data"])
        logger.info("Resumed from step %d (%s)", step, restored["data"])
        return restored["state"], float(restored["data"]["elapsed_s"])

    def save(self, state: TrainState, stream: PackedBatches, elapsed_s: float) -> None:
        data = {**stream.state(), "elapsed_s": elapsed_s}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data))
        self.manager.save(int(state.step), args=args)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def train(
    model: models.EncoderDecoderModel,
    train_data: Sequence[tuple[str, str]],
    eval_data: Sequence[tuple[str, str]],
    *,
    run_dir: str | os.PathLike,
    num_steps: int,
    batch_size: int,
    optimizer: optax.GradientTransformation | None = None,
    vocabulary=None,
    input_prefix: str = "",
    max_input_len: int = 64,
    max_target_len: int = 64,
    seed: int = 0,
    dropout: bool = False,
    checkpoint_every: int = 500,
    keep_checkpoints: int = 2,
    log_every: int = 50,
    eval_every: int = 1000,
    num_eval_loss_examples: int = 1000,
    num_eval_decode_examples: int = 256,
    eval_batch_size: int = 64,
    decode_len: int = 64,
    distill_from: models.EncoderDecoderModel | None = None,
    distill_params: Any = None,
    distill_weight: float = 0.5,
    init_params: Any = None,
    export_path: str | os.PathLike | None = None,
    export_dtype: Any = jnp.bfloat16,
    test_data: Sequence[tuple[str, str]] | None = None,
    num_test_examples: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains `model` and returns its final metrics; resumes from `run_dir/checkpoints` if present.

    Each step packs `batch_size` rows of `max_input_len` / `max_target_len` tokens (pairs longer
    than either are dropped from training). Runs that are already at `num_steps` skip straight to
    the final evaluation, so `train` with `num_steps=0` and `init_params` is an evaluation.

    Args:
      model: the `models.EncoderDecoderModel` to train (its `loss_fn`, `module`, vocabulary).
      train_data, eval_data: `(input, target)` text pairs (`read_jsonl_pairs`).
      run_dir: output folder: `checkpoints/`, `metrics.jsonl`, `final_metrics.json`,
        `test_predictions.jsonl`.
      num_steps: total optimizer steps (including those of a resumed run).
      batch_size: packed rows per step.
      optimizer: optax transformation; default `model.optimizer_def`.
      vocabulary: `encode`/`decode`/`eos_id`; default `model.output_vocabulary`.
      input_prefix: task prefix prepended to every input.
      max_input_len, max_target_len: row lengths in tokens.
      seed: parameter init, data order and dropout.
      dropout: train with the config's dropout rate (else deterministic).
      checkpoint_every, keep_checkpoints: orbax checkpoint period (steps) and retention.
      log_every, eval_every: steps between training-metric lines and evaluations (0: only at end).
      num_eval_loss_examples, num_eval_decode_examples: first validation examples (file order)
        for the loss and for greedy-decode BLEU.
      eval_batch_size, decode_len: greedy-decode batch shape.
      distill_from, distill_params: frozen target model and parameters for token-level KL
        distillation (`distillation_loss`); None trains on the data alone.
      distill_weight: w of the KL term.
      init_params: start from these parameters instead of a random init.
      export_path: write the final parameters here (`embedded.save_params`, `export_dtype`); the
        final evaluation then uses the exported (rounded) parameters.
      test_data: pairs for the final test BLEU (the first `num_test_examples`, None: all).
      progress: show the tqdm bar.

    Returns:
      Final metrics: step, validation loss and BLEU, test BLEU (if `test_data`), wall time.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    vocabulary = vocabulary or model.output_vocabulary
    optimizer = optimizer or model.optimizer_def
    if vocabulary is None or optimizer is None:
        raise ValueError("train needs a vocabulary and an optimizer (arguments or on the model).")
    if distill_from is not None and distill_params is None:
        raise ValueError("distill_from needs distill_params (the frozen target's parameters).")
    tok = functools.partial(
        tokenize,
        vocabulary=vocabulary,
        input_prefix=input_prefix,
        max_input_len=max_input_len,
        max_target_len=max_target_len,
    )
    train_examples = tok(train_data, drop_long=True)
    logger.info("%d/%d training pairs within limits", len(train_examples), len(train_data))
    stream = PackedBatches(train_examples, batch_size, max_input_len, max_target_len, seed)
    eval_examples = tok(eval_data[:num_eval_loss_examples], drop_long=False)
    eval_batches = fixed_batches(eval_examples, eval_batch_size, max_input_len, max_target_len)
    decode_pairs = list(eval_data[:num_eval_decode_examples])
    decode_examples = tok(decode_pairs, drop_long=False)
    decode_kwargs = dict(batch_size=eval_batch_size, input_len=max_input_len, decode_len=decode_len)

    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    if init_params is None:
        shapes = {"encoder_input_tokens": (1, max_input_len), "decoder_input_tokens": (1, 8)}
        init_params = model.get_initial_variables(init_rng, shapes)["params"]
    state = TrainState(jnp.asarray(0, jnp.int32), init_params, optimizer.init(init_params))
    checkpoints = _Checkpoints(run_dir / "checkpoints", keep_checkpoints)
    state, elapsed_s = checkpoints.restore(state, stream)
    train_step = make_train_step(model, optimizer, dropout, distill_from, distill_weight)
    eval_loss = make_eval_loss(model)
    greedy_decode = make_greedy_decode(model)

    def evaluate(params, step: int) -> dict[str, Any]:
        t0 = time.time()
        val_loss = validation_loss(eval_loss, params, eval_batches)
        refs = [t for _, t in decode_pairs]
        bleu, _ = evaluate_bleu(
            greedy_decode, params, decode_examples, refs, vocabulary, **decode_kwargs
        )
        record = {"step": step, "split": "validation", "loss": val_loss, "bleu": bleu}
        record.update(elapsed_s=elapsed_s, eval_s=time.time() - t0)
        _append_jsonl(metrics_path, record)
        logger.info("eval %s", record)
        return record

    step = int(state.step)
    bar = tqdm.tqdm(total=num_steps, initial=step, disable=not progress, dynamic_ncols=True)
    pending, window_tokens, t_window = [], 0, time.time()
    while step < num_steps:
        batch = next(stream)
        window_tokens += int(np.count_nonzero(batch["encoder_input_tokens"]))
        window_tokens += int(np.count_nonzero(batch["decoder_target_tokens"]))
        state, step_metrics = train_step(state, batch, dropout_rng, distill_params)
        pending.append(step_metrics)
        step += 1
        bar.update(1)
        if step % log_every == 0 or step == num_steps:
            host = jax.device_get(pending)  # one host sync per window
            now = time.time()
            elapsed_s += now - t_window
            record = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
            record.update(step=step, split="train", tokens_per_s=window_tokens / (now - t_window))
            record.update(elapsed_s=elapsed_s, epoch=stream.epoch)
            _append_jsonl(metrics_path, record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            pending, window_tokens, t_window = [], 0, now
        if step % checkpoint_every == 0 or step == num_steps:
            checkpoints.save(state, stream, elapsed_s)
        if eval_every and step % eval_every == 0 and step < num_steps:
            evaluate(state.params, step)
            t_window = time.time()  # keep evaluation out of tokens/s
    bar.close()
    checkpoints.close()

    params = state.params
    if export_path is not None:
        embedded.save_params(params, export_path, export_dtype)
        params = embedded.load_params(path=export_path)
    final = {**evaluate(params, step), "num_steps": step, "train_wall_s": elapsed_s}
    if test_data is not None:
        test_pairs = list(test_data[:num_test_examples])
        refs = [t for _, t in test_pairs]
        bleu, predictions = evaluate_bleu(
            greedy_decode,
            params,
            tok(test_pairs, drop_long=False),
            refs,
            vocabulary,
            **decode_kwargs,
        )
        final.update(test_bleu=bleu, num_test_examples=len(test_pairs))
        with open(run_dir / "test_predictions.jsonl", "w", encoding="utf-8") as f:
            for (source, reference), prediction in zip(test_pairs, predictions, strict=True):
                row = {"input": source, "reference": reference, "prediction": prediction}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (run_dir / "final_metrics.json").write_text(json.dumps(final, indent=2) + "\n")
    return final


# ----------------------------------------------------------------------------------------------
# Curves.


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl` (duplicates from a resumed run: last one wins)."""
    by_key = {}
    with open(pathlib.Path(run_dir) / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            by_key[(record["split"], record["step"])] = record
    return sorted(by_key.values(), key=lambda r: r["step"])


def plot_curves(run_dirs: Mapping[str, str | os.PathLike], out_path: str | os.PathLike) -> None:
    """Cross-entropy on the data (left) and validation BLEU (right) of each named run.

    Training lines show the data cross-entropy (`xent` for distillation runs, whose `loss` mixes
    in the KL term), so targets and drafts share one scale; dots are validation cross-entropy.
    """
    import matplotlib  # Lazy: plotting is for reports only.

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run_dir in run_dirs.items():
        records = read_metrics(run_dir)
        tr = [r for r in records if r["split"] == "train"]
        va = [r for r in records if r["split"] == "validation"]
        xent = [r.get("xent", r["loss"]) for r in tr]
        (line,) = ax_loss.plot([r["step"] for r in tr], xent, label=f"{name} (train)")
        color = line.get_color()
        ax_loss.plot(
            [r["step"] for r in va],
            [r["loss"] for r in va],
            "o--",
            color=color,
            label=f"{name} (val)",
        )
        ax_bleu.plot([r["step"] for r in va], [r["bleu"] for r in va], "o-", label=name)
    ax_loss.set(xlabel="step", ylabel="cross-entropy (nats/token)", yscale="log")
    ax_bleu.set(xlabel="step", ylabel="validation BLEU (greedy)")
    for ax in (ax_loss, ax_bleu):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
