"""What a long eval job says while it runs: phases with a heartbeat, and decode progress.

`phase` logs a phase's start, a line every `HEARTBEAT_S` seconds while it runs and its wall time
(kept in `metrics.json` as `provenance.phases_s`); `log_progress` is the decode loop's line with
the examples done and the ETA.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

HEARTBEAT_S = 30.0  # a phase still running logs a line this often


@contextlib.contextmanager
def phase(
    name: str,
    times: dict[str, float] | None = None,
    key: str | None = None,
    heartbeat_s: float | None = None,
) -> Iterator[None]:
    """Logs `name` as it starts, a heartbeat line every `heartbeat_s` seconds (default
    `HEARTBEAT_S`) while it runs ("compile and warm up 3 rows: still running, 61 s") and its wall
    time as it ends; `times[key or name]` gets the seconds. The heartbeat thread stops when the
    phase ends, however it ends (an exception or KeyboardInterrupt included)."""
    interval = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    logger.info("%s ...", name)
    start = time.perf_counter()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            logger.info("%s: still running, %.0f s", name, time.perf_counter() - start)

    thread = threading.Thread(target=beat, name=f"phase heartbeat: {name}", daemon=True)
    thread.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        thread.join()
        seconds = time.perf_counter() - start
        if times is not None:
            times[key or name] = round(seconds, 3)
        if finished:
            logger.info("%s: done in %.1f s", name, seconds)
        else:
            logger.info("%s: stopped after %.1f s", name, seconds)


def log_progress(done, total, examples_done, examples_total, elapsed) -> None:
    """One decode progress line: batches and examples done, elapsed seconds and the ETA."""
    eta = elapsed / done * (total - done)
    logger.info(
        "decoded %d/%d batches (%d%%): %d/%d examples, %.0f s elapsed, ETA %.0f s",
        done, total, 100 * done // total, examples_done, examples_total, elapsed, eta,
    )  # fmt: skip
