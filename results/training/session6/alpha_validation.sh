#!/usr/bin/env bash
# α on the Debian summarization validation split by the eval job: shipped summarization draft vs the
# session-6 on-policy TVD continuation (exported from its latest checkpoint).
# Env: NAME (run folder under /work/train_runs, default sum_tvd6; session 7 used sum_tvd7).
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
NAME=${NAME:-sum_tvd6}
mkdir -p /work/alpha_eval
for spec in "sum_shipped:/work/train_runs/init/sum_draft_session3.msgpack" \
            "$NAME:/work/train_runs/export6/$NAME/params.msgpack"; do
  IFS=: read name path <<< "$spec"
  for t in 0 1; do
    .venv/bin/python -m specdec_t5x.eval \
      --gin_file=gin/experiments/embedded_sum_model_t$t.gin \
      --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
      --gin.DRAFT_PARAMS_PATH="'$path'" \
      --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
    echo "$name t$t rc=$?"
  done
done
