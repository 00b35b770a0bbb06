"""Session 7's curve: teacher-forced α of the summarization draft during on-policy TVD training.

  python results/training/session7/plot_alpha.py   # -> results/training/session7/alpha_tvd7.png
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).parent
rows = [json.loads(line) for line in (HERE / "sum_tvd7" / "metrics.jsonl").open()]
rows = [r for r in rows if "alpha" in r]
steps = [r["step"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.5))
for key, label in (("alpha", "on-policy batches (draft samples)"), ("alpha_data", "data batches")):
    ax.plot(steps, [r[key] for r in rows], marker=".", label=label)
ax.set_xlabel("step (batch 24)")
ax.set_ylabel("teacher-forced α = Σ min(p, q)")
ax.set_title("Summarization draft, on-policy TVD from the session-3 draft")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(HERE / "alpha_tvd7.png", dpi=110)
