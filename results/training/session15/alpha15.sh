#!/usr/bin/env bash
# α (and the eval job's measured speed) of an En->De pair on DDTP validation (first 100 rows,
# batch 1, γ = 5 at T = 0 / 3 at T = 1, auto γ beside it as in the experiment files).
# Args: NAME LAYERS TARGET_PARAMS DRAFT_PARAMS T...   (LAYERS: the target's encoder = decoder layers)
set -euo pipefail
cd "$(dirname "$0")/../../.."
export TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-/work/alpha_eval}
mkdir -p "$OUT"
name=$1; layers=$2; target=$3; draft=$4; shift 4
for t in "$@"; do
  .venv/bin/python -m specdec_t5x.eval \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 \
    --gin.target/network.T5Config.num_encoder_layers=$layers \
    --gin.target/network.T5Config.num_decoder_layers=$layers \
    --gin.TARGET_PARAMS_PATH="'$target'" \
    --gin.DRAFT_PARAMS_PATH="'$draft'" \
    --gin.EVAL_OUTPUT_DIR="'$OUT/${name}_t$t'" > "$OUT/${name}_t$t.log" 2>&1
  .venv/bin/python -c "import json; m = json.load(open('$OUT/${name}_t$t/metrics.json')); a = m['auto']; print('$name t$t', 'alpha_counted', round(m['alpha_counted'], 4), 'c', round(m['c_measured'], 3), 'verify', round(m['verify_cost_ratio'], 2), 'speedup', round(m['speedup'], 3), 'auto', round(a['speedup'], 3), 'baseline_s', round(m['baseline_seconds'], 3))"
done
