#!/usr/bin/env bash
# Runs T5X's own t5x/infer.py or t5x/eval.py (unmodified, from a T5X tree) with this folder's gin.
#   bash run.sh <infer|eval> <baseline|speculative> <name> [extra --gin.X=... flags]
# Writes /work/t5x_run/out/<RUNSET>_<name>/ and the log /work/t5x_run/logs/<RUNSET>_<name>.log
# (RUNSET default xb2): the command, the environment switches, the project's commit, `git status`,
# a hash of the library's sources (specdec_t5x/**/*.py, *.gin, *.cc, *.h) and of the built
# kernel extension as imported, `uptime` before and after, whole-process wall seconds.
# Env: T5X_TREE (default /work/t5x_src), PY (default /work/t5x_env/bin/python), SPECDEC_CPU_KERNEL,
# XLA_FLAGS (--xla_force_host_platform_device_count=2 for two CPU devices), JAX_LOG_COMPILES.
# PYTHONPATH=/work/t5x_stubs: stub airio/jestimator packages T5X's __init__ imports (test
# environment only, not part of the project).
set -euo pipefail
binary=$1; which=$2; name=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
t5x=${T5X_TREE:-/work/t5x_src}
py=${PY:-/work/t5x_env/bin/python}
pkg=$("$py" -c 'import os, specdec_t5x; print(os.path.dirname(specdec_t5x.__file__))')
export PYTHONPATH=/work/t5x_stubs TF_CPP_MIN_LOG_LEVEL=2
if [ "$binary" = infer ]; then outflag=INFER_OUTPUT_DIR; else outflag=EVAL_OUTPUT_DIR; fi
runset=${RUNSET:-xb2}
out=/work/t5x_run/out/${runset}_$name
log=/work/t5x_run/logs/${runset}_$name.log
[ -e "$out" ] && { echo "refusing: $out exists (infer.py skips completed output dirs)"; exit 2; }
args=(t5x/$binary.py --gin_search_paths=$t5x,$here/gin,$pkg --gin_file=${which}_$binary.gin
      --gin.CHECKPOINT_PATH="'/work/t5x_run/ckpt/target/checkpoint_0'" --gin.$outflag="'$out'" "$@")
{
  echo "# start $(date -u +%FT%TZ) host_nproc=$(nproc) XLA_FLAGS=${XLA_FLAGS:-} SPECDEC_CPU_KERNEL=${SPECDEC_CPU_KERNEL:-} JAX_LOG_COMPILES=${JAX_LOG_COMPILES:-}"
  echo "# project: $(git -C "$pkg/.." rev-parse HEAD) status: $(git -C "$pkg/.." status --short | tr '\n' ';')"
  echo "# library sources sha256: $(cd "$pkg" && find . \( -name '*.py' -o -name '*.gin' -o -name '*.cc' -o -name '*.h' \) | sort | xargs sha256sum | sha256sum | cut -c1-16)"
  echo "# kernel extension sha256: $(sha256sum "$pkg"/cpu_kernel/_matmul*.so 2>/dev/null | cut -c1-16)"
  echo "# uptime before: $(uptime)"
  echo "# cd $t5x && nice $py $(printf '%q ' "${args[@]}")"
} > "$log"
cd "$t5x"
start=$(date +%s.%N)
rc=0
nice "$py" "${args[@]}" >> "$log" 2>&1 || rc=$?
{
  echo "# exit status: $rc"
  echo "# wall seconds (whole process): $(echo "$(date +%s.%N) - $start" | bc)"
  echo "# uptime after: $(uptime)"
} >> "$log"
tail -3 "$log"
exit $rc
