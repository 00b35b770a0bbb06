#!/usr/bin/env bash
# Session 3: on-policy distillation of the En->De draft (DistillSpec) from a given target export.
# Env: NAME DIV STEPS TARGET INIT CORE [MIXTURE] [LR]
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c ${CORE:-0} nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.RUN_DIR="'/work/train_runs/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-3e-3} \
      --gin.SEED=3 \
      --gin.TARGET_PARAMS_PATH="'$TARGET'" \
      --gin.DRAFT_PARAMS_PATH="'$INIT'" \
      --gin.DIVERGENCE="'$DIV'" \
      --gin.MIXTURE="${MIXTURE:-{'data': 0.5, 'draft': 0.5}}" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export3/$NAME/params.msgpack'"
