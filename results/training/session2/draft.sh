#!/usr/bin/env bash
cd /work/main
exec .venv/bin/python scripts/train.py \
      --gin_file=gin/models/embedded_ende_target.gin \
      --gin_file=gin/models/embedded_ende_draft.gin \
      --gin_file=gin/runs/train.gin \
      --gin_file=gin/runs/distill.gin \
      --gin.RUN_DIR="'/work/train_runs/embedded_ende_draft_distill_fkl'" \
      --gin.NUM_STEPS=${NUM_STEPS:-600} \
      --gin.TARGET_PARAMS_PATH="'/work/train_runs/export/embedded_ende_target/params.msgpack'" \
      --gin.DIVERGENCE="'fkl'" \
      --gin.MIXTURE="{'data': 0.5, 'draft': 0.5}" \
      --gin.train.train.init_params=%DRAFT_PARAMS \
      --gin.train.train.checkpoint_every=100 \
      --gin.train.train.export_path="'/work/train_runs/export/embedded_ende_draft/params.msgpack'"
