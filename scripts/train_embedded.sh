#!/usr/bin/env bash
# Reproduces the embedded models shipped in specdec_t5x/assets/models/ (results/training/).
#
#   scripts/train_embedded.sh [data|target|draft|distill|sum_ngram|sum_target|sum_draft|
#                             correct_target|correct_draft|correct_report|report|all]
#   (default: all = data, target, draft, report; the other stages run only when named)
# What each stage trains: results/training/README.md ("Stages"). Resumable: a stage rerun after a
# kill continues from its last orbax checkpoint in $RUNS. Seeds fixed (SEED=0 for everything).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
RUNS=${RUNS:-train_runs}
STAGE=${1:-all}
TARGET_STEPS=1000
DRAFT_STEPS=1000
MODELS=specdec_t5x/assets/models
has() { [[ $STAGE == "$1" || ($STAGE == all && ${2:-} == all) ]]; }
# train NAME STEPS GIN... [-- FLAG...]: scripts/train.py with gin/GIN files into $RUNS/NAME.
train() {
  local name=$1 steps=$2 args=() && shift 2
  while [[ $# -gt 0 && $1 != -- ]]; do args+=("--gin_file=gin/$1"); shift; done
  [[ $# -gt 0 ]] && shift
  $PY scripts/train.py "${args[@]}" --gin.RUN_DIR="'$RUNS/$name'" --gin.NUM_STEPS="$steps" "$@"
}
export_to() { echo "--gin.train.train.export_path='$1/params.msgpack'"; }
FIXED=(--gin.BATCH_SIZE=24 --gin.SEED=0)
ADAFACTOR=(--gin.OPTIMIZER="'adafactor'" --gin.LEARNING_RATE=1e-2)

if has data all; then
  $PY -m specdec_t5x.data.build
  # Index files and corpus splits the shipped models were trained on (Debian bookworm main, 12.15).
  (cd "${SPECDEC_DATA_DIR:-$HOME/.cache/specdec_t5x/data}" &&
    sha256sum --check "$OLDPWD/results/training/data_sha256.txt")
  echo "6049199b3482263600a0b9d1be17b6c3b039f17a67d01665dbb8d5820808e951  specdec_t5x/assets/vocab/spm_8k.model" |
    sha256sum --check
fi
has target all && train embedded_ende_target $TARGET_STEPS models/embedded_ende_target.gin runs/train.gin -- \
  "${FIXED[@]}" "${ADAFACTOR[@]}" "$(export_to $MODELS/embedded_ende_target)"
has draft all && train embedded_ende_draft $DRAFT_STEPS models/embedded_ende_target.gin \
  models/embedded_ende_draft.gin runs/train.gin -- "${FIXED[@]}" "${ADAFACTOR[@]}" \
  --gin.train.train.model=%DRAFT_MODEL --gin.train.train.distill_from=%MODEL \
  --gin.train.train.distill_params=%TARGET_PARAMS --gin.train.train.distill_weight=0.5 \
  "$(export_to $MODELS/embedded_ende_draft)"
if has distill; then
  DIVERGENCE=${DIVERGENCE:-fkl}
  train embedded_ende_draft_distill_$DIVERGENCE ${DISTILL_STEPS:-1000} \
    models/embedded_ende_target.gin models/embedded_ende_draft.gin runs/train.gin runs/distill.gin \
    -- --gin.TARGET_PARAMS_PATH="'${TARGET_PARAMS_PATH:-$MODELS/embedded_ende_target/params.msgpack}'" \
    --gin.DIVERGENCE="'$DIVERGENCE'" --gin.MIXTURE="{'data': 0.5, 'draft': 0.5}" \
    --gin.train.train.init_params=%DRAFT_PARAMS \
    "$(export_to $RUNS/export/embedded_ende_draft_distill_$DIVERGENCE)"
fi
has sum_ngram && $PY scripts/fit_ngram_drafts.py --task debian_summarize --target_len 32 \
  --out $MODELS/ngram_sum
has sum_target && train embedded_sum_target ${SUM_TARGET_STEPS:-2000} models/embedded_sum_target.gin \
  runs/train.gin runs/summarize.gin -- "${FIXED[@]}" "$(export_to $MODELS/embedded_sum_target)"
has sum_draft && train embedded_sum_draft ${SUM_DRAFT_STEPS:-2000} models/embedded_sum_target.gin \
  models/embedded_sum_draft.gin runs/train.gin runs/summarize.gin runs/distill.gin -- \
  "${FIXED[@]}" --gin.DIVERGENCE="'${DIVERGENCE:-fkl}'" "$(export_to $MODELS/embedded_sum_draft)"
has correct_target && train embedded_correct_target ${CORRECT_TARGET_STEPS:-3000} models/embedded_sum_target.gin \
  runs/train.gin runs/correct.gin -- "${FIXED[@]}" "$(export_to $MODELS/embedded_correct_target)"
has correct_draft && train embedded_correct_draft ${CORRECT_DRAFT_STEPS:-600} models/embedded_correct_target.gin \
  models/embedded_correct_draft.gin runs/train.gin runs/correct.gin runs/distill.gin -- \
  "${FIXED[@]}" --gin.FROZEN="('token_embedder', 'decoder/logits_dense')" \
  --gin.train.train.init_params='@draft_base/embedded.load_params()' \
  --gin.draft_base/embedded.load_params.name="'embedded_sum_draft'" \
  --gin.train.train.export_base="'embedded_sum_draft'" "$(export_to $MODELS/embedded_correct_draft)"
# keep NAME FILE...: copies a run's record (and its first 10 test predictions) as results/training/NAME_FILE.
keep() {
  local name=$1 f
  for f in "${@:2}"; do cp "$RUNS/$name/$f" "results/training/${name}_$f"; done
  head -n 10 "$RUNS/$name/test_predictions.jsonl" > "results/training/${name}_test_predictions_first10.jsonl"
}
RECORD=(final_metrics.json metrics.jsonl operative_config.gin command.txt environment.json)
if has correct_report; then  # the correction target's record (validation.correction_report)
  OUT=results/training name=embedded_correct_target
  keep $name "${RECORD[@]}"
  $PY -m specdec_t5x.training.validation correction_report $RUNS/$name/test_predictions.jsonl \
    > $OUT/${name}_correction_report.json
  cat $OUT/${name}_correction_report.json
fi
if has report all; then  # loss curves, decode-step timings and asset sizes into results/training/
  OUT=results/training && mkdir -p $OUT
  for name in embedded_ende_target embedded_ende_draft; do keep $name "${RECORD[@]}"; done
  $PY -c "from specdec_t5x.training import validation; validation.plot_curves({
    'target': '$RUNS/embedded_ende_target', 'draft': '$RUNS/embedded_ende_draft'},
    '$OUT/loss_curves.png')"
  # One cached decoder step, target vs draft (interleaved rounds, medians; c = draft / target).
  $PY -c "import json, sys; sys.path.insert(0, '.'); from benchmarks import random_pair
print(json.dumps(random_pair.embedded_step_costs(), indent=2, default=str))" | tee $OUT/decode_step.json
  ASSETS=(specdec_t5x/assets/models/*/params.msgpack specdec_t5x/assets/vocab/spm_8k.model)
  du -b "${ASSETS[@]}" | tee $OUT/asset_bytes.txt
  du -sh specdec_t5x/assets | tee -a $OUT/asset_bytes.txt
  { nproc; lscpu; } > $OUT/hardware.txt
  sha256sum "${ASSETS[@]}" > $OUT/asset_sha256.txt
fi
