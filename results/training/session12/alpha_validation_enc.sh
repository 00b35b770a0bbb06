#!/usr/bin/env bash
# α (and c) of a candidate En->De draft with a 6-layer encoder (session 12's ende_enc12 shape) on
# DDTP validation by the eval job. Args: NAME PARAMS T...   (metrics in /work/alpha_eval/NAME_tT/)
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
name=$1; path=$2; shift 2
mkdir -p /work/alpha_eval
for t in "$@"; do
  .venv/bin/python -m specdec_t5x.eval \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.draft/network.T5Config.num_encoder_layers=6 \
    --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
    --gin.DRAFT_PARAMS_PATH="'$path'" \
    --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
  echo "$name t$t rc=$?"
done
