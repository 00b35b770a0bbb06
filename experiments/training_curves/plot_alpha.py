"""The teacher-forced α curve of the summarization draft during on-policy TVD training.

  python experiments/training_curves/plot_alpha.py   # -> results/training/embedded_sum_draft/tvd/alpha_tvd7.png
  python experiments/training_curves/plot_alpha.py RUN_FOLDER OUT_PNG   # another run
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path("results/training/embedded_sum_draft/tvd")  # run from the repository root
run, out = (pathlib.Path(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (None, None)
run, out = run or HERE / "sum_tvd7", out or HERE / "alpha_tvd7.png"
rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
rows = [r for r in rows if "alpha" in r]
steps = [r["step"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.5))
for key, label in (("alpha", "on-policy batches (draft samples)"), ("alpha_data", "data batches")):
    ax.plot(steps, [r[key] for r in rows], marker=".", label=label)
ax.set_xlabel("step (batch 24)")
ax.set_ylabel("teacher-forced α = Σ min(p, q)")
ax.set_title("Summarization draft, on-policy TVD from its first distilled draft")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(out, dpi=110)
