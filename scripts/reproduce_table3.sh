#!/usr/bin/env bash
# Table 3 for the embedded targets: α per draft (unigram, bigram, T5 draft, source-copy) at
# T ∈ {0, 1} on the DDTP En→De and Debian summarization test splits (speed is reported too).
#
#   bash scripts/reproduce_table3.sh        # NUM_EXAMPLES=100, writes results/table3/
#   TEMPERATURES=1 bash scripts/reproduce_table3.sh   # re-runs the T = 1 rows only
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_EXAMPLES=${NUM_EXAMPLES:-100}
OUT=${OUT:-results/table3}
TASKS=${TASKS:-"ende sum"}  # ende: DDTP En→De; sum: Debian long description → synopsis
TEMPERATURES=${TEMPERATURES:-"0 1"}  # rows to (re-)run; the table renders every row in $OUT
rows=()
for task in $TASKS; do
  for draft in unigram bigram model source_copy; do
    for t in 0 1; do
      rows+=("$OUT/embedded_${task}_${draft}_t$t")
      [[ " $TEMPERATURES " == *" $t "* ]] || continue
      .venv/bin/python -m specdec_t5x.eval --overwrite \
        --gin_file=gin/experiments/embedded_${task}_${draft}_t$t.gin \
        --gin.NUM_EXAMPLES=$NUM_EXAMPLES \
        --gin.EVAL_OUTPUT_DIR="'$OUT/embedded_${task}_${draft}_t$t'"
    done
  done
done
.venv/bin/python scripts/render_tables.py "${rows[@]}" --out "$OUT/table.md"
