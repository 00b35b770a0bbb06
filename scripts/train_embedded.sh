#!/usr/bin/env bash
# Reproduces the embedded En→De models shipped in specdec_t5x/assets/models/ (results/training/).
#
#   scripts/train_embedded.sh [data|target|draft|distill|sum_ngram|sum_target|sum_draft|
#                             correct_target|correct_draft|correct_report|report|all]
#   (default: all = data, target, draft, report; the other stages run only when named)
#
# data:   builds the DDTP corpus (python -m specdec_t5x.data.build) and checks the checksums of
#         the index files, corpus splits and vocabulary the shipped models were trained on.
# target: trains the target (gin/models/embedded_ende_target.gin) from scratch, exports it in
#         bfloat16 to specdec_t5x/assets/models/embedded_ende_target/params.msgpack, then reports
#         validation loss/BLEU and test BLEU of the exported weights.
# draft:  trains the draft (gin/models/embedded_ende_draft.gin) by token-level distillation from
#         the exported target: loss = 0.5 CE(data) + 0.5 KL(p_target || q_draft), same data.
# distill: on-policy distillation of the draft (DistillSpec; gin/runs/distill.gin): starts from the
#         shipped draft, batches half ground truth, half decoded by the current draft (T = 0 and 1,
#         regenerated every 50 steps), loss D(p_target, q_draft) with D = $DIVERGENCE (default fkl);
#         TARGET_PARAMS_PATH (default: the exported target) picks the target's weights.
# sum_ngram / sum_target / sum_draft: the summarization pair (debian_summarize, gin/runs/
#         summarize.gin: 256-token inputs, 32-token targets, ROUGE): unigram/bigram drafts fitted on
#         the training synopses; the target (embedded_sum_target.gin, En→De target's shape) from
#         scratch; the draft (embedded_sum_draft.gin) distilled on-policy from the exported target.
# correct_target: the text-correction target (ddtp_correct_en, gin/runs/correct.gin): the shipped
#         summarization target with its attention and norms fine-tuned (embeddings, logits layer and
#         MLPs frozen); exports the changed leaves only, with base.json naming embedded_sum_target.
# correct_draft: a T5 draft for it: the summarization draft with every layer distilled on-policy
#         from the correction target (embeddings and logits layer frozen; base embedded_sum_draft).
# correct_report: the correction target's record into results/training/ (scores, unchanged inputs).
# report: loss curves, decode-step timings and asset sizes into results/training/.
#
# Runs are resumable: rerunning a stage after a kill continues from its last orbax checkpoint in
# train_runs/. Shipped run: one CPU machine, 2 cores (see results/training/README.md); seeds fixed
# (SEED=0 for data order, init and everything else); wall time depends on the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
RUNS=${RUNS:-train_runs}
STAGE=${1:-all}
TARGET_STEPS=1000
DRAFT_STEPS=1000
MODELS=specdec_t5x/assets/models

if [[ $STAGE == data || $STAGE == all ]]; then
  $PY -m specdec_t5x.data.build
  DATA_DIR=${SPECDEC_DATA_DIR:-$HOME/.cache/specdec_t5x/data}
  # Index files the shipped models were trained on (Debian bookworm main, release 12.15).
  sha256sum --check <<SUMS
adac331fc51f9a00c1b4120b4ac87423be2b1f1615d4f288c7cbc2d5258c0650  $DATA_DIR/index/Translation-de
62f59c3cdca9786e4f7adf9002f9f5729a684adcb4667e58e448dec9b5a46c7f  $DATA_DIR/index/Translation-en
515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f  $DATA_DIR/index/Packages
e1131bdffbbe8b3c402fc55ad7923abffab62940c8f78eb97ca6013b2fc00803  $DATA_DIR/ddtp_ende/train.jsonl
0bf6176f82b5b8a01110a6e44e2de5ce5e08ecb2ac8644fc7d9ae9f334572746  $DATA_DIR/ddtp_ende/validation.jsonl
4c481d7f48dcebb1399cd8fc91897236a9a9055d33f991ac6053d0629534e1a9  $DATA_DIR/ddtp_ende/test.jsonl
6049199b3482263600a0b9d1be17b6c3b039f17a67d01665dbb8d5820808e951  specdec_t5x/assets/vocab/spm_8k.model
SUMS
fi

if [[ $STAGE == target || $STAGE == all ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'$RUNS/embedded_ende_target'" \
    --gin.NUM_STEPS=$TARGET_STEPS \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=1e-2 \
    --gin.SEED=0 \
    --gin.train.train.export_path="'$MODELS/embedded_ende_target/params.msgpack'"
fi

if [[ $STAGE == draft || $STAGE == all ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/models/embedded_ende_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin.RUN_DIR="'$RUNS/embedded_ende_draft'" \
    --gin.NUM_STEPS=$DRAFT_STEPS \
    --gin.BATCH_SIZE=24 \
    --gin.OPTIMIZER="'adafactor'" \
    --gin.LEARNING_RATE=1e-2 \
    --gin.SEED=0 \
    --gin.train.train.model=%DRAFT_MODEL \
    --gin.train.train.distill_from=%MODEL \
    --gin.train.train.distill_params=%TARGET_PARAMS \
    --gin.train.train.distill_weight=0.5 \
    --gin.train.train.export_path="'$MODELS/embedded_ende_draft/params.msgpack'"
fi

if [[ $STAGE == distill ]]; then
  DIVERGENCE=${DIVERGENCE:-fkl}
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_ende_target.gin \
    --gin_file=gin/models/embedded_ende_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/distill.gin \
    --gin.RUN_DIR="'$RUNS/embedded_ende_draft_distill_$DIVERGENCE'" \
    --gin.NUM_STEPS=${DISTILL_STEPS:-1000} \
    --gin.TARGET_PARAMS_PATH="'${TARGET_PARAMS_PATH:-$MODELS/embedded_ende_target/params.msgpack}'" \
    --gin.DIVERGENCE="'$DIVERGENCE'" \
    --gin.MIXTURE="{'data': 0.5, 'draft': 0.5}" \
    --gin.train.train.init_params=%DRAFT_PARAMS \
    --gin.train.train.export_path="'$RUNS/export/embedded_ende_draft_distill_$DIVERGENCE/params.msgpack'"
fi

if [[ $STAGE == sum_ngram ]]; then
  $PY scripts/fit_ngram_drafts.py --task debian_summarize --target_len 32 --out $MODELS/ngram_sum
fi

if [[ $STAGE == sum_target ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/summarize.gin \
    --gin.RUN_DIR="'$RUNS/embedded_sum_target'" \
    --gin.NUM_STEPS=${SUM_TARGET_STEPS:-2000} \
    --gin.BATCH_SIZE=24 \
    --gin.SEED=0 \
    --gin.train.train.export_path="'$MODELS/embedded_sum_target/params.msgpack'"
fi

if [[ $STAGE == sum_draft ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/models/embedded_sum_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/summarize.gin \
    --gin_file=gin/runs/distill.gin \
    --gin.RUN_DIR="'$RUNS/embedded_sum_draft'" \
    --gin.NUM_STEPS=${SUM_DRAFT_STEPS:-2000} \
    --gin.BATCH_SIZE=24 \
    --gin.SEED=0 \
    --gin.DIVERGENCE="'${DIVERGENCE:-fkl}'" \
    --gin.train.train.export_path="'$MODELS/embedded_sum_draft/params.msgpack'"
fi

if [[ $STAGE == correct_target ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_sum_target.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/correct.gin \
    --gin.RUN_DIR="'$RUNS/embedded_correct_target'" \
    --gin.NUM_STEPS=${CORRECT_TARGET_STEPS:-3000} \
    --gin.BATCH_SIZE=24 \
    --gin.SEED=0 \
    --gin.train.train.export_path="'$MODELS/embedded_correct_target/params.msgpack'"
fi

if [[ $STAGE == correct_draft ]]; then
  $PY scripts/train.py \
    --gin_file=gin/models/embedded_correct_target.gin \
    --gin_file=gin/models/embedded_correct_draft.gin \
    --gin_file=gin/runs/train.gin \
    --gin_file=gin/runs/correct.gin \
    --gin_file=gin/runs/distill.gin \
    --gin.RUN_DIR="'$RUNS/embedded_correct_draft'" \
    --gin.NUM_STEPS=${CORRECT_DRAFT_STEPS:-600} \
    --gin.BATCH_SIZE=24 \
    --gin.SEED=0 \
    --gin.FROZEN="('token_embedder', 'decoder/logits_dense')" \
    --gin.train.train.init_params='@draft_base/embedded.load_params()' \
    --gin.draft_base/embedded.load_params.name="'embedded_sum_draft'" \
    --gin.train.train.export_base="'embedded_sum_draft'" \
    --gin.train.train.export_path="'$MODELS/embedded_correct_draft/params.msgpack'"
fi

if [[ $STAGE == correct_report ]]; then
  # The correction target's training record: curves, final scores, and how often it leaves an
  # input unchanged against how often the reference changes it (validation.correction_report).
  OUT=results/training
  name=embedded_correct_target
  for f in final_metrics.json metrics.jsonl operative_config.gin command.txt environment.json; do
    cp $RUNS/$name/$f $OUT/${name}_$f
  done
  head -n 10 $RUNS/$name/test_predictions.jsonl > $OUT/${name}_test_predictions_first10.jsonl
  $PY -m specdec_t5x.training.validation correction_report $RUNS/$name/test_predictions.jsonl \
    > $OUT/${name}_correction_report.json
  cat $OUT/${name}_correction_report.json
fi

if [[ $STAGE == report || $STAGE == all ]]; then
  OUT=results/training
  mkdir -p $OUT
  for name in embedded_ende_target embedded_ende_draft; do
    cp $RUNS/$name/final_metrics.json $OUT/${name}_final_metrics.json
    cp $RUNS/$name/metrics.jsonl $OUT/${name}_metrics.jsonl
    cp $RUNS/$name/operative_config.gin $OUT/${name}_operative_config.gin
    cp $RUNS/$name/command.txt $OUT/${name}_command.txt
    cp $RUNS/$name/environment.json $OUT/${name}_environment.json
    head -n 10 $RUNS/$name/test_predictions.jsonl > $OUT/${name}_test_predictions_first10.jsonl
  done
  $PY -c "from specdec_t5x.training import validation; validation.plot_curves({
    'target': '$RUNS/embedded_ende_target', 'draft': '$RUNS/embedded_ende_draft'},
    '$OUT/loss_curves.png')"
  # Cost of one cached decoder step (1 token, batch 1, 64-token source), target vs draft, timed
  # by the project's benchmark (interleaved rounds, medians; c = draft / target).
  $PY - <<'PYEOF' | tee $OUT/decode_step.json
import json
from specdec_t5x import gin_utils
from benchmarks import random_pair
gin_utils.parse(
    ["models/embedded_ende_target.gin", "models/embedded_ende_draft.gin"],
    ["VOCABULARY = None", "gin_utils.build.obj = (%TARGET_MODULE, %DRAFT_MODULE)"])
target, draft = gin_utils.build()
costs = random_pair.measure_step_costs(target.config, draft.config, batch=1, enc_len=64, max_len=128)
print(json.dumps(costs, indent=2, default=str))
PYEOF
  du -b specdec_t5x/assets/models/*/params.msgpack specdec_t5x/assets/vocab/spm_8k.model \
    | tee $OUT/asset_bytes.txt
  du -sh specdec_t5x/assets | tee -a $OUT/asset_bytes.txt
  { nproc; lscpu; } > $OUT/hardware.txt
  sha256sum specdec_t5x/assets/models/*/params.msgpack specdec_t5x/assets/vocab/spm_8k.model \
    > $OUT/asset_sha256.txt
fi
