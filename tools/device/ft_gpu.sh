#!/bin/bash
# Fault tolerance on one GPU (issue: the supervisor), from the repository root with a zaya built
# with MPI, CUDA and NCCL:
#     Z=build/zaya bash tools/device/ft_gpu.sh            (about 4 minutes on an H100)
# or sourced as tools/device/ab_step.sh's EXTRA (which defines Z, LOGS and note()). DEVICE=cpu runs
# steps 1 and 2 on the CPU instead (a dry run of the script on a machine without a GPU).
# 1. The tiny preset on the GPU under `zaya supervise -- mpirun -np 1 zaya train` (NCCL): one
#    fault per attempt (kill, hang in the forward, hang in a collective, exit, NaN once, a
#    corrupted checkpoint); the run completes with the final weights of an uninterrupted GPU run
#    bit for bit; detection and recovery times from the supervisor's report.
# 2. Two ranks sharing the GPU over MPI (parallel.backend = "mpi"): kill, hang in the backward, a
#    hang in a collective; completes bit for bit with the uninterrupted two-rank run.
# 3. The ranks' watchdog on an NCCL communicator: a hang inside a collective with
#    ZAYA_COLLECTIVE_TIMEOUT=3 ends the job with exit 5 (ncclCommAbort), and under supervision the
#    run recovers from it.
# 4. The 8-layer ZAYA1-base (model.layers = 8, seq 1024) on the GPU under supervision, a kill and a
#    hang: detection and recovery times, and the checkpoint restore time on its own.
# FT_PARTS picks the parts (default "1 2 3 4").
# Every failed check prints FAIL and counts in the exit status (the return status when sourced).
ft_gpu_main() {
  local root Z_="${Z:-build/zaya}" dev="${DEVICE:-cuda}" fails=0
  root="$(pwd)"
  local out="${OUT:-$root/ft_out}"
  mkdir -p "$out"
  local logs="${LOGS:-$out/ft_logs}" summary="$out/ft_summary.txt"
  mkdir -p "$logs"
  : > "$summary"
  say() { echo "$*" | tee -a "$summary"; }
  bad() { say "FAIL: $*"; fails=$((fails + 1)); }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_hwloc_base_binding_policy=none  # mpirun binds ranks to one core each at np <= 2
  unset ZAYA_SUPERVISOR ZAYA_FAULTS ZAYA_COLLECTIVE_TIMEOUT
  say "# ft_gpu at $(date -u +%FT%TZ) on $dev, zaya $Z_"
  local T
  T="$(mktemp -d)"
  "$Z_" data prepare --input README.md docs/TRAINING.md docs/FAULT_TOLERANCE.md \
    --output-prefix "$T/ds" --tokenizer bytes > "$logs/ft_prep.log" 2>&1 || bad "data prepare"
  local backend=nccl
  [ "$dev" = cpu ] && backend=mpi
  toml() {  # toml STEPS SEQ BACKEND [MODEL LAYERS [CKPT_EVERY KEEP_LAST]]
    cat <<EOT
[model]
config = "${4:-tiny}"
layers = ${5:-0}
[data]
tokenizer = "bytes"
[[data.blend]]
prefix = "$T/ds"
[eval]
every = 0
[checkpoint]
every = ${6:-1}
keep_last = ${7:-3}
[schedule]
warmup_steps = 3
[train]
device = "$dev"
micro_batch = 1
seq_len = $2
steps = $1
log_every = 1
[parallel]
backend = "$3"
EOT
  }
  toml 24 64 "$backend" > "$T/tiny1.toml"
  toml 24 64 mpi > "$T/tiny2.toml"
  local mpi=(mpirun --oversubscribe -x CUDA_VISIBLE_DEVICES=0 -x NCCL_NVLS_ENABLE)
  local sup=(--ckpt-timeout 60 --startup-timeout 120 --grace 2 --progress-every 0
             --max-restarts 20 --health off --hang-min 5 --no-progress 10)
  job() {  # job NP TOML NAME [ARGS...]: the launch command
    local np="$1" cfg="$2" name="$3"
    shift 3
    echo "${mpi[@]}" -np "$np" "$Z_" train --config "$cfg" --out "$T/$name" --quiet "$@"
  }
  report() {  # report NAME: one line from the supervisor's report
    python3 - "$T/$1/supervisor/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
f = r["failure_list"]
det = [x["detect_s"] for x in f if x["detect_s"] >= 0]
rec = [x["recover_s"] for x in f if x["recover_s"] >= 0]
res = [x["restore_s"] for x in f if x["restore_s"] >= 0]
fmt = lambda v: f"median {sorted(v)[len(v) // 2]:.2f} s, max {max(v):.2f} s" if v else "none"
print(f"{r['result']}: {len(f)} failures {json.dumps(r['by_cause'], sort_keys=True)}; "
      f"detect {fmt(det)}; recover {fmt(rec)}; restore {fmt(res)}; goodput {100 * r['goodput']:.1f}%")
PY
  }
  supervised() {  # supervised NAME PLAN LAUNCH...: a supervised run, its report line
    local name="$1" plan="$2" t0=$SECONDS
    shift 2
    # shellcheck disable=SC2046
    timeout 400 "$Z_" supervise "${sup[@]}" --faults "$plan" -- "$@" > "$logs/ft_$name.log" 2>&1 ||
      { tail -20 "$logs/ft_$name.log"; bad "$name: the supervised run did not complete"; }
    say "$name ($((SECONDS - t0)) s): $(report "$name" 2>&1)"
  }
  same() {  # same A B: final weights bit for bit
    cmp -s "$T/$1/model/model.safetensors" "$T/$2/model/model.safetensors" &&
      say "$2: final weights bit-identical to $1" || bad "$2: final weights differ from $1"
  }

  local parts=" ${FT_PARTS:-1 2 3 4} "
  has() { [[ "$parts" == *" $1 "* ]]; }
  # 1. One rank.
  if has 1 || has 3; then
    # shellcheck disable=SC2046
    timeout 300 $(job 1 "$T/tiny1.toml" ref1) > "$logs/ft_ref1.log" 2>&1 || bad "the uninterrupted run (1 rank)"
  fi
  # shellcheck disable=SC2046
  has 1 && supervised one "0:kill@rank=0,step=+2 1:hang@rank=0,step=+2,section=forward 2:hang@rank=0,step=+1,section=collective 3:exit@rank=0,step=+2,arg=1 4:nan@rank=0,step=+1 5:corrupt_ckpt@rank=0,step=+1" \
    $(job 1 "$T/tiny1.toml" one)
  has 1 && same ref1 one

  # 2. Two ranks on the one GPU over MPI.
  if has 2; then
    # shellcheck disable=SC2046
    timeout 300 $(job 2 "$T/tiny2.toml" ref2) > "$logs/ft_ref2.log" 2>&1 || bad "the uninterrupted run (2 ranks)"
    supervised two "0:kill@rank=1,step=+2 1:hang@rank=0,step=+2,section=backward 2:hang@rank=1,step=+1,section=collective" \
      $(job 2 "$T/tiny2.toml" two)
    same ref2 two
  fi

  if [ "$dev" != cpu ] && has 3; then
    # 3. The watchdog aborts the NCCL communicator.
    local t0=$SECONDS rc
    # shellcheck disable=SC2046
    ZAYA_COLLECTIVE_TIMEOUT=3 ZAYA_FAULTS="hang@rank=0,step=3,section=collective" \
      timeout 120 $(job 1 "$T/tiny1.toml" wd) > "$logs/ft_wd.log" 2>&1
    rc=$?
    say "NCCL watchdog: exit $rc after $((SECONDS - t0)) s; $(grep -m1 -o 'watchdog: .*' "$logs/ft_wd.log" | cut -c1-160)"
    [ "$rc" = 5 ] || bad "NCCL watchdog: exit $rc, expected 5"
    # shellcheck disable=SC2046
    ZAYA_COLLECTIVE_TIMEOUT=3 supervised wd_sup "0:hang@rank=0,step=3,section=collective" \
      $(job 1 "$T/tiny1.toml" wd_sup)
    same ref1 wd_sup
  fi
  if [ "$dev" != cpu ] && has 4; then
    # 4. The 8-layer ZAYA1-base: a save is 18.8 GB, so every second step, one kept (two on disk
    # while the next is written).
    toml 8 1024 nccl zaya1-base 8 2 1 > "$T/base.toml"
    # shellcheck disable=SC2046
    supervised base "0:kill@rank=0,step=+2 1:hang@rank=0,step=+2,section=backward" \
      $(job 1 "$T/base.toml" base)
  fi
  rm -rf "$T"
  say "ft_gpu: $fails failed check(s)"
  [ -z "${LOGS:-}" ] && tar -czf "$out/ft_logs.tgz" -C "$out" "$(basename "$logs")" 2>/dev/null
  return "$fails"
}
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  ft_gpu_main "$@"
  exit $?
else
  ft_gpu_main "$@"
fi
