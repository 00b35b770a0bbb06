#!/usr/bin/env bash
# Session 3: En->De target resumed from target_r2's export, dropout 0.1, fresh warmup+cosine.
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c 0 nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'/work/train_runs/embedded_ende_target_r3'" \
    --gin.NUM_STEPS=${NUM_STEPS:-4000} \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=3e-3 \
    --gin.SEED=3 \
    --gin.TARGET_PARAMS_PATH="'/work/train_runs/export/embedded_ende_target/params.msgpack'" \
    --gin.train.train.init_params=%TARGET_PARAMS \
    --gin.train.train.dropout=True \
    --gin.target/network.T5Config.dropout_rate=0.1 \
    --gin.train.train.checkpoint_every=100 \
    --gin.train.train.eval_every=500 \
    --gin.train.train.num_eval_decode_examples=128 \
    --gin.train.train.export_path="'/work/train_runs/export3/embedded_ende_target/params.msgpack'"
