#!/usr/bin/env bash
# Session 3: summarization draft, on-policy distillation from the summarization target (step 800),
# initialised from the En->De draft_r2 (same vocabulary).
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c ${CORE:-1} nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/models/embedded_sum_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/summarize.gin \
    --gin_file=gin/runs/distill.gin \
    --gin.RUN_DIR="'/work/train_runs/embedded_sum_draft'" \
    --gin.NUM_STEPS=${NUM_STEPS:-500} \
    --gin.BATCH_SIZE=24 \
    --gin.LEARNING_RATE=5e-3 \
    --gin.SEED=0 \
    --gin.DIVERGENCE="'${DIV:-tvd}'" \
    --gin.TARGET_PARAMS_PATH="'/work/train_runs/export3/embedded_sum_target/params.msgpack'" \
    --gin.DRAFT_PARAMS_PATH="'/work/main/specdec_t5x/assets/models/embedded_ende_draft_r2/params.msgpack'" \
    --gin.train.train.init_params=%DRAFT_PARAMS \
    --gin.train.train.checkpoint_every=50 \
    --gin.train.train.eval_every=0 \
    --gin.train.train.num_eval_decode_examples=64 \
    --gin.train.train.test_data=None \
    --gin.train.train.export_path="'/work/train_runs/export3/embedded_sum_draft/params.msgpack'"
