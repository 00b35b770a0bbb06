#!/usr/bin/env bash
# α (and c) of a target-encoder draft (gin/models/embedded_{ende,sum}_draft_te.gin) on the
# validation split by the eval job. Args: TASK(ende|sum) NAME PARAMS T...
# (metrics in /work/alpha_eval/NAME_tT/)
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
task=$1; name=$2; path=$3; shift 3
mkdir -p /work/alpha_eval
for t in "$@"; do
  .venv/bin/python -m specdec_t5x.eval \
    --gin_file=gin/experiments/embedded_${task}_model_t$t.gin \
    --gin_file=gin/models/embedded_${task}_draft_te.gin \
    --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
    --gin.DRAFT_PARAMS_PATH="'$path'" \
    --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
  echo "$name t$t rc=$?"
done
