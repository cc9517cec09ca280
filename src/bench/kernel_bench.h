// `zaya bench kernels`: the model's own non-GEMM CUDA kernels (backend/cuda/ops.h) timed at the
// shapes of one training micro-batch of a config, and the efficiencies the sizing cost model uses
// for them (sizing/kernel_class.h): attention forward and backward as TFLOP/s against the bf16
// peak, and the memory-bound classes (fused norm + residual, SwiGLU and expert dispatch, CCA, the
// loss passes, the AdamW update with the gradient norm) as the bandwidth they reach on the bytes
// the cost model counts for them, against the copy bandwidth.
//
// Timing follows gemm_bench.h's TimingPolicy (warm-up by GPU time, launches enqueued behind a
// spin kernel, per-launch CUDA events, median). Inputs are random and the saved tensors a backward
// reads come from running its forward once first. Deliberately not here: GEMMs (`zaya bench gemm`),
// checking results (tests/gpu compares every kernel with the CPU reference), rotating input sets:
// at training shapes every memory-bound kernel's working set is several times the L2 (rows
// below 3x L2 are marked).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "bench/gemm_bench.h"
#include "model/config.h"
#include "sizing/hardware.h"

namespace zaya::bench {

// One timed kernel (or a fixed group of launches), per launch.
struct KernelTiming {
  std::string name;  // "attention_fwd", "cca_conv_bwd", "residual_scale_rmsnorm_fwd", ...
  sizing::KernelClass cls = sizing::KernelClass::None;
  std::string shape;   // what it ran on, for the table
  int64_t window = 0;  // attention: the layer's sliding window (0: full causal)
  double us = 0;       // median time of one launch
  double flops = 0;    // attention: FLOPs of one launch (FlashAttention's count), else 0
  double bytes = 0;    // the kernel's own minimal traffic (read + written) per launch
  // Launches per instance of the class's cost-model ops (one layer; the whole micro-batch for the
  // loss): 2 for the two norms of a layer, tokens / chunk for a loss chunk, 1 otherwise.
  double per_instance = 1;
  int iters = 0;
  bool below_l2 = false;  // working set under 3x L2: may be flattered by the cache
};

struct KernelBenchOptions {
  ZayaConfig cfg;
  int64_t batch = 4, seq = 4096;
  int64_t optimizer_elems = int64_t(1) << 28;  // AdamW over this many fp32 parameters
  int device = 0;
  TimingPolicy timing;
};

// Defined in the *_cuda.cpp files; in a build without CUDA, bench/cpu_only_standins.cpp has stand-ins that throw.
// Times every kernel on device opt.device. Throws zaya::Error when the config's head dim is not
// one the attention kernels support or the device runs out of memory.
std::vector<KernelTiming> run_kernel_bench(const KernelBenchOptions& opt, const DeviceInfo& dev);

// The cost model's efficiency rows from the timed kernels (pure; unit-tested): one row per
// attention timing (work = its FLOPs in GFLOP, rate TFLOP/s, fraction of `peak_tflops`) and one row
// per memory-bound class present (work = the bytes the cost model counts for the class's ops per
// instance, forward + backward, in GB; rate = those bytes over the class's kernel time per
// instance; fraction of `copy_gbs`, capped at 1). `shape` labels the memory rows.
std::vector<sizing::KernelMeasurement> kernel_efficiencies(const ZayaConfig& cfg, int64_t batch,
                                                           int64_t seq,
                                                           const std::vector<KernelTiming>& rows,
                                                           int64_t optimizer_elems,
                                                           double peak_tflops, double copy_gbs);

// The profile update `--profile` merges: device, sm_count, hbm_capacity_gib and
// "kernel_efficiency" (rows keyed by class and shape).
nlohmann::json profile_from_kernels(const std::vector<sizing::KernelMeasurement>& eff,
                                    const DeviceInfo& dev);

// Fixed-width tables: one row per kernel (time, TFLOP/s or GB/s of its own traffic, fraction of
// the peak or copy bandwidth), then one per efficiency row.
std::string kernel_table(const std::vector<KernelTiming>& rows, double peak_tflops,
                         double copy_gbs);
std::string efficiency_table(const std::vector<sizing::KernelMeasurement>& eff);
// JSON {"schema":"zaya.bench.kernels/1","device","preset"...,"kernels":[...],"efficiency":[...]}.
std::string kernel_results_json(const std::vector<KernelTiming>& rows,
                                const std::vector<sizing::KernelMeasurement>& eff,
                                const DeviceInfo& dev, const std::string& model, int64_t batch,
                                int64_t seq, double peak_tflops, double copy_gbs);

}  // namespace zaya::bench
