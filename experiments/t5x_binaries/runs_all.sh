#!/usr/bin/env bash
# Every run of this experiment, in the order run (one T5X process at a time), then the analyses.
#   RUNSET=xb2 bash runs_all.sh      (logs /work/t5x_run/logs/$RUNSET_*, outputs /work/t5x_run/out/$RUNSET_*)
# A failing run is reported and the others go on.
set -u
cd "$(dirname "$0")"
export JAX_LOG_COMPILES=1 RUNSET=${RUNSET:-xb2}
unset XLA_FLAGS SPECDEC_CPU_KERNEL
ids=--gin_file=output_ids.gin
aux=(--gin.infer.mode="'predict_with_aux'")
t1b=(--gin.decoding.temperature_sample.temperature=1.0 --gin.decoding.temperature_sample.topk=0)
bf=(--gin.utils.RestoreCheckpointConfig.dtype="'bfloat16'" --gin.utils.DatasetConfig.batch_size=32)
bfa=("${bf[@]}" --gin.network.T5Config.dtype="'bfloat16'")
r() { echo "== $*"; bash run.sh "$@" || echo "FAILED: $*"; }
# a. T = 0, kernel off (T5X's path) / b. kernel on (default)
r infer baseline infer_base_t0 $ids
r eval baseline eval_base_t0
SPECDEC_CPU_KERNEL=0 r infer speculative infer_spec_t0_koff $ids
SPECDEC_CPU_KERNEL=0 r eval speculative eval_spec_t0_koff
r infer speculative infer_spec_t0_kon $ids
r eval speculative eval_spec_t0_kon
r infer speculative infer_spec_t0_kon_aux $ids "${aux[@]}"
# c. T = 1
r infer baseline infer_base_t1 $ids "${t1b[@]}"
r eval baseline eval_base_t1 "${t1b[@]}"
r infer speculative infer_spec_t1 $ids --gin.TEMPERATURE=1.0
r eval speculative eval_spec_t1 --gin.TEMPERATURE=1.0
r infer speculative infer_spec_t1_aux $ids --gin.TEMPERATURE=1.0 "${aux[@]}"
# d. two CPU devices
export XLA_FLAGS=--xla_force_host_platform_device_count=2
r infer baseline infer_base_t0_2dev $ids
r eval baseline eval_base_t0_2dev
SPECDEC_CPU_KERNEL=0 r infer speculative infer_spec_t0_koff_2dev $ids
SPECDEC_CPU_KERNEL=0 r eval speculative eval_spec_t0_koff_2dev
r infer speculative infer_spec_t0_kon_2dev $ids
unset XLA_FLAGS
# e. T5X's infer defaults: bfloat16 restore, batch 32 (activations float32 as the model gin sets),
#    then also bfloat16 activations (T5Config.dtype, as T5X's own T5 v1.1 gins)
r infer baseline infer_base_t0_bf16_b32 $ids "${bf[@]}"
r eval baseline eval_base_t0_bf16_b32 "${bf[@]}"
r infer speculative infer_spec_t0_bf16_b32_aux $ids "${bf[@]}" "${aux[@]}"
r eval speculative eval_spec_t0_bf16_b32 "${bf[@]}"
r infer baseline infer_base_t0_bf16act_b32 $ids "${bfa[@]}"
r eval baseline eval_base_t0_bf16act_b32 "${bfa[@]}"
r infer speculative infer_spec_t0_bf16act_b32_aux $ids "${bfa[@]}" "${aux[@]}"
r eval speculative eval_spec_t0_bf16act_b32 "${bfa[@]}"
# f. wall-clock repeats, interleaved
for i in 1 2; do
  r infer baseline timing_base_r$i $ids
  SPECDEC_CPU_KERNEL=0 r infer speculative timing_spec_koff_r$i $ids
  r infer speculative timing_spec_kon_r$i $ids
done
