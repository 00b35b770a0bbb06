#!/usr/bin/env bash
# Session 14: the shipped En->De draft re-distilled against the resumed target (ende_tgt13, exported
# at the end of its 2000 steps), with session 9's recipe: target-greedy sequences + on-policy draft
# batches + ground truth, TVD against the target's full next-token distributions.
# Env: NAME STEPS CORE [LR=1e-3] [GEN="(0.0,)": temperatures the generated batches are decoded at] [TARGET=/work/train_runs/export13/ende_tgt13/params.msgpack]
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
exec taskset -c ${CORE:-1} nice -n 5 .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.RUN_DIR="'/work/train_runs/$NAME'" \
      --gin.NUM_STEPS=$STEPS \
      --gin.LEARNING_RATE=${LR:-1e-3} \
      --gin.SEED=14 \
      --gin.TARGET_PARAMS_PATH="'${TARGET:-/work/train_runs/export13/ende_tgt13/params.msgpack}'" \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.25, 'target': 0.5, 'draft': 0.25}" \
      --gin.GEN_TEMPERATURES="${GEN:-(0.0,)}" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export14/$NAME/params.msgpack'"
