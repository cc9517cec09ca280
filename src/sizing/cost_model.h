// A roofline cost model for ZAYA-style training and inference on one hardware profile: each op
// takes max(FLOPs / throughput, bytes / bandwidth). GEMMs run at the datasheet peak or, when the
// profile carries a measured GEMM table, the achieved rate interpolated by the GEMM's work.
// Calibrated (the default whenever the profile has kernel efficiencies): attention runs at the
// profile's attention_fwd / attention_bwd rate and each memory-bound op at its class's share of the
// copy bandwidth (hardware.h); HardwareProfile::roofline() gives the pure roofline, every non-GEMM
// kernel at the peak and the copy bandwidth.
// Training adds the ZeRO-1 optimizer step (sharded elementwise update, Muon's Newton–Schulz) and
// the data-parallel gradient reduce-scatter and parameter all-gather; inference gives prefill
// throughput and decode latency (weights and KV cache streamed from HBM).
//
// Deliberately not modelled: kernel launch overheads, expert load imbalance, pipeline/tensor/expert
// parallelism, and how much of the communication hides behind compute (both ends are reported).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "sizing/hardware.h"
#include "sizing/model_shape.h"

namespace zaya::sizing {

struct TrainSetup {
  int64_t micro_batch = 4;  // sequences per rank per micro-step
  int64_t seq = 4096;       // tokens per sequence
  int ranks = 8;            // GPUs (ZeRO-1 shards over all of them)
  int cp = 1;               // context-parallel GPUs per sequence: ranks / cp data-parallel groups
  int64_t bucket_elems = int64_t(25) << 18;  // fp32 elements per rank per ZeRO-1 bucket (25 MiB)
  int64_t global_batch = 0;                  // sequences per optimizer step; 0: micro_batch * ranks
  bool recompute = false;                    // full per-layer activation recomputation
  OptimizerKind optimizer = OptimizerKind::Muon;
  int grad_bytes = 4;       // gradient buffer element (fp32 accumulation)
  int grad_comm_bytes = 4;  // reduce-scatter element (fp32 by default; 2 for bf16)
  int64_t micro_tokens() const { return micro_batch * seq / cp; }  // per rank
  int64_t groups() const { return ranks / cp; }
  int64_t global_sequences() const {
    return global_batch > 0 ? global_batch : micro_batch * groups();
  }
  // Throws zaya::Error naming the flag when a value is out of range or the global batch is not a
  // whole number of micro-batches per rank.
  void validate() const;
  int64_t accumulation_steps() const { return global_sequences() / (micro_batch * groups()); }
};

// Bytes the elementwise optimizer step moves per parameter of a rank's shard: the gradient read
// for the global norm (4), the gradient read by the update (4), the fp32 master read and written
// (8), the bf16 copy written (2); plus 8 per fp32 state (read and written): AdamW 18 + 2·8 = 34.
inline constexpr double kOptimizerBytesPerParam = 18, kOptimizerBytesPerState = 8;

struct OpTime {
  std::string name;
  OpKind kind = OpKind::Memory;
  KernelClass cls = KernelClass::None;
  double flops = 0, bytes = 0;  // all instances, forward + backward (+ recompute)
  double seconds = 0;
  bool compute_bound = false;
  double gemm_gflop = 0;  // work of one forward instance (GEMMs)
};

// Roofline time of an op instance with `flops`, `bytes`: GEMMs at the measured GEMM rate for
// `instance_gflop`, everything else at the bf16 peak; bytes at the copy bandwidth.
double roofline_seconds(const HardwareProfile& hw, OpKind kind, double flops, double bytes,
                        double instance_gflop, bool* compute_bound = nullptr);
// Time of one instance of an op's forward (backward = false) or backward pass with the profile's
// kernel efficiencies: GEMMs as roofline_seconds, attention at the attention_fwd / attention_bwd
// rate for the pass's FLOPs, memory-bound ops at their class's bandwidth for the op's forward +
// backward bytes; each never faster than its bytes at the copy bandwidth (compute-bound ops) or
// its FLOPs at the peak (memory-bound ops). On HardwareProfile::roofline() this is the roofline.
double op_seconds(const HardwareProfile& hw, const Op& o, bool backward,
                  bool* compute_bound = nullptr);

struct TrainEstimate {
  std::vector<OpTime> ops;  // one micro-batch, forward + backward
  double microbatch_s = 0;
  int64_t accumulation = 1;
  double compute_s = 0;    // all micro-batches of one step on one rank
  double optimizer_s = 0;  // gradient norm, sharded update, Newton–Schulz
  double reduce_scatter_s = 0, all_gather_s = 0;
  double reduce_scatter_busbw = 0, all_gather_busbw = 0;  // bytes/s
  double step_s = 0;             // no overlap: compute + communication + optimizer
  double step_s_overlapped = 0;  // communication fully hidden: max(compute, comm) + optimizer
  double tokens_per_step = 0;
  double tokens_per_s = 0;  // cluster, at step_s
  double tokens_per_s_per_gpu = 0;
  double model_flops_per_token = 0;
  double mfu = 0;  // model FLOPs / (ranks · datasheet bf16 peak · step_s)
  nlohmann::json to_json() const;
};
TrainEstimate estimate_training(const ZayaConfig& c, const HardwareProfile& hw,
                                const TrainSetup& s);

struct InferenceEstimate {
  int64_t prompt = 0, batch = 1, context = 0;
  double prefill_s = 0, prefill_tokens_per_s = 0;
  double decode_s_per_token = 0;  // one decode step of the whole batch
  double decode_bytes = 0, decode_flops = 0;
  double decode_experts_touched = 0;  // per layer
  double decode_tokens_per_s = 0;     // batch / decode_s_per_token
  nlohmann::json to_json() const;
};
// Prefill of `batch` prompts of `prompt` tokens, and one decode step of `batch` sequences with
// `context` tokens already cached.
InferenceEstimate estimate_inference(const ZayaConfig& c, const HardwareProfile& hw, int64_t prompt,
                                     int64_t context, int64_t batch);

}  // namespace zaya::sizing
