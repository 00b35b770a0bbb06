#!/usr/bin/env bash
# Session 6: the summarization draft continued by on-policy TVD distillation from the shipped
# summarization target, starting from the shipped summarization draft (session 3).
# Env: NAME (run folder) STEPS CORE [LR=3e-3] [SEED=6]
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c ${CORE:-1} nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/models/embedded_sum_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/summarize.gin \
    --gin_file=gin/runs/distill.gin \
    --gin.RUN_DIR="'/work/train_runs/$NAME'" \
    --gin.NUM_STEPS=$STEPS \
    --gin.BATCH_SIZE=24 \
    --gin.LEARNING_RATE=${LR:-3e-3} \
    --gin.SEED=${SEED:-6} \
    --gin.DIVERGENCE="'tvd'" \
    --gin.MIXTURE="{'data': 0.5, 'draft': 0.5}" \
    --gin.DRAFT_PARAMS_PATH="'/work/train_runs/init/sum_draft_session3.msgpack'" \
    --gin.train.train.init_params=%DRAFT_PARAMS \
    --gin.train.train.checkpoint_every=50 \
    --gin.train.train.eval_every=0 \
    --gin.train.train.num_eval_decode_examples=64 \
    --gin.train.train.test_data=None \
    --gin.train.train.export_path="'/work/train_runs/export6/$NAME/params.msgpack'"
