#!/usr/bin/env bash
# Session 12: a deeper draft ENCODER (6 layers instead of 2), grown function-preservingly from
# the shipped draft (scripts/grow_params.py: new layers start as identities). The decoder, d_model
# 128 and the 8192-way logits are kept, so the per-token draft step costs the same: the encoder
# runs once per example. Distilled with session 9's recipe (target-greedy sequences + on-policy
# draft batches + ground truth, TVD, LR 1e-3). Env: NAME STEPS CORE [LR=1e-3]
set -euo pipefail
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
init=/work/train_runs/init/${NAME}_init.msgpack
if [ ! -f "$init" ]; then
  .venv/bin/python scripts/grow_params.py --name=embedded_ende_draft --num_encoder_layers=6 \
    --out="$init"
fi
exec taskset -c ${CORE:-1} nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.draft/network.T5Config.num_encoder_layers=6 \
      --gin.DRAFT_PARAMS_PATH="'$init'" \
      --gin.RUN_DIR="'/work/train_runs/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-1e-3} \
      --gin.SEED=12 \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.25, 'target': 0.5, 'draft': 0.25}" \
      --gin.GEN_TEMPERATURES="(0.0,)" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export12/$NAME/params.msgpack'"
