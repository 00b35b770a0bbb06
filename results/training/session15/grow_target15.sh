#!/usr/bin/env bash
# Session 15: the shipped En->De target (r3, 4+4 layers) grown function-preservingly to 6+6 layers
# (scripts/grow_params.py: the new layers start as identities, so step 0 decodes exactly as r3),
# then trained NUM_STEPS steps (dropout 0.1, Adafactor, fresh warmup + cosine), both cores, nice.
# Checkpoints every 100 steps in $RUNS/ende_tgt66 (outside the repository; re-running resumes).
set -euo pipefail
cd "$(dirname "$0")/../../.."
RUNS=${RUNS:-/work/train_runs}
mkdir -p "$RUNS/grow15"
if [ ! -f "$RUNS/grow15/target66_init.msgpack" ]; then
  .venv/bin/python scripts/grow_params.py --name=embedded_ende_target \
    --num_encoder_layers=6 --num_decoder_layers=6 --out="$RUNS/grow15/target66_init.msgpack"
fi
exec nice -n 5 .venv/bin/python scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'$RUNS/ende_tgt66'" \
    --gin.NUM_STEPS=${NUM_STEPS:-1200} \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=1.5e-3 \
    --gin.SEED=15 \
    --gin.TARGET_PARAMS_PATH="'$RUNS/grow15/target66_init.msgpack'" \
    --gin.target/network.T5Config.num_encoder_layers=6 \
    --gin.target/network.T5Config.num_decoder_layers=6 \
    --gin.train.train.init_params=%TARGET_PARAMS \
    --gin.train.train.dropout=True \
    --gin.target/network.T5Config.dropout_rate=0.1 \
    --gin.train.train.checkpoint_every=100 \
    --gin.train.train.eval_every=400 \
    --gin.train.train.num_eval_decode_examples=128 \
    --gin.train.train.export_path="'$RUNS/export15/ende_tgt66/params.msgpack'"
