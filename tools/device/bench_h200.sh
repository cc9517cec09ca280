#!/bin/bash
# Characterizes one H200 machine with zaya's own benchmarks beside their peers, in one device call
# (about 6 minutes, the build included), for the lead to run on the device machine from the
# repository root:
#     bash tools/device/bench_h200.sh     (BENCH_DTYPES=bf16 skips the fp8 GEMMs;
#                                          GEMM_ROUNDS=N peer rounds, default 4, zaya runs N+1)
# Steps (each logged, timed and noted in summary.txt):
#   build     zaya (CUDA, sm_90a) and tools/nccl_direct.cu (nvcc, against the NCCL CMake found)
#   mem       `zaya bench mem` (device kernels, memcpy, host copies; profile)
#   gemm      a zaya tuning round (autotuning; its kept algorithms are what the Z rounds time,
#             --algos-from), then
#             interleaved rounds Z0 P0 Z1 P1 ... P(N-1) ZN: zaya (Z) and the PyTorch peer (P:
#             tools/bench_peer.py --rounds 1; P0 also times its copy peer), each round a process of
#             its own, while nvidia-smi samples the SM clock, power and temperature every 100 ms
#             (gpu_smi.csv). zaya: bf16 + fp8, knee squares 256..16384, wave sweep 1024..8192
#             (+256, k=4096), ZAYA1-8B step GEMMs at 8192 tokens (lm_head dgrad included), with
#             --cublas (cuBLAS's default GEMM in-process: tells algorithm from harness). Every row
#             of both sides carries its time window and NVML clock samples. The last zaya round
#             writes the CSV/SVG and the profile's knee.
#   comm      `zaya bench comm --backend nccl` (mpirun, one rank per GPU, all collectives, rank
#             sweep) and tools/nccl_direct (all-reduce, same sizes and counts) on all visible GPUs;
#             on a multi-GPU machine also the 1-GPU pair.
#   compare   tools/bench_peer_compare.py: zaya/peer ratios paired round by round (target median
#             >= 0.98) with each side's clock, previously failing shapes, knee, copies, all-reduce.
#   focus     the GEMM shapes below target again, in FOCUS_ROUNDS (4) more interleaved rounds,
#             then which kernel each side runs for them (zaya's kept algorithm, the peer's kernel
#             names from torch.profiler).
# Everything lands in $OUT/bench_h200.tgz (JSON, CSV, SVG, logs, profile) plus $OUT/summary.txt.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-$root/bench_out}"
mkdir -p "$OUT"
W="$(mktemp -d)/bench_h200"
mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
summary="$W/summary.txt"
t_start=$SECONDS
note() { echo "$*" | tee -a "$summary"; }
finish() {
  note "total: $((SECONDS - t_start)) s"
  cp "$summary" "$OUT/summary.txt" 2>/dev/null
  tar -C "$(dirname "$W")" -czf "$OUT/bench_h200.tgz" bench_h200
  echo "results: $OUT/bench_h200.tgz, $OUT/summary.txt"
}
smi_pid=""
stop_smi() {  # the background nvidia-smi sampler, if running
  [ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null && wait "$smi_pid" 2>/dev/null
  smi_pid=""
}
trap 'stop_smi; finish' EXIT

# A snapshot made with `git archive` has no .git (the rev-parse would find an enclosing
# repository's HEAD): it carries its commit in a COMMIT file.
note "# zaya bench on $(hostname) at $(date -u +%FT%TZ), commit $(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version \
  --format=csv >"$W/nvidia-smi.csv" 2>&1 && note "$(cat "$W/nvidia-smi.csv")"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  >>"$summary" 2>&1

# ---- build ----
# carried dependencies (.debs/, see tools/device/deps.sh): fmt, nlohmann-json, CLI11, toml++, xxhash
if compgen -G ".debs/*.deb" >/dev/null; then
  # shellcheck source=tools/device/deps.sh
  source tools/device/deps.sh
  note "deps: unpacked $(find .debs -name "*.deb" | wc -l) .deb files into /tmp/deps"
fi
jobs="$(nproc)"
t0=$SECONDS
if ! { cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90a -DZAYA_TESTS=OFF &&
       ninja -C build-h200 -j "$jobs" zaya; } >"$W/build.log" 2>&1; then
  note "BUILD FAILED (tail of build.log):"
  tail -30 "$W/build.log" | tee -a "$summary"
  exit 1
fi
note "build zaya: $((SECONDS - t0)) s"
Z="$root/build-h200/zaya"
note "$("$Z" version)"
# nccl_direct: the NCCL and nvcc the zaya build found (CMake cache), so both link the same NCCL.
cache() { sed -n "s/^$1:[A-Z]*=//p" build-h200/CMakeCache.txt | head -1; }
ND="$W/nccl_direct"
nvcc_bin="$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' \
  build-h200/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)"
[ -x "$nvcc_bin" ] || nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
nccl_lib="$(cache NCCL_LIBRARY)"
nccl_inc="$(cache NCCL_INCLUDE_DIR)"
t0=$SECONDS
if [ -n "$nccl_lib" ] && [ -n "$nccl_inc" ] && "$nvcc_bin" -O2 -std=c++17 -arch=sm_90a \
     -I"$nccl_inc" -o "$ND" tools/nccl_direct.cu "$nccl_lib" \
     -Xlinker -rpath -Xlinker "$(dirname "$nccl_lib")" >"$W/nccl_direct_build.log" 2>&1; then
  note "build nccl_direct: $((SECONDS - t0)) s"
else
  note "nccl_direct: build failed or no NCCL (lib '$nccl_lib', include '$nccl_inc'):"
  tail -5 "$W/nccl_direct_build.log" 2>/dev/null | tee -a "$summary"
  ND=""
fi

# ---- measurements ----
run() {  # run NAME CMD...: log to NAME.log, note the status and time
  local name="$1"; shift
  local t0=$SECONDS
  "$@" >"$W/$name.log" 2>&1
  local rc=$?
  note "$name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -5 "$W/$name.log" | tee -a "$summary"
  return $rc
}
P="$W/hardware_profile.json"
run mem "$Z" bench mem -b 256K -e 4G -f 2 --json "$W/mem.json" --csv "$W/mem.csv" \
  --svg "$W/mem.svg" --profile "$P"

# --cuda-graph fp8: the peer replays torch._scaled_mm from CUDA graphs (its direct calls synchronise
# the host), so zaya's fp8 rows are graph replays too: the same launch path on both sides (the fp8
# rows of 5-15 us trailed by 3-10% with direct launches, docs/bench/h200-2026-12-03f).
# BENCH_DTYPES=bf16 halves the GEMM time if the call runs short of its limit. Time: a zaya round
# ~24 s, a peer round ~25 s (its process start included), so the default 4 peer rounds add ~2 min
# to the ~3.5 min of the old ABBA protocol.
gemm_args=(bench gemm --dtype "${BENCH_DTYPES:-bf16,fp8}" --knee --knee-max 16384 --waves 1024:8192:+256
           --wave-k 4096 --model zaya1-8b --tokens 8192 --cublas --cuda-graph fp8)
rounds="${GEMM_ROUNDS:-4}"
# nvidia-smi's timestamps are local time: TZ=UTC makes them Unix-comparable; smi_start lets the
# comparison detect (and take off) an offset if nvidia-smi ignored TZ.
date +%s.%N >"$W/gpu_smi.start"
TZ=UTC nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu \
  --format=csv,nounits -lms 100 >"$W/gpu_smi.csv" 2>/dev/null &
smi_pid=$!
# A tuning round first (not compared): zaya's autotuning (the heuristic's candidates and the wider
# per-algorithm-id search) times dozens of candidates per shape, a burst of work the peer's rounds do
# not have; the Z rounds then time the algorithms it kept (--algos-from), so both sides' rounds
# hold the GPU for about as long and meet the power-limited clock alike.
run gemm_tune "$Z" "${gemm_args[@]}" --json "$W/gemm_tune.json" &&
  gemm_args+=(--algos-from "$W/gemm_tune.json")
# Z0 sets the shapes, operand-set counts, warm-up and iteration counts and the timing policy that
# every peer round reads, so both sides measure identically.
run gemm_z0 "$Z" "${gemm_args[@]}" --json "$W/gemm_z0.json"
zs=("$W/gemm_z0.json")
ps=()
for ((i = 0; i < rounds; i++)); do
  mem_flag=(--skip-mem)
  [ "$i" -eq 0 ] && mem_flag=()
  run "peer_p$i" python3 tools/bench_peer.py --gemm-json "$W/gemm_z0.json" --rounds 1 \
    ${mem_flag[@]+"${mem_flag[@]}"} --out "$W/peer_p$i.json" && ps+=("$W/peer_p$i.json")
  z="$W/gemm_z$((i + 1)).json"
  if [ "$i" -eq $((rounds - 1)) ]; then
    run "gemm_z$((i + 1))" "$Z" "${gemm_args[@]}" --json "$z" --csv "$W/gemm.csv" \
      --svg "$W/gemm.svg" --profile "$P"
  else
    run "gemm_z$((i + 1))" "$Z" "${gemm_args[@]}" --json "$z"
  fi
  zs+=("$z")
done
stop_smi

ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
comm_flags=(-b 8 -e 256M -f 4 --dtype bfloat16 --inplace both -n 20 -w 5)
nd_flags=(-b 8 -e 256M -f 4 -d bfloat16 -n 20 -w 5)
pairs=()
if command -v mpirun >/dev/null && [ "$ngpu" -ge 1 ]; then
  run comm_nccl mpirun -np "$ngpu" --oversubscribe "$Z" bench comm --backend nccl \
    --ops all --sweep-ranks "${comm_flags[@]}" \
    --json "$W/comm_nccl.json" --csv "$W/comm_nccl.csv" --svg "$W/comm_nccl.svg" --profile "$P"
  if [ -n "$ND" ]; then
    run nccl_direct "$ND" -g "$ngpu" "${nd_flags[@]}" --json "$W/nccl_direct.json"
    pairs+=(--comm "$W/comm_nccl.json" --nccl-direct "$W/nccl_direct.json" --label "${ngpu}-GPU")
    if [ "$ngpu" -gt 1 ]; then
      run comm_1gpu mpirun -np 1 "$Z" bench comm --backend nccl --ops all_reduce \
        "${comm_flags[@]}" --json "$W/comm_1gpu.json"
      run nccl_direct_1gpu "$ND" -g 1 "${nd_flags[@]}" --json "$W/nccl_direct_1gpu.json"
      pairs+=(--comm "$W/comm_1gpu.json" --nccl-direct "$W/nccl_direct_1gpu.json" --label 1-GPU)
    fi
  fi
else
  note "comm: skipped (no mpirun or no GPU)"
fi

# ---- comparison ----
misses="$W/gemm_misses.txt"
python3 tools/bench_peer_compare.py --gemm "${zs[@]}" --peer ${ps[@]+"${ps[@]}"} \
  --smi "$W/gpu_smi.csv" --smi-start "$(cat "$W/gpu_smi.start")" --mem "$W/mem.json" \
  --profile "$P" ${pairs[@]+"${pairs[@]}"} --misses-out "$misses" >>"$summary" 2>&1

# ---- focus rounds ----
# The GEMM shapes the comparison left below target, again in FOCUS_ROUNDS (default 4) more peer
# rounds between zaya rounds (the same algorithms, --algos-from; both dtypes for every listed
# shape), so that a shape's verdict rests on more pairs than the full sweep can afford.
# FOCUS_ROUNDS=0 skips them.
frounds="${FOCUS_ROUNDS:-4}"
if [ "$frounds" -gt 0 ] && [ -s "$misses" ]; then
  fargs=(bench gemm --cublas --cuda-graph fp8 --dtype "$(cut -d' ' -f1 "$misses" | sort -u |
    paste -sd,)" --shape "$(cut -d' ' -f2 "$misses" | sort -u | paste -sd,)")
  [ -f "$W/gemm_tune.json" ] && fargs+=(--algos-from "$W/gemm_tune.json")
  note "focus: $(wc -l <"$misses") shapes below target, $frounds more peer rounds"
  run gemm_f0 "$Z" "${fargs[@]}" --json "$W/gemm_f0.json"
  fz=("$W/gemm_f0.json")
  fp=()
  for ((i = 0; i < frounds; i++)); do
    run "peer_f$i" python3 tools/bench_peer.py --gemm-json "$W/gemm_f0.json" --rounds 1 \
      --skip-mem --out "$W/peer_f$i.json" && fp+=("$W/peer_f$i.json")
    run "gemm_f$((i + 1))" "$Z" "${fargs[@]}" --json "$W/gemm_f$((i + 1)).json" &&
      fz+=("$W/gemm_f$((i + 1)).json")
  done
  echo -e "\n# ==== focus rounds (the shapes above, again) ====" >>"$summary"
  python3 tools/bench_peer_compare.py --gemm "${fz[@]}" --peer ${fp[@]+"${fp[@]}"} \
    >>"$summary" 2>&1
  # Which kernel each side runs for these shapes: zaya's kept cuBLASLt algorithm (algo_fields,
  # named from this toolkit's cublasLt.h) beside the kernel one peer call launches (torch.profiler),
  # with a verdict per shape (tools/gemm_kernels.py).
  if run peer_kernels python3 tools/bench_peer.py --gemm-json "$W/gemm_f0.json" --rounds 1 \
    --skip-mem --no-nvml --kernel-names --out "$W/peer_kernels.json"; then
    echo -e "\n## kernels of the focus shapes (zaya: kept cuBLASLt algorithm; peer: kernel names)" \
      >>"$summary"
    python3 tools/gemm_kernels.py "$W/gemm_f0.json" "$W/peer_kernels.json" >>"$summary" 2>&1
  fi
fi
