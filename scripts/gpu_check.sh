#!/usr/bin/env bash
# The GPU check (issue 26): what recoverd does on a real NVIDIA GPU, in one call of at most 8 minutes.
# docs/gpu.md says how to run it on the device machine, what each check proves and what it cannot.
#
#   bash scripts/gpu_check.sh                     # on a GPU machine (the device tool: carry .gpu-bundle)
#   bash scripts/gpu_check.sh --no-gpu            # (or --dry-run) every check SKIP, no GPU touched: seconds
#   bash scripts/gpu_check.sh --rehearse-on-cpu   # the same checks with the CPU and NVML's stand-in
#   bash scripts/gpu_check.sh --only nvml,nccl    # some steps (names below), the others SKIP
#
# Results: $OUT (default ./gpu_check_out): gpu_check.jsonl (one JSON line per check: check, status
# PASS|FAIL|SKIP, reason, mode, seconds, details), summary.txt, env.json, logs.tar.gz (every step's
# output, the jobs' recoverd run and rank logs). Exit 0 when no check FAILed.
#
# Needs: bash, coreutils' timeout, python3 with torch (CUDA build) and nvidia-ml-py. recoverd's own
# dependencies (aetcd, grpcio, protobuf, ...) and an etcd binary come from .gpu-bundle/ when it is
# there (`make gpu-check-bundle`: a wheelhouse and etcd, ~15 MB, built where pip works) or from the
# environment; without them the job and group checks SKIP with that reason and the others still run.
#
# Steps, in order of value (each with its own timeout; the whole run stays within GPU_CHECK_BUDGET_S,
# 420 s by default, 480 at most): env, bundle, deps, nvml (nvml_raw, nvml_detector), nccl
# (nccl_raw_abort_reinit, nccl_group_abort_reinit), job1 (job_world1_kill), job2
# (job_shared_gpu_2ranks), ref (job_world1_bitwise, job_world1_bitwise_equal), pending
# (nccl_group_abort_pending), probe (nccl_two_ranks_one_gpu), and nccl_peer_hang, always SKIP.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CHECKS="$ROOT/scripts/gpu_check/checks.py"
PY="${GPU_CHECK_PYTHON:-python3}"
OUT="${OUT:-$ROOT/gpu_check_out}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-420}"
MODE=auto
ONLY=""

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }

while (($#)); do
  case "$1" in
    --no-gpu | --dry-run) MODE=no-gpu ;;
    --rehearse-on-cpu) MODE=rehearse ;;
    --only) ONLY="${2:?--only needs a list of steps}"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    --budget) BUDGET_S="${2:?--budget needs seconds}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if ! [[ "$BUDGET_S" =~ ^[0-9]+$ ]] || ((BUDGET_S > 480)); then
  echo "gpu_check: the budget must be a whole number of seconds, 480 at most (got $BUDGET_S)" >&2
  exit 2
fi

mkdir -p "$OUT"
RESULTS="$OUT/gpu_check.jsonl"
: >"$RESULTS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
export GPU_CHECK_RESULTS="$RESULTS" GPU_CHECK_WORK="$WORK" PYTHONUNBUFFERED=1
START=$SECONDS
REHEARSE=()
[[ $MODE == rehearse ]] && REHEARSE=(--rehearse)
RESULT_MODE=gpu
case $MODE in rehearse) RESULT_MODE=rehearsal ;; no-gpu) RESULT_MODE=no-gpu ;; esac

# ------------------------------------------------------------------ results written by this script

json_str() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\n'/\\n}"
  s="${s//$'\t'/ }"
  s="$(printf '%s' "$s" | tr -d '\000-\037')"
  printf '"%s"' "$s"
}

# result CHECK STATUS REASON: one line in the results, as checks.py writes them.
result() {
  local line
  line="{\"check\": $(json_str "$1"), \"status\": \"$2\", \"reason\": $(json_str "$3"), \"mode\": \"$RESULT_MODE\", \"seconds\": 0, \"details\": {}}"
  echo "$line" >>"$RESULTS"
  echo "$line"
}

has_result() { grep -q "\"check\": \"$1\"" "$RESULTS"; }

ALL_CHECKS=(nvml_raw nvml_detector nccl_raw_abort_reinit nccl_group_abort_reinit job_world1_kill
  job_shared_gpu_2ranks job_world1_bitwise job_world1_bitwise_equal nccl_group_abort_pending
  nccl_two_ranks_one_gpu)

# skip_rest REASON: every check without a result yet is a SKIP for REASON.
skip_rest() {
  local c
  for c in deps "${ALL_CHECKS[@]}"; do
    has_result "$c" || result "$c" SKIP "$1"
  done
}

selected() { [[ -z "$ONLY" || ",$ONLY," == *",$1,"* ]]; }

remaining() { echo $((BUDGET_S - (SECONDS - START))); }

# run_step STEP[/PART] CAP_S CHECK... -- COMMAND...: COMMAND under its own timeout (CAP_S, or what
# the budget has left), its output in $WORK/STEP-PART.log; each CHECK it did not report on is a
# FAIL (timed out, or ended without a result) or a SKIP (step not selected, no time left). Returns
# COMMAND's status (0 when skipped).
run_step() {
  local step="${1%%/*}" name="${1//\//-}" cap="$2" checks=() c rc=0 limit
  shift 2
  while [[ "$1" != -- ]]; do checks+=("$1"); shift; done
  shift
  if ! selected "$step"; then
    for c in "${checks[@]}"; do has_result "$c" || result "$c" SKIP "step $step not selected (--only $ONLY)"; done
    return 0
  fi
  limit=$(($(remaining) - 10))
  ((limit < cap)) || limit=$cap
  if ((limit < 20)); then
    for c in "${checks[@]}"; do has_result "$c" || result "$c" SKIP "no time left in the ${BUDGET_S}s budget"; done
    return 0
  fi
  echo "== $name (timeout ${limit}s, $(remaining)s of the budget left)"
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  grep -h '^{"check"' "$WORK/$name.log" || true
  for c in "${checks[@]}"; do
    has_result "$c" && continue
    if ((rc == 124 || rc == 137)); then
      result "$c" FAIL "step $name timed out after ${limit}s (its output: $name.log in logs.tar.gz)"
    else
      result "$c" FAIL "step $name exited $rc without a result: $(tail -n 3 "$WORK/$name.log" | tr '\n' ' ' | cut -c1-400)"
    fi
  done
  if ((rc == 124 || rc == 137)); then
    # Its checks reported, then it hung (a torn-down NCCL communicator, say): that is a finding too.
    has_result "${name}_exit" || result "${name}_exit" FAIL "step $name reported its checks, then did not exit within ${limit}s"
  fi
  return "$rc"
}

finish() {
  local rc=$?
  skip_rest "not reached (the script stopped early: exit $rc)"
  has_result nccl_peer_hang || result nccl_peer_hang SKIP "one GPU: a rank blocked in an NCCL collective by a dead or hung peer needs 2 GPUs or more (NCCL refuses two ranks of one communicator on one GPU); nccl_group_abort_pending, an abort while a collective waits on the GPU, is the nearest one GPU allows"
  if command -v "$PY" >/dev/null 2>&1; then
    "$PY" - "$RESULTS" "$OUT/summary.txt" "$MODE" "$((SECONDS - START))" <<'EOF' || cp "$RESULTS" "$OUT/summary.txt"
import json, sys
results, summary, mode, seconds = sys.argv[1:]
lines = [json.loads(l) for l in open(results) if l.strip()]
count = {s: sum(1 for l in lines if l["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
head = {"auto": "GPU CHECK", "rehearse": "GPU CHECK REHEARSAL ON THE CPU (no GPU result)", "no-gpu": "GPU CHECK, NO GPU"}[mode]
text = [f"{head}: {count['PASS']} PASS, {count['FAIL']} FAIL, {count['SKIP']} SKIP in {seconds}s"]
text += [f"{l['status']:4} {l['check']}: {l['reason']}" for l in lines]
open(summary, "w").write("\n".join(text) + "\n")
print("\n".join(text))
EOF
  else
    cp "$RESULTS" "$OUT/summary.txt"
  fi
  # Every step's output and the jobs' logs (not etcd's data, checkpoints or the installed wheels).
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" --exclude='./site' --exclude='./pkgs' --exclude='./bin' \
    --exclude='*/etcd' --exclude='*/ckpt' . 2>/dev/null || true
  [[ -n "${GPU_CHECK_KEEP:-}" ]] || rm -rf "$WORK"
  if grep -q '"status": "FAIL"' "$RESULTS"; then exit 1; fi
  exit 0
}
trap finish EXIT

echo "gpu_check: $MODE mode, budget ${BUDGET_S}s, results in $OUT"

# ------------------------------------------------------------------ is there a GPU?

if [[ $MODE == no-gpu ]]; then
  skip_rest "no CUDA device: --no-gpu (dry run) asked for no GPU check"
  exit 0
fi
if [[ $MODE == auto ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    MODE=no-gpu RESULT_MODE=no-gpu
    skip_rest "no CUDA device: no NVIDIA driver here (no nvidia-smi, no /dev/nvidia*)"
    exit 0
  fi
  command -v nvidia-smi >/dev/null 2>&1 && { nvidia-smi -L || true; } >"$WORK/nvidia-smi.log" 2>&1
  rc=0
  run_step env 90 -- "$PY" "$CHECKS" env --write "$OUT/env.json" || rc=$?
  cat "$WORK/env.log"
  if ((rc != 0)); then
    MODE=no-gpu RESULT_MODE=no-gpu
    skip_rest "no CUDA device: $(grep -h '^no CUDA device' "$WORK/env.log" | head -n 1 | cut -c16-300 || echo "the env step exited $rc")"
    exit 0
  fi
fi

# ------------------------------------------------------------------ recoverd and its dependencies

# recoverd from this checkout, as pyproject's package-dir maps it (scripts/typecheck.sh does the same).
mkdir -p "$WORK/pkgs/recoverd"
for entry in libs/recoverd/*; do ln -s "$ROOT/$entry" "$WORK/pkgs/recoverd/"; done
ln -s "$ROOT/services/coordinator" "$WORK/pkgs/recoverd/coordinator"
ln -s "$ROOT/services/strategy" "$WORK/pkgs/recoverd/strategy"
ln -s "$ROOT/services/node-agent" "$WORK/pkgs/recoverd/agent"
ln -s "$ROOT/services/cli" "$WORK/pkgs/recoverd/cli"
ln -s "$ROOT/services/gateway" "$WORK/pkgs/recoverd/gateway"
ln -s "$ROOT/libs/taskd_client" "$WORK/pkgs/taskd_client"
ln -s "$ROOT/libs/taskd" "$WORK/pkgs/taskd"
PYTHONPATH="$WORK/pkgs${PYTHONPATH:+:$PYTHONPATH}"

BUNDLE="$ROOT/.gpu-bundle"
if [[ -d "$BUNDLE/wheels" ]]; then
  have="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")"
  want="$(cat "$BUNDLE/PYTHON" 2>/dev/null || echo "$have")"
  notes=()
  if [[ -f "$BUNDLE/etcd.gz" ]]; then  # a static binary: whatever the Python
    mkdir -p "$WORK/bin"
    if gzip -dc "$BUNDLE/etcd.gz" >"$WORK/bin/etcd" && chmod +x "$WORK/bin/etcd" &&
      "$WORK/bin/etcd" --version >"$WORK/bundle.log" 2>&1; then
      export RECOVERD_ETCD_BIN="$WORK/bin/etcd"
      notes+=("$(head -n 1 "$WORK/bundle.log")")
    else
      notes+=("its etcd does not run here: $(tail -n 1 "$WORK/bundle.log" 2>/dev/null)")
    fi
  fi
  if [[ "$want" != "$have" ]]; then
    result bundle SKIP "the wheels of .gpu-bundle are for CPython $want, $PY is $have: not installed (make gpu-check-bundle GPU_BUNDLE_PYTHON=$have)${notes:+; ${notes[*]}}"
  else
    rc=0
    (
      set -e
      pip=("$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir)
      "${pip[@]}" --target "$WORK/site" "$BUNDLE"/wheels/*.whl
      # grpcio needs typing_extensions, which the image has (torch needs it too): ours only if not.
      if ! "$PY" -c 'import typing_extensions' 2>/dev/null && compgen -G "$BUNDLE/fallback/*.whl" >/dev/null; then
        "${pip[@]}" --target "$WORK/site" "$BUNDLE"/fallback/*.whl
      fi
    ) >>"$WORK/bundle.log" 2>&1 || rc=$?
    if ((rc == 0)); then
      PYTHONPATH="$PYTHONPATH:$WORK/site"
      installed=("$WORK"/site/*.dist-info)
      result bundle PASS "installed the wheels of .gpu-bundle offline (${#installed[@]} packages)${notes:+; ${notes[*]}}"
    else
      result bundle FAIL "the wheels of .gpu-bundle did not install here: $(tail -n 2 "$WORK/bundle.log" | tr '\n' ' ' | cut -c1-400)"
    fi
  fi
else
  result bundle SKIP "no .gpu-bundle here (make gpu-check-bundle, then carry it): recoverd's dependencies must be installed already"
fi
export PYTHONPATH

DEPS=1
run_step deps 60 deps -- "$PY" "$CHECKS" "${REHEARSE[@]}" deps || DEPS=0
NO_DEPS="recoverd's dependencies or etcd are missing here (see the deps check)"

# ------------------------------------------------------------------ the checks

run_step nvml/raw 60 nvml_raw -- "$PY" "$CHECKS" "${REHEARSE[@]}" nvml-raw || true
if ((DEPS)); then
  run_step nvml/detector 60 nvml_detector -- "$PY" "$CHECKS" "${REHEARSE[@]}" nvml-detector || true
else
  result nvml_detector SKIP "$NO_DEPS; nvml_raw called the same NVML functions without them"
fi
run_step nccl/raw 60 nccl_raw_abort_reinit -- "$PY" "$CHECKS" "${REHEARSE[@]}" nccl-raw || true
if ((DEPS)); then
  run_step nccl/group 100 nccl_group_abort_reinit -- "$PY" "$CHECKS" "${REHEARSE[@]}" nccl-group || true
  run_step job1 170 job_world1_kill -- "$PY" "$CHECKS" "${REHEARSE[@]}" job --variant world1 || true
  run_step job2 170 job_shared_gpu_2ranks -- "$PY" "$CHECKS" "${REHEARSE[@]}" job --variant shared2 || true
  run_step ref 150 job_world1_bitwise job_world1_bitwise_equal -- \
    "$PY" "$CHECKS" "${REHEARSE[@]}" job --variant world1-ref || true
  run_step pending 70 nccl_group_abort_pending -- "$PY" "$CHECKS" "${REHEARSE[@]}" nccl-group --pending || true
else
  for c in nccl_group_abort_reinit job_world1_kill job_shared_gpu_2ranks job_world1_bitwise \
    job_world1_bitwise_equal nccl_group_abort_pending; do
    result "$c" SKIP "$NO_DEPS"
  done
fi
run_step probe 100 nccl_two_ranks_one_gpu -- "$PY" "$CHECKS" "${REHEARSE[@]}" nccl-probe || true
