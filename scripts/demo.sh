#!/usr/bin/env bash
# The main job on the embedded default: speculative vs baseline decoding of DDTP En→De test
# sentences with the shipped target and T5 draft, at T = 0 (argmax) and T = 1 (sampling).
#
#   bash scripts/demo.sh            # NUM_EXAMPLES=100 OUT=runs/demo (untracked) by default
#
# The committed results/demo/ was made with `OUT=results/demo bash scripts/demo.sh`.
# Sets up .venv if missing, builds the Debian corpus if missing (apt, ~20 s), runs the two eval
# jobs, prints a Table-2-shaped table and where the results went.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_EXAMPLES=${NUM_EXAMPLES:-100}
OUT=${OUT:-runs/demo}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}  # quiet TensorFlow (imported by seqio)
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/python -m specdec_t5x.data.build
for t in 0 1; do
  .venv/bin/python -m specdec_t5x.eval --overwrite \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.NUM_EXAMPLES=$NUM_EXAMPLES \
    --gin.EVAL_OUTPUT_DIR="'$OUT/embedded_ende_model_t$t'"
done
echo
.venv/bin/python scripts/render_tables.py "$OUT/embedded_ende_model_t0" "$OUT/embedded_ende_model_t1" --out "$OUT/table.md"
echo
echo "Results: $OUT/*/metrics.json, predictions.jsonl, speedup.png; table: $OUT/table.md"
