"""The speculative loop's own work per iteration, for two versions of the sampler side by side.

`time_budget.measure_loop_ms` prices the decode loops' work outside the model calls (sampling,
acceptance test and residual, buffer and statistics updates, `while_loop` bookkeeping) with
zero-cost models. This module runs the same measurement for several speculative samplers in one
interleaved timing (`benchmark.time_interleaved`), so that an older version of
`speculative.speculative_sample` (loaded from a git commit by `sampler_at_commit`) and the current
one share the same machine noise; the baseline `decoding.temperature_sample` is timed alongside as
the per-token reference. Used by scripts/loop_work.py (results/loop_work/).
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from specdec_t5x import benchmark, time_budget

# Modules of the speculative sampler's side that `sampler_at_commit` loads from the commit.
_SAMPLER_MODULES = ("sampling", "verification", "speculative")


def sampler_at_commit(commit: str, repo: str | pathlib.Path = ".") -> Callable[..., Any]:
    """`speculative.speculative_sample` as it was at `commit`, with that commit's `sampling` and
    `verification` (loaded from `git show` into private module names; other imports current).

    Args:
      commit: any git revision (e.g. 'main').
      repo: a directory inside the git work tree.

    Returns:
      the old `speculative_sample` (same signature as the current one at that commit).

    Raises:
      subprocess.CalledProcessError: unknown commit or not a git repository.
    """
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="loop_work_"))
    loaded = {}
    for name in _SAMPLER_MODULES:
        source = subprocess.run(
            ["git", "show", f"{commit}:specdec_t5x/{name}.py"],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        path = tmp / f"{name}.py"
        path.write_text(source)
        module_name = f"_loop_work_{name}_{abs(hash(commit))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        for dep, alias in (("sampling", "sampling"), ("verification", "verify")):
            if dep in loaded and hasattr(module, alias):  # rebind to the commit's versions
                setattr(module, alias, loaded[dep])
        loaded[name] = module
    return loaded["speculative"].speculative_sample


def measure_per_iteration_ms(
    samplers: Mapping[str, Callable[..., Any]],
    *,
    batch: int,
    vocab: int,
    max_decode_len: int,
    gamma: int,
    settings: Mapping[str, Any],
    eos_id: int,
    repeats: int = 20,
) -> dict[str, dict[str, float]]:
    """Per-iteration loop work (ms) of each speculative sampler, and the baseline's per token.

    As `time_budget.measure_loop_ms` (zero-cost constant-logits models, every draft accepted, no
    EOS): each sampler decodes `max_decode_len` and `max_decode_len // 2` tokens, and the work per
    iteration is the difference over the difference of iterations (ceil(n / (γ + 1))). All calls
    are timed interleaved; the slope is taken per round (paired), so the spread is over rounds.

    Args:
      samplers: name -> `speculative_sample`-compatible function ('baseline' is reserved).
      batch, vocab, max_decode_len: decode shapes; gamma: γ; settings: {'temperature', 'topk',
        'topp'}; eos_id: EOS id; repeats: timed rounds.

    Returns:
      name -> {'median_ms', 'q25_ms', 'q75_ms'} per speculative iteration (per token for
      'baseline').

    Raises:
      ValueError: a sampler named 'baseline', or max_decode_len < 2 (gamma + 1).
    """
    if "baseline" in samplers:
        raise ValueError("'baseline' names the baseline sampler; rename that speculative sampler.")
    lengths = (max_decode_len, max_decode_len // 2)
    units = {"baseline": lengths}
    units |= {k: tuple(-(-n // (gamma + 1)) for n in lengths) for k in samplers}
    if any(u[0] <= u[1] for u in units.values()):
        raise ValueError(
            f"max_decode_len={max_decode_len} is too short for γ={gamma}: the two decode lengths "
            "must differ in iterations."
        )
    calls = {  # samplers.get('baseline') is None: the baseline
        (name, n): time_budget.zero_cost_decode(
            samplers.get(name),
            gamma,
            max_decode_steps=n,
            settings=settings,
            batch=batch,
            vocab=vocab,
            max_decode_len=max_decode_len,
            eos_id=eos_id,
        )
        for name in units
        for n in lengths
    }
    samples = benchmark.time_interleaved(calls, repeats)
    out = {}
    for name, (u1, u2) in units.items():
        long, short = np.array(samples[(name, lengths[0])]), np.array(samples[(name, lengths[1])])
        slopes = (long - short) / (u1 - u2)
        q25, median, q75 = np.percentile(slopes, [25, 50, 75])
        out[name] = {"median_ms": float(median), "q25_ms": float(q25), "q75_ms": float(q75)}
    return out


def compare(
    samplers: Mapping[str, Callable[..., Any]],
    configs: Sequence[Mapping[str, Any]],
    **shapes: Any,
) -> list[dict[str, Any]]:
    """`measure_per_iteration_ms` for each config ({'temperature', 'gamma', 'batch'}).

    Args:
      samplers: as `measure_per_iteration_ms`.
      configs: each {'temperature': float, 'gamma': int, 'batch': int}.
      shapes: vocab, max_decode_len, eos_id, repeats (passed on).

    Returns:
      one record per config: the config, then name -> timing dict, and 'ratio' = each sampler's
      median over the first sampler's (the first is the reference, e.g. the old code path).
    """
    records = []
    reference = next(iter(samplers))
    for config in configs:
        settings = {"temperature": float(config["temperature"]), "topk": 0, "topp": 0.0}
        ms = measure_per_iteration_ms(
            samplers, batch=config["batch"], gamma=config["gamma"], settings=settings, **shapes
        )
        ratio = {k: ms[k]["median_ms"] / ms[reference]["median_ms"] for k in samplers}
        records.append(dict(config) | {"ms": ms, "ratio_to_" + reference: ratio})
        print(records[-1], flush=True)
    return records


def markdown_table(records: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    """A results table: one row per config; median [q25, q75] ms per iteration of each sampler in
    `names` (first = reference), the last over the first, and the baseline's ms per token."""
    cell = lambda t: f"{t['median_ms']:.3f} [{t['q25_ms']:.3f}, {t['q75_ms']:.3f}]"  # noqa: E731
    head = "| T | γ | batch | " + " | ".join(f"{n}: ms/iteration" for n in names)
    head += f" | {names[-1]} / {names[0]} | baseline: ms/token |\n"
    head += "|" + "---|" * (5 + len(names)) + "\n"
    rows = []
    for r in records:
        ratio = r["ms"][names[-1]]["median_ms"] / r["ms"][names[0]]["median_ms"]
        cells = [cell(r["ms"][n]) for n in names] + [f"{ratio:.2f}", cell(r["ms"]["baseline"])]
        rows.append(
            f"| {r['temperature']:g} | {r['gamma']} | {r['batch']} | " + " | ".join(cells) + " |"
        )
    return head + "\n".join(rows) + "\n"
