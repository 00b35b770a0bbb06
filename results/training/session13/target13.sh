#!/usr/bin/env bash
# Session 13: En->De target r4 = the shipped target (r3) resumed for NUM_STEPS more steps,
# dropout 0.1, lower peak LR (fresh warmup + cosine), to approach the validation plateau.
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c 0 nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'/work/train_runs/ende_tgt13'" \
    --gin.NUM_STEPS=${NUM_STEPS:-2000} \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=1.5e-3 \
    --gin.SEED=13 \
    --gin.TARGET_PARAMS_PATH="'specdec_t5x/assets/models/embedded_ende_target/params.msgpack'" \
    --gin.train.train.init_params=%TARGET_PARAMS \
    --gin.train.train.dropout=True \
    --gin.target/network.T5Config.dropout_rate=0.1 \
    --gin.train.train.checkpoint_every=100 \
    --gin.train.train.eval_every=500 \
    --gin.train.train.num_eval_decode_examples=128 \
    --gin.train.train.export_path="'/work/train_runs/export13/ende_tgt13/params.msgpack'"
