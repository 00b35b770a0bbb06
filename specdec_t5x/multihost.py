"""Multi-host evaluation on JAX's multi-controller runtime (`jax.distributed`).

Every process runs the same program (T5X's model): `initialize` connects it to the others, the eval
job decodes only this process's share of the batches (`local_batches`, batch i -> process
i mod P), and `gather_examples` hands every process all per-example records in global order, so the
metrics are computed from exactly the records a single-process run would have (same examples, same
per-batch PRNG keys `fold_in(key, i)`). With one process every function is a no-op pass-through.

    python -m specdec_t5x.eval --gin_file=... --coordinator_address=host0:1234 \
        --process_count=2 --process_index=0        # and --process_index=1 on the other host

(On TPU pods and SLURM/GPU clusters `jax.distributed.initialize()` finds these by itself: pass
`--multiprocess` alone.) Only process 0 writes the results directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    cpu_collectives: str = "gloo",
) -> None:
    """`jax.distributed.initialize` with cross-process CPU collectives switched on.

    Args:
      coordinator_address: 'host:port' of process 0 (None: auto-detected on TPU/SLURM/...).
      num_processes: number of processes (None: auto-detected).
      process_id: this process's index in [0, num_processes).
      cpu_collectives: CPU collective implementation ('gloo'; jax's
        `jax_cpu_collectives_implementation`); needed for CPU-only multi-process runs and
        harmless on accelerators. Ignored on jax versions without that option.

    Raises:
      ValueError: process_id outside [0, num_processes).
    """
    if num_processes is not None and process_id is not None:
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id={process_id} must be in [0, {num_processes}).")
    try:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    except (AttributeError, KeyError, ValueError):  # option renamed/removed in a later jax
        pass
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )


def local_batches(num_batches: int) -> list[int]:
    """Indices of the batches this process decodes: i with i mod process_count == process_index.

    Raises:
      ValueError: fewer batches than processes (a process would have nothing to gather).
    """
    count, index = jax.process_count(), jax.process_index()
    if num_batches < count:
        raise ValueError(f"{num_batches} batches cannot be shared by {count} processes.")
    return list(range(index, num_batches, count))


def gather_examples(
    columns: Mapping[str, Sequence[Any]], example_ids: Sequence[int], num_examples: int
) -> dict[str, list[Any]]:
    """Per-example records of all processes, in global example order, on every process.

    Args:
      columns: name -> list of this process's records in local order, one per example; a record
        is a pytree of arrays/scalars with the same structure and shapes for every example (e.g.
        seconds float, tokens int32 [max_decode_len], `SpeculativeStats` of one row), or None
        for every example.
      example_ids: global index of each local example (same length as every column).
      num_examples: total examples over all processes.

    Returns:
      name -> list of `num_examples` records (NumPy leaves), example i at position i.

    Raises:
      ValueError: lengths differ, or the gathered ids are not exactly 0..num_examples-1.
    """
    ids = np.asarray(example_ids, np.int32)
    for name, values in columns.items():
        if len(values) != len(ids):
            raise ValueError(f"column {name!r} has {len(values)} records, ids {len(ids)}.")
    if jax.process_count() == 1:
        order = np.argsort(ids)
        if not np.array_equal(ids[order], np.arange(num_examples)):
            raise ValueError(f"example ids {ids.tolist()} are not 0..{num_examples - 1}.")
        return {name: [values[i] for i in order] for name, values in columns.items()}

    from jax.experimental import multihost_utils  # local: only multi-process runs need it

    rows = int(np.max(multihost_utils.process_allgather(np.asarray([len(ids)], np.int32))))
    pad = rows - len(ids)
    stacked = {
        name: None
        if all(v is None for v in values)
        else jax.tree_util.tree_map(
            lambda *xs: np.pad(np.stack(xs), [(0, pad)] + [(0, 0)] * np.ndim(xs[0])), *values
        )
        for name, values in columns.items()
    }
    local = {"ids": np.pad(ids, (0, pad), constant_values=-1), "columns": stacked}
    gathered = multihost_utils.process_allgather(local)  # leaves [processes, rows, ...]
    flat = jax.tree_util.tree_map(lambda x: np.asarray(x).reshape((-1, *x.shape[2:])), gathered)
    all_ids = flat["ids"]
    keep = np.nonzero(all_ids >= 0)[0]
    keep = keep[np.argsort(all_ids[keep])]
    if not np.array_equal(all_ids[keep], np.arange(num_examples)):
        raise ValueError(
            f"gathered example ids {sorted(all_ids[keep].tolist())} != 0..{num_examples - 1}."
        )
    out = {}
    for name, tree in flat["columns"].items():
        if tree is None:
            out[name] = [None] * num_examples
        else:
            out[name] = [jax.tree_util.tree_map(lambda x, i=i: x[i], tree) for i in keep]
    return out


def gather_runs(
    runs: Mapping[Any, Any],
    batch_rows: Sequence[int],
    batch_size: int,
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, list[Any]]:
    """Replaces, in place, each run's per-example lists `seconds`, `tokens`, `stats` (records of
    this process's batches `local_batches(len(batch_rows))`, in order) with those of all
    processes in global example order (the eval job's hook).

    Args:
      runs: name -> object with list attributes `seconds`, `tokens`, `stats`.
      batch_rows: real examples in each batch (the last batch may be padded).
      batch_size: examples per batch; example ids are batch * batch_size + row.
      extra: more per-example columns (same local order) to gather.

    Returns:
      The gathered `extra` columns (name -> list in global order).
    """
    mine = local_batches(len(batch_rows))
    ids = [i * batch_size + r for i in mine for r in range(batch_rows[i])]
    total = int(sum(batch_rows))
    for run in runs.values():
        columns = {"seconds": run.seconds, "tokens": run.tokens, "stats": run.stats}
        gathered = gather_examples(columns, ids, total)
        run.seconds = [float(x) for x in gathered["seconds"]]
        run.tokens, run.stats = gathered["tokens"], gathered["stats"]
    return gather_examples(extra, ids, total) if extra else {}


FLAGS = {"--coordinator_address": str, "--process_count": int, "--process_index": int}


def split_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, Any] | None]:
    """Takes T5X's multi-process flags (`--coordinator_address=HOST:PORT --process_count=N
    --process_index=I`, or `--multiprocess` alone for auto-detection) out of `argv`.

    Returns:
      (the other arguments, `initialize` keyword arguments or None when no such flag was given).
    """
    rest, found = [], {}
    for arg in argv:
        name, _, value = arg.partition("=")
        if name in FLAGS:
            found[name[2:]] = FLAGS[name](value)
        elif arg == "--multiprocess":
            found.setdefault("multiprocess", True)
        else:
            rest.append(arg)
    if not found:
        return rest, None
    found.pop("multiprocess", None)
    return rest, {
        "coordinator_address": found.get("coordinator_address"),
        "num_processes": found.get("process_count"),
        "process_id": found.get("process_index"),
    }
