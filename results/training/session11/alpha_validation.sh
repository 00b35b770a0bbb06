#!/usr/bin/env bash
# α of a candidate En->De draft of the session-11 shape (4 heads, MLP 768) on DDTP validation by
# the eval job. Args: NAME PARAMS T...   (metrics in /work/alpha_eval/NAME_tT/)
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
name=$1; path=$2; shift 2
for t in "$@"; do
  .venv/bin/python -m specdec_t5x.eval \
    --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
    --gin.draft/network.T5Config.num_heads=4 \
    --gin.draft/network.T5Config.mlp_dim=768 \
    --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
    --gin.DRAFT_PARAMS_PATH="'$path'" \
    --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
  echo "$name t$t rc=$?"
done
