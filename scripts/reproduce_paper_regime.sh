#!/usr/bin/env bash
# The paper's regime on CPU: the shipped En→De target widened at load to T5 1.1 shapes (TARGET_SHAPE,
# function-preserving: the embedded pair's α at the paper's target/draft cost ratios), the shipped
# draft, T ∈ {0, 1}, a γ sweep with auto γ. One eval job per (shape, T); one Table-2-shaped table.
#
#   bash scripts/reproduce_paper_regime.sh          # base and large, NUM_EXAMPLES=50 -> runs/paper_regime/
#   SHAPES=small NUM_EXAMPLES=2 GAMMAS="[2]" bash scripts/reproduce_paper_regime.sh   # smoke run
#
# Settings (environment): SHAPES ('small', 'base', 'large'), TEMPERATURES, NUM_EXAMPLES, GAMMA (the
# headline γ), GAMMAS (extra sweep rows), CPU_WEIGHT_DTYPE ('float32' or 'bfloat16' target panels),
# OUT, PYTHON. The large shape holds ~3 GB of float32 weights (~5 GB peak while packing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
SHAPES=${SHAPES:-"base large"}
TEMPERATURES=${TEMPERATURES:-"0 1"}
NUM_EXAMPLES=${NUM_EXAMPLES:-50}
GAMMA=${GAMMA:-5}
GAMMAS=${GAMMAS:-"[1, 2, 3, 5, 7, 'auto']"}
CPU_WEIGHT_DTYPE=${CPU_WEIGHT_DTYPE:-float32}
OUT=${OUT:-runs/paper_regime}
suffix=$([ "$CPU_WEIGHT_DTYPE" = float32 ] && echo "" || echo "_$CPU_WEIGHT_DTYPE")
rows=()
for shape in $SHAPES; do
  for t in $TEMPERATURES; do
    dir="$OUT/ende_${shape}_model_t$t$suffix"
    "$PYTHON" -m specdec_t5x.eval \
      --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
      --gin.TARGET_SHAPE="'$shape'" \
      --gin.DRAFT_NAME="'T5 draft (2.7M); target: T5 1.1 $shape shape'" \
      --gin.CPU_WEIGHT_DTYPE="'$CPU_WEIGHT_DTYPE'" \
      --gin.NUM_EXAMPLES="$NUM_EXAMPLES" \
      --gin.GAMMA="$GAMMA" \
      --gin.GAMMAS="$GAMMAS" \
      --gin.EVAL_OUTPUT_DIR="'$dir'"
    rows+=("$dir")
  done
done
"$PYTHON" scripts/summarize_results.py "${rows[@]}" --out "$OUT/table.md"
