"""Timing helpers only the benchmarks use (the package's timers: `specdec_t5x.timing`)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

import jax

from specdec_t5x.timing import clock


def looped_steps(step: Callable[..., Any], steps_per_call: int) -> Callable[..., Any]:
    """`step` run `steps_per_call` times in one jitted `lax.fori_loop`, the cache as loop carry.

    Args:
      step: `(*args, tokens int32 [batch, k], positions int32 [batch], cache) -> (logits float32
        [batch, k, vocab], cache)`.
      steps_per_call: loop length.

    Returns:
      jitted `(args tuple, tokens, positions, cache) -> (float32 [batch] sum of one logit per step,
      which keeps the logits live, cache)`; the cache argument is donated.
    """
    run = clock.loop(step)
    return jax.jit(lambda a, t, p, c: run(a, t, p, c, steps_per_call), donate_argnums=(3,))


@contextlib.contextmanager
def paused(pid_file: str | os.PathLike | None) -> Iterator[None]:
    """SIGSTOPs the process whose id is in `pid_file` (e.g. a background training job) inside the
    block and SIGCONTs it after, whatever happens; does nothing when `pid_file` is None."""
    pid = int(pathlib.Path(pid_file).read_text().strip()) if pid_file else None
    if pid:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
