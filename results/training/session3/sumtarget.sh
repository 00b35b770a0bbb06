#!/usr/bin/env bash
# Session 3: summarization target (Debian long description -> synopsis), En->De target's shape,
# initialised from the En->De target_r2 export (same SentencePiece vocabulary), dropout 0.1.
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c 1 nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/summarize.gin \
    --gin.RUN_DIR="'/work/train_runs/embedded_sum_target'" \
    --gin.NUM_STEPS=${NUM_STEPS:-2000} \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=5e-3 \
    --gin.SEED=0 \
    --gin.TARGET_PARAMS_PATH="'/work/train_runs/export/embedded_ende_target/params.msgpack'" \
    --gin.train.train.init_params=%TARGET_PARAMS \
    --gin.train.train.dropout=True \
    --gin.target/network.T5Config.dropout_rate=0.1 \
    --gin.train.train.checkpoint_every=100 \
    --gin.train.train.eval_every=500 \
    --gin.train.train.num_eval_decode_examples=128 \
    --gin.train.train.export_path="'/work/train_runs/export3/embedded_sum_target/params.msgpack'"
