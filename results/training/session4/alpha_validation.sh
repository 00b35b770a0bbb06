#!/usr/bin/env bash
# α on DDTP validation by the eval job, for candidate En->De drafts.
cd /work/main
export TF_CPP_MIN_LOG_LEVEL=2
for spec in "shipped:1:/work/main/specdec_t5x/assets/models/embedded_ende_draft/params.msgpack" \
            "tvd_1dec:1:/work/train_runs/export4/tvd_1dec/params.msgpack" \
            "tvd_2dec:2:/work/train_runs/export4/tvd_2dec/params.msgpack"; do
  IFS=: read name dec path <<< "$spec"
  for t in 0 1; do
    taskset -c 1 .venv/bin/python -m specdec_t5x.eval \
      --gin_file=gin/experiments/embedded_ende_model_t$t.gin \
      --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.GAMMAS=None \
      --gin.draft/network.T5Config.num_decoder_layers=$dec \
      --gin.DRAFT_PARAMS_PATH="'$path'" \
      --gin.EVAL_OUTPUT_DIR="'/work/alpha_eval/${name}_t$t'" > /work/alpha_eval/${name}_t$t.log 2>&1
    echo "$name t$t rc=$?"
  done
done
