"""Headline rows as medians of repeated runs: the row sets and the runner of `scripts/repeat_rows.py`.

Round r runs every row once, in an order shuffled with seed r (the VM drifts 10-25 % within an
hour: interleaving spreads the drift over the rows). Each run is `python -m specdec_t5x.eval` into
OUT/<row>/run<r>/; extra `--gin.KEY=VALUE` flags go to every run. Then OUT/table.md: one row per
row, the median speed with its min-max over runs (`tables.median_row`), from what the runs
recorded (`python scripts/render_tables.py` re-renders it).
"""

import json
import os
import pathlib
import random
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
T0, T1 = "gin/experiments/embedded_ende_model_t0.gin", "gin/experiments/embedded_ende_model_t1.gin"
# The tree of k nodes that accepts the most at T = 0 on 200 DDTP En→De validation sentences
# (`tree.optimal_paths`; results/trees/ceiling/ceiling_ende_validation_t0_base.md), k = 4 limited
# to depth 2.
OPTIMAL = {
    4: "((0,), (1,), (0, 0))",
    5: "((0,), (1,), (0, 0), (0, 0, 0))",
    6: "((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0))",
    7: "((0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0))",
    8: "((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0))",
    9: "((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0))",
}
# auto_check's rows: auto alone, auto with its sweep of fixed γ 1..6, the fixed sweep, γ = 2 alone.
AUTO_CHECK = {
    "auto": ["--gin.GAMMA='auto'", "--gin.GAMMAS=[]"],
    "auto_sweep": ["--gin.GAMMA='auto'", "--gin.GAMMAS=None"],
    "fixed": ["--gin.GAMMA=2", "--gin.GAMMAS=[1, 3, 5]"],
    "best_fixed": ["--gin.GAMMA=2", "--gin.GAMMAS=None"],
}
ROW_SETS = {
    "demo": {"embedded_t0": [T0], "embedded_t1": [T1]},
    "auto_check": {  # auto γ beside the baseline, and fixed γ, each set in runs of its own
        f"{name}_embedded_t{t}": [T0 if t == 0 else T1, *flags]
        for name, flags in AUTO_CHECK.items()
        for t in (0, 1)
    },
    "paper_regime": {  # the shipped En→De pair with the target widened at load (TARGET_SHAPE)
        f"ende_{shape}_t{t}": [T0 if t == 0 else T1, f"--gin.TARGET_SHAPE='{shape}'"]
        for shape in ("base", "large", "small")
        for t in (0, 1)
    },
    "trees": {  # token trees beside chains in one run each; the sweep's rows are the table
        **{
            f"trees_embedded_t{t}": [
                T0 if t == 0 else T1,
                "--gin.GAMMA=2",
                "--gin.GAMMAS=[1, 3]",
                "--gin.TREES=[(2, 1), (2, 2), (2, 1, 1), (3, 2, 1), (4, 2, 2, 1)]",
            ]
            for t in (0, 1)
        },
        **{
            f"trees_base_t{t}": [
                T0 if t == 0 else T1,
                "--gin.TARGET_SHAPE='base'",
                "--gin.NUM_EXAMPLES=20",
                "--gin.GAMMA=5",
                "--gin.GAMMAS=[3]",
                "--gin.TREES=[(2, 1, 1), (2, 1, 1, 1), (2, 1, 1, 1, 1), (2, 2, 1), (3, 2, 1)]",
            ]
            for t in (0, 1)
        },
        "trees_sum_embedded_t0": [
            "gin/experiments/embedded_sum_model_t0.gin",
            "--gin.GAMMA=2",
            "--gin.GAMMAS=[1, 3]",
            "--gin.TREES=[(2, 1), (2, 2), (2, 1, 1)]",
        ],
        **{
            f"trees_correct_{shape}_{draft}_t0": [
                f"gin/experiments/embedded_correct_{draft}_t0.gin",
                *([f"--gin.TARGET_SHAPE='{shape}'"] if shape != "embedded" else []),
                "--gin.NUM_EXAMPLES=30",
                "--gin.GAMMA=8",
                "--gin.GAMMAS=[4]",
                "--gin.COPY_BRANCHES=2",
                "--gin.TREES=[(2, 1, 1, 1), (2, 1, 1, 1, 1, 1, 1, 1), (2, 2, 1, 1, 1, 1)]",
            ]
            for shape in ("embedded", "base")
            for draft in ("aligned_copy", "source_copy")
        },
    },
    "optimal_trees": {  # trees chosen by experiments/trees/tree_ceiling.py on the validation split, beside chains
        **{
            f"trees_opt_base_t{t}": [
                T0 if t == 0 else T1,
                "--gin.TARGET_SHAPE='base'",
                "--gin.NUM_EXAMPLES=20",
                "--gin.GAMMA=5",
                "--gin.GAMMAS=[3, 4]",
                f"--gin.TREES=[(2, 1, 1, 1), {', '.join(OPTIMAL[k] for k in (5, 6, 7, 8, 9))}]",
            ]
            for t in (0, 1)
        },
        **{
            f"trees_opt_embedded_t{t}": [
                T0 if t == 0 else T1,
                "--gin.GAMMA=2",
                "--gin.GAMMAS=[1, 3]",
                f"--gin.TREES=[(2, 1), {', '.join(OPTIMAL[k] for k in (4, 5, 6))}]",
            ]
            for t in (0, 1)
        },
    },
    "sum_paper_regime": {  # summarization, target widened: the draft with its own encoder
        f"sum_{shape}_t{t}": [
            f"gin/experiments/embedded_sum_model_own_encoder_t{t}.gin",
            f"--gin.TARGET_SHAPE='{shape}'",
        ]
        for shape in ("base",)
        for t in (0, 1)
    },
    "correction": {  # ddtp_correct_en: copy drafts and the T5 draft, shipped and base shape
        f"correct_{shape}_{draft}_t{t}": [
            f"gin/experiments/embedded_correct_{draft}_t{t}.gin",
            *([f"--gin.TARGET_SHAPE='{shape}'"] if shape != "embedded" else []),
        ]
        for shape in ("embedded", "base")
        for draft in ("aligned_copy", "source_copy", "model")
        for t in (0, 1)
    },
}
# The README's rows on the AVX2 + FMA path (forced with SPECDEC_CPU_ISA, `cpu_kernel.force_isa`'s
# switch for a whole process) beside the detected path, interleaved in the same rounds.
_ISA_ROWS = {
    **ROW_SETS["demo"],
    "ende_base_t0": ROW_SETS["paper_regime"]["ende_base_t0"],
    "correct_base_aligned_copy_t0": ROW_SETS["correction"]["correct_base_aligned_copy_t0"],
}
ROW_SETS["isa_paths"] = {
    **{f"{name}_avx2": flags for name, flags in _ISA_ROWS.items()},
    **{name: _ISA_ROWS[name] for name in ("embedded_t0", "ende_base_t0")},
}
ROW_ENV = {f"{name}_avx2": {"SPECDEC_CPU_ISA": "avx2+fma"} for name in _ISA_ROWS}  # per row
# Rows whose table lists every chain γ of their runs (not only the headline γ).
SWEPT_ROWS = {"fixed_embedded_t0", "fixed_embedded_t1"}
TARGETS = {"embedded": "embedded (13.6M)", "small": "T5 1.1 small shape", "base": "T5 1.1 base shape",
           "large": "T5 1.1 large shape"}  # fmt: skip


def target_label(row: str) -> str:
    """The table's target label of a row name (its shape, or the shipped target)."""
    return next((label for key, label in TARGETS.items() if f"_{key}" in f"_{row}"), "")


def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    """Starts `n` processes that each spin one core for at most `seconds` (a shared machine's load)."""
    spin = (
        f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass"
    )
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def run(
    row_set: str,
    out: str,
    rows: str | None,
    repeats: int,
    gin_flags: list[str],
    busy: int = 0,
    busy_cap_s: float = 3600.0,
) -> None:
    """Runs `rows` (comma-separated names, default all) of `row_set` `repeats` times into `out`.

    `busy` > 0 loads the machine with that many spinning processes during every run (each stops
    after `busy_cap_s` seconds or when the run ends); OUT/busy.json records it.
    """
    bad = [f for f in gin_flags if not f.startswith("--gin.")]
    if bad:
        raise SystemExit(f"unknown arguments {bad}; extra flags must be --gin.KEY=VALUE.")
    chosen = ROW_SETS[row_set]
    if rows:
        unknown = sorted(set(rows.split(",")) - set(chosen))
        if unknown:
            raise SystemExit(f"unknown rows {unknown}; {row_set} has {sorted(chosen)}.")
        chosen = {name: chosen[name] for name in rows.split(",")}
    out = pathlib.Path(out)
    if busy:
        out.mkdir(parents=True, exist_ok=True)
        (out / "busy.json").write_text(json.dumps({"busy_loops": busy, "cap_s": busy_cap_s}) + "\n")
    for r in range(repeats):
        order = list(chosen)
        random.Random(r).shuffle(order)
        for name in order:
            run_dir = out / name / f"run{r}"
            gin_file, *bindings = chosen[name]
            cmd = [
                sys.executable,
                "-m",
                "specdec_t5x.eval",
                "--overwrite",
                f"--gin_file={gin_file}",
            ]
            cmd += [*bindings, *gin_flags, f"--gin.EVAL_OUTPUT_DIR='{run_dir}'"]
            print(f"round {r + 1}/{repeats}: {name}", flush=True)
            spinners = busy_loops(busy, busy_cap_s)
            try:
                env = {**os.environ, **ROW_ENV.get(name, {})}
                subprocess.run(cmd, cwd=ROOT, check=True, env=env)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
    subprocess.run(
        [sys.executable, "scripts/render_tables.py", "--repeated", str(out)], cwd=ROOT, check=True
    )
