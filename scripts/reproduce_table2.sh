#!/usr/bin/env bash
# Table 2 for the embedded models: walltime speedup of speculative over baseline decoding on the
# DDTP En→De and Debian summarization test splits, T5 draft, T ∈ {0, 1}, with a γ sweep (speedup vs
# γ beside Thm 3.8).
#
#   bash scripts/reproduce_table2.sh        # NUM_EXAMPLES=100, writes results/table2/
#   TEMPERATURES=1 bash scripts/reproduce_table2.sh   # re-runs the T = 1 rows only
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_EXAMPLES=${NUM_EXAMPLES:-100}
OUT=${OUT:-results/table2}
TASKS=${TASKS:-"ende sum"}  # ende: DDTP En→De; sum: Debian long description → synopsis
TEMPERATURES=${TEMPERATURES:-"0 1"}  # rows to (re-)run; the table renders every row in $OUT
rows=()
for task in $TASKS; do
  for t in 0 1; do
    rows+=("$OUT/embedded_${task}_model_t$t")
    [[ " $TEMPERATURES " == *" $t "* ]] || continue
    .venv/bin/python -m specdec_t5x.eval --overwrite \
      --gin_file=gin/experiments/embedded_${task}_model_t$t.gin \
      --gin.NUM_EXAMPLES=$NUM_EXAMPLES \
      --gin.GAMMAS="[1, 2, 3, 5, 7, 'auto']" \
      --gin.EVAL_OUTPUT_DIR="'$OUT/embedded_${task}_model_t$t'"
  done
done
.venv/bin/python scripts/render_tables.py "${rows[@]}" --out "$OUT/table.md"
