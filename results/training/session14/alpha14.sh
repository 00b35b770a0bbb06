#!/usr/bin/env bash
# α of an En->De draft against a given target on DDTP validation (first 100 rows, batch 1, γ = 5 at
# T = 0 / 3 at T = 1) by the eval job. Args: NAME TARGET_PARAMS DRAFT_PARAMS T...
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p /work/alpha_eval
name=$1; target=$2; draft=$3; shift 3
for t in "$@"; do
  .venv/bin/python -m specdec_t5x.eval \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
    --gin.TARGET_PARAMS_PATH="'$target'" \
    --gin.DRAFT_PARAMS_PATH="'$draft'" \
    --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
  echo "$name t$t rc=$? $(python3 -c "import json;m=json.load(open('/work/alpha_eval/${name}_t$t/metrics.json'));print('alpha_counted',round(m['alpha_counted'],4),'alpha_beta',round(m['alpha_beta'],4) if m.get('alpha_beta') else None,'c',round(m['c_measured'],3))")"
done
