#!/usr/bin/env bash
# Session 15: the shipped En->De draft re-distilled against the 6+6-layer target of
# grow_target15.sh (session 9's recipe as in session 14's ende_d14b: target-greedy sequences +
# on-policy draft batches + ground truth, TVD, generated batches at T = 0 and 1 in turn).
# Env: NAME STEPS [LR=1e-3] [TARGET=$RUNS/export15/ende_tgt66/params.msgpack] [RUNS=/work/train_runs]
set -euo pipefail
cd "$(dirname "$0")/../../.."
RUNS=${RUNS:-/work/train_runs}
exec nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.RUN_DIR="'$RUNS/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-1e-3} \
      --gin.SEED=15 \
      --gin.TARGET_PARAMS_PATH="'${TARGET:-$RUNS/export15/ende_tgt66/params.msgpack}'" \
      --gin.target/network.T5Config.num_encoder_layers=6 \
      --gin.target/network.T5Config.num_decoder_layers=6 \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.25, 'target': 0.5, 'draft': 0.25}" \
      --gin.GEN_TEMPERATURES="(0.0, 1.0)" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'$RUNS/export15/$NAME/params.msgpack'"
