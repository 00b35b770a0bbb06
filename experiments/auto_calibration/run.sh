#!/usr/bin/env bash
# 3 rounds, each: auto γ alone without calibration, then γ = 2 alone; shipped pair, T = 0, 100 sentences.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/auto_calibration/runs
T0=gin/experiments/embedded_ende_model_t0.gin
for r in 0 1 2; do
  ROUNDS=0 .venv/bin/python experiments/auto_calibration/eval_without_calibration.py --overwrite \
    --gin_file=$T0 "--gin.GAMMA='auto'" "--gin.GAMMAS=[]" "--gin.EVAL_OUTPUT_DIR='$OUT/auto_uncalibrated/run$r'"
  .venv/bin/python -m specdec_t5x.eval --overwrite --gin_file=$T0 --gin.GAMMA=2 --gin.GAMMAS=None \
    "--gin.EVAL_OUTPUT_DIR='$OUT/best_fixed/run$r'"
done
.venv/bin/python scripts/render_tables.py --repeated $OUT
