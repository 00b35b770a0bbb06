#!/usr/bin/env bash
# alpha of a (target, draft) pair by the eval job on DDTP validation, batch 10, 100 sentences, T=0 and 1.
# Env: TARGET DRAFT OUTNAME CORE [TASK=ende]
cd /work/main
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false"
for t in 0 1; do
taskset -c ${CORE:-0} nice -n 5 .venv/bin/python -m specdec_t5x.eval \
  --gin_file=gin/experiments/embedded_${TASK:-ende}_model_t$t.gin \
  --gin.TARGET_PARAMS_PATH="'$TARGET'" --gin.DRAFT_PARAMS_PATH="'$DRAFT'" \
  --gin.SPLIT="'validation'" --gin.NUM_EXAMPLES=100 --gin.BATCH_SIZE=10 --gin.GAMMA=3 --gin.GAMMAS=None \
  --gin.EVAL_OUTPUT_DIR="'/work/train_runs/alpha3/${OUTNAME}_t$t'"
done
