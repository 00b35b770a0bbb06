#!/usr/bin/env bash
# The main job on the embedded default: speculative vs baseline decoding of DDTP En→De test
# sentences with the shipped target and T5 draft, at T = 0 (argmax) and T = 1 (sampling), and of
# text correction (ddtp_correct_en) with the aligned source-copy draft at T = 0.
#
#   bash scripts/demo.sh            # NUM_EXAMPLES=100 OUT=runs/demo (untracked) by default
#
# PYTHON=/path/to/python uses that interpreter as it is (no .venv, no pip install).
#
# The committed results/demo/ was made with `OUT=results/demo bash scripts/demo.sh`.
# Sets up .venv if missing, builds the Debian corpus if missing (apt and the splits: 448 s measured
# on 2 cores at load ~10; once per machine), runs the eval job on
# the embedded pair at T = 0 and 1, on the pair with the target widened to the T5 1.1 base shape at
# T = 0 and on the correction target with the aligned copy draft, prints one table and where the
# results went. Compiled programs are kept in JAX's persistent compilation cache
# (~/.cache/specdec_t5x/jax_cache; SPECDEC_COMPILATION_CACHE=DIR moves it, =0 turns it off), so a
# second demo loads them instead of compiling.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_EXAMPLES=${NUM_EXAMPLES:-100}
BASE_EXAMPLES=${BASE_EXAMPLES:-20}  # the widened-target row (T5 1.1 base shape) is ~20x slower
OUT=${OUT:-runs/demo}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}  # quiet TensorFlow (imported by seqio)
if [ -n "${PYTHON:-}" ]; then  # an interpreter with the package installed: used as it is
  PY=$PYTHON
else
  if [ ! -x .venv/bin/python ]; then
    python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check -e .
  PY=.venv/bin/python
fi
# The corpus (once per machine): its first missing resource (apt-get, the Debian mirror) stops
# the demo here with one line, `error: ...`.
"$PY" -m specdec_t5x.data.build
for t in 0 1; do
  "$PY" -m specdec_t5x.eval --overwrite \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.NUM_EXAMPLES=$NUM_EXAMPLES \
    --gin.EVAL_OUTPUT_DIR="'$OUT/embedded_ende_model_t$t'"
done
# The paper's regime: the same pair with the target widened at load to the T5 1.1 base shape
# (211M parameters, same function: the same outputs and α; c ~0.01 as in the paper's Table 4).
"$PY" -m specdec_t5x.eval --overwrite \
  --gin_file=gin/experiments/embedded_ende_model_t0.gin \
  --gin.TARGET_SHAPE="'base'" --gin.GAMMA=5 --gin.GAMMAS=None \
  --gin.NUM_EXAMPLES=$BASE_EXAMPLES \
  --gin.EVAL_OUTPUT_DIR="'$OUT/base_shape_ende_model_t0'"
# Where the source is the draft: text correction with the aligned source-copy draft (no model).
"$PY" -m specdec_t5x.eval --overwrite \
  --gin_file=gin/experiments/embedded_correct_aligned_copy_t0.gin --gin.GAMMAS=None \
  --gin.NUM_EXAMPLES=$NUM_EXAMPLES \
  --gin.EVAL_OUTPUT_DIR="'$OUT/embedded_correct_aligned_copy_t0'"
echo
"$PY" scripts/render_tables.py "$OUT/embedded_ende_model_t0" "$OUT/embedded_ende_model_t1" \
  "$OUT/base_shape_ende_model_t0" "$OUT/embedded_correct_aligned_copy_t0" --out "$OUT/table.md"
echo
echo "Results: $OUT/*/metrics.json, predictions.jsonl, speedup.png; table: $OUT/table.md"
