#!/usr/bin/env bash
# Session 12: a draft DECODER over the TARGET's encoder (network.TargetEncoderTransformer;
# gin/models/embedded_ende_draft_te.gin), warm-started from the shipped draft by
# scripts/init_target_encoder_draft.py (its cross-attention K/V mapped through a least-squares map
# from the target's encoder width) and distilled with session 9's recipe (target-greedy sequences
# + on-policy draft batches + ground truth, TVD), the target's encoder frozen.
# Env: NAME STEPS CORE [LR=2e-3]
set -euo pipefail
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
init=/work/train_runs/init/${NAME}_init.msgpack
if [ ! -f "$init" ]; then
  .venv/bin/python scripts/init_target_encoder_draft.py --task=ende --out="$init"
fi
exec taskset -c ${CORE:-1} nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft_te.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.DRAFT_PARAMS_PATH="'$init'" \
      --gin.RUN_DIR="'/work/train_runs/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-2e-3} \
      --gin.SEED=12 \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.25, 'target': 0.5, 'draft': 0.25}" \
      --gin.GEN_TEMPERATURES="(0.0,)" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.frozen_params="('encoder_token_embedder', 'encoder')" \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export12/$NAME/params.msgpack'"
