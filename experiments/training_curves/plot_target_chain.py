"""Validation CE of the En->De target across its four resumed runs (r1 -> r4), on one step axis.

Run from the repository root: `.venv/bin/python experiments/training_curves/plot_target_chain.py`.
Reads the committed metrics files; writes `results/training/embedded_ende_target/target_chain.png`.
"""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path("results/training")
RUNS = [  # (label, metrics file); each run starts from the previous run's export
    ("r1 (LR 1e-2)", ROOT / "embedded_ende_target_metrics.jsonl"),
    ("r2", ROOT / "embedded_ende_target/r2/target_r2_metrics.jsonl"),
    ("r3 (LR 3e-3, dropout 0.1)", ROOT / "embedded_ende_target/r3/target_r3_metrics.jsonl"),
    ("r4 = ende_tgt13 (LR 1.5e-3)", ROOT / "embedded_ende_target/r4/ende_tgt13/metrics.jsonl"),
]


def main():
    fig, (ax_ce, ax_train) = plt.subplots(1, 2, figsize=(11, 4))
    offset = 0
    for label, path in RUNS:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        val = [r for r in rows if r.get("split") == "validation"]
        train = [r for r in rows if r.get("split") == "train"]
        ax_ce.plot([offset + r["step"] for r in val], [r["loss"] for r in val], "o-", label=label)
        ax_train.plot([offset + r["step"] for r in train], [r["loss"] for r in train], lw=0.8)
        offset += max(r["step"] for r in rows if "step" in r)
    ax_ce.set(xlabel="cumulative steps (batch 24)", ylabel="validation CE (first 1000 rows)")
    ax_ce.legend(fontsize=7)
    ax_train.set(xlabel="cumulative steps (batch 24)", ylabel="training CE (batch mean)")
    fig.suptitle("En->De target: every run resumes the previous run's export")
    fig.tight_layout()
    out = ROOT / "embedded_ende_target/target_chain.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
