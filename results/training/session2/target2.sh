#!/usr/bin/env bash
cd /work/main
NUM_STEPS=${NUM_STEPS:-2000}
exec .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'/work/train_runs/embedded_ende_target_r2'" \
    --gin.NUM_STEPS=$NUM_STEPS \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=5e-3 \
    --gin.SEED=1 \
    --gin.train.train.init_params=%TARGET_PARAMS \
    --gin.train.train.checkpoint_every=100 \
    --gin.train.train.eval_every=500 \
    --gin.train.train.export_path="'/work/train_runs/export/embedded_ende_target/params.msgpack'"
