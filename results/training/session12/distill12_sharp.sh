#!/usr/bin/env bash
# Session 12: the shipped En->De draft (session 9's ende_tgt9, step 1450) continued with session
# 9's recipe but TVD against a SHARPENED target, p_tau = softmax(logits_p / tau) (TARGET_TEMPERATURE,
# distill.distillation_loss): as tau -> 0 the loss becomes the draft's miss rate on the target's
# argmax, i.e. 1 - alpha at T = 0. Env: NAME STEPS CORE [LR=1e-3] [TAU=0.3]
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
      --gin.SEED=12 \
      --gin.TARGET_TEMPERATURE=${TAU:-0.3} \
      --gin.DIVERGENCE="'tvd'" \
      --gin.MIXTURE="{'data': 0.25, 'target': 0.5, 'draft': 0.25}" \
      --gin.GEN_TEMPERATURES="(0.0,)" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=50 \
      --gin.train.train.eval_every=0 \
      --gin.train.train.num_eval_decode_examples=64 \
      --gin.train.train.test_data=None \
      --gin.train.train.export_path="'/work/train_runs/export12/$NAME/params.msgpack'"
