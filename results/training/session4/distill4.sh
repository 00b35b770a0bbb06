#!/usr/bin/env bash
# Session 4: on-policy TVD distillation of the En->De draft, continued from the shipped draft
# (1 decoder layer) or from it grown to 2 decoder layers (scripts/grow_params.py), against the
# shipped target. Env: NAME STEPS INIT CORE [DEC_LAYERS=1] [LR=3e-3] [SEED=4]
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c ${CORE:-0} nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.draft/network.T5Config.num_decoder_layers=${DEC_LAYERS:-1} \
      --gin.RUN_DIR="'/work/train_runs/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-3e-3} \
      --gin.SEED=${SEED:-4} \
      --gin.DRAFT_PARAMS_PATH="'$INIT'" \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.5, 'draft': 0.5}" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export4/$NAME/params.msgpack'"
