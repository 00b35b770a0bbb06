"""In-step A/B: the T5 1.1 small-width decoder (V 8192), one-token step (k = 1), 8 steps per
fori_loop (`verify_cost.make_fn`, 'loop' mode), on the detected path, 9 interleaved rounds.

A: packed as usual; B: packed with every decode projection's raw kernel kept
(SPECDEC_CPU_CHOICE=xla at packing). Traced with SPECDEC_CPU_CHOICE = single / threshold / xla.

  SPECDEC_CPU_CHOICE_CACHE=0 PYTHONPATH=. python results/verify_cost/choice/probe_single_vs_split.py
"""

import collections
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x import models
from benchmarks import verify_cost

s = verify_cost.Settings()
module, params, enc, cache = verify_cost.build("small_v8192", s)
os.environ["SPECDEC_CPU_CHOICE"] = "threshold"
A = models.pack_params(module, params)
os.environ["SPECDEC_CPU_CHOICE"] = "xla"
B = models.pack_params(module, params)
pos = jnp.full((1,), s.position, jnp.int32)
toks = jnp.full((1, 1), 3, jnp.int32)
calls = {}
print("load before", os.getloadavg())
for name, tree, mode in (
    ("A_single", A, "single"),
    ("B_single", B, "single"),
    ("A_thr", A, "threshold"),
    ("B_xla", B, "xla"),
):
    os.environ["SPECDEC_CPU_CHOICE"] = mode
    fn = verify_cost.make_fn(module, "loop", 8)
    txt = jax.jit(fn).lower(tree, enc, cache, toks, pos).as_text()
    print(name, "kernel calls", txt.count("specdec_matmul"), "dots", txt.count("dot_general"))
    f = functools.partial(fn, tree, enc, cache, toks, pos)
    jax.block_until_ready(f())
    calls[name] = f
ts = collections.defaultdict(list)
for r in range(9):
    for n, f in calls.items():
        t = time.perf_counter()
        jax.block_until_ready(f())
        ts[n].append((time.perf_counter() - t) / 8 * 1e3)
for n, t in ts.items():
    print(
        n,
        round(float(np.median(t)), 2),
        "ms per step, range",
        round(min(t), 2),
        "-",
        round(max(t), 2),
    )
print("load after", os.getloadavg())
