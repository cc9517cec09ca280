// The model optimizer of optim/optimizer.h (AdamW + Muon, ZAYA1.md §4) with its state in device
// memory, updating a CudaModel's fp32 masters in place from their fp32 gradients and writing the
// bf16 copies as it goes. It is the GPU twin of zaya::Optimizer: the same OptimizerSettings, the
// same parameter rules (optim/param_rules.h: AdamW, Muon or frozen per name, lr multiplier, weight
// decay), the same state tensor names (optim.adamw.exp_avg.<p>, optim.adamw.exp_avg_sq.<p>,
// optim.muon.momentum.<p>) and the same step count, so a checkpoint written by either path resumes
// on the other.
//
// Muon per matrix [rows, cols] (a 3-D expert tensor [E, out, in] is E matrices): momentum and the
// Nesterov update (muon_momentum), Frobenius normalisation (sum of squares in fp64, one host
// round trip per parameter), then the quintic Newton–Schulz iteration of optim/newton_schulz.h
// with the same coefficients and step count on cuBLASLt GEMMs (bf16 operands with fp32
// accumulation by default, or full fp32), working on the Gram matrix of the smaller side exactly
// as the CPU reference does (for rows > cols it iterates X ← aX + X·(b·XᵀX + c·(XᵀX)²), which is
// the reference's transpose–iterate–transpose without the transposes), and finally w ← w·(1 −
// lr·wd) − lr·rms_scale·√max(rows, cols)·O (apply_update).
//
// Deliberately not here: gradient accumulation and the forward/backward (CudaModel), the
// learning-rate schedule (the caller passes lr), the balancing-bias update (optim/balancing.h, on
// the host), the ZeRO-1 collectives and ownership plan (dist/, engine/data_parallel_step.h; this
// class only keeps the state of the owned subset it is given, whole tensors or dim-0 slices).
// Gradient clipping is folded into step(): the caller computes the global norm with grad_sq_norm()
// and passes the clip factor as grad_scale, which every kernel applies as it reads a gradient (no
// extra pass over the grads).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm/gemm.h"
#include "core/tensor.h"
#include "engine/cuda/model_cuda.h"
#include "optim/optimizer.h"

namespace zaya::cuda {

struct CudaOptimizerOptions {
  // Newton–Schulz GEMM precision: bf16 operands (fp32 accumulation; what Muon implementations use
  // in practice and about 15× faster than fp32 on Hopper) or fp32 (no TF32; matches the CPU
  // reference to fp32 rounding, for tests).
  bool ns_bf16 = true;
  // ZeRO-1: the parameters (indices into `params`) whose moments or momentum this optimizer keeps
  // and may update; empty means all. The others get no state and no Muon scratch, so a rank's
  // optimizer memory follows what it owns; step() with a mask outside this set is an error.
  std::vector<bool> owned_state;
  // With owned_state, per parameter: the dim-0 slice [first, first + count) that this optimizer
  // keeps and updates (rows of an AdamW tensor, experts of a 3-D Muon stack: contiguous, so the
  // kernels run on a sub-range of the master, copy and gradient); its state tensors are then of
  // shape [count, ...] under the parameter's name. count < 0, or an empty list: the whole tensor.
  // A 2-D Muon matrix is never sliced (Newton–Schulz needs it whole).
  std::vector<std::pair<int64_t, int64_t>> owned_slices;
};

// Milliseconds spent in the last step(), by part (measured with CUDA events on the stream).
struct OptimizerStepTimes {
  double adamw = 0, muon_elementwise = 0, newton_schulz = 0, total = 0;
};

class CudaOptimizer {
 public:
  // `params` are the model's device parameters (CudaModel::params(), in named_tensors() order); the
  // optimizer keeps pointers into them, so they must outlive it. Balancing biases are skipped.
  // Throws zaya::Error for invalid settings, a duplicate name, a missing gradient, or a Muon
  // assignment to a tensor that is not 2-D or 3-D (the CPU Optimizer's rules and messages).
  // Allocates the states (zeroed) and its scratch once, on `stream`'s device.
  CudaOptimizer(std::vector<DeviceParam>& params, OptimizerSettings settings, GemmContext& gemm,
                cudaStream_t stream, CudaOptimizerOptions options = {});
  ~CudaOptimizer();
  CudaOptimizer(const CudaOptimizer&) = delete;
  CudaOptimizer& operator=(const CudaOptimizer&) = delete;

  // Σ g² over every gradient of `params` (frozen parameters included, as grad_sq_norm does on the
  // host), in fp64: one deterministic sumsq per tensor, then a fixed-order sum on the host.
  // Synchronises the stream.
  double grad_sq_norm();
  // The same over the parameters p with owned[p] (indices into `params`; all when empty); over
  // just its slice for a parameter of options.owned_slices.
  double grad_sq_norm(const std::vector<bool>& owned);

  // One update of every trained parameter with learning rate lr·lr_mult; gradients are read as
  // g·grad_scale (pass the clip factor max_norm/(norm+1e-6), or 1). Writes the masters and their
  // bf16 copies. Muon parameters' gradient buffers are left intact. Synchronises once per Muon
  // parameter (to read its Frobenius norms) and at the end.
  void step(double lr, float grad_scale = 1.0f);
  // The same update restricted to the parameters p with owned[p] (indices into `params`; all when
  // empty); the step count advances as in step().
  void step(double lr, float grad_scale, const std::vector<bool>& owned);
  int64_t steps() const;

  const OptimizerSettings& settings() const;
  // The CPU Optimizer's table: parameter, shape, optimizer, lr multiplier, weight decay, rule.
  std::string describe() const;
  const OptimizerStepTimes& last_times() const;
  size_t state_bytes() const;  // device bytes of optimizer state and scratch

  // Host copies of the state (fp32 tensors), in the CPU Optimizer's order and names (only the
  // parameters in options.owned_state when it is set; load_state expects exactly those).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // The same tensors as read-only views of the device buffers (no copy; valid until the next
  // step or the optimizer's end), after the stream is synchronised: what a checkpoint snapshots.
  std::vector<std::pair<std::string, Tensor>> state_views() const;
  // Uploads a saved state (every expected tensor present with its shape; unknown names are errors;
  // validated before anything is copied) and sets the step count.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zaya::cuda
