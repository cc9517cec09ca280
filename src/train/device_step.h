// The training loop's view of a GPU: the micro-batch forward/backward, the global gradient norm
// and the optimizer step, run on a device with the weights, gradients and optimizer state resident
// there, behind an interface that needs no CUDA header, so train/trainer.cpp compiles the same with
// and without the CUDA backend. The CUDA implementation (device_step_cuda.cpp) is a CudaModel plus
// a CudaOptimizer; a build without CUDA gets a factory that explains itself.
//
// The host ZayaModel stays the loop's model of record for everything that is not a step: its
// balancing biases are updated on the host (optim/balancing.h) and uploaded, checkpoints download
// the masters into it, and the RoPE theta of a phase is set in its config. Deliberately not here:
// data, schedules, the NaN guard, metrics (the loop's), and data parallelism.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/backward.h"
#include "model/zaya.h"
#include "optim/optimizer.h"

namespace zaya {

struct DeviceStepOptions {
  int64_t max_tokens = 0;  // largest B·S of a micro-batch or of an evaluation batch
  int64_t max_seq = 0;     // longest sequence
  bool recompute = false;  // activation recomputation in backward
  bool ns_bf16 = true;     // Muon's Newton–Schulz GEMMs in bf16 (else fp32)
  int device = 0;
};

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;

  virtual void zero_grads() = 0;
  // Accumulates loss_scale · d(mean loss)/d(param) into the device gradients (forward_backward's
  // contract); returns the loss, the counted tokens and the routed counts.
  virtual StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B,
                                     int64_t S, float loss_scale) = 0;
  virtual double grad_sq_norm() = 0;
  // One optimizer update with gradients read as g·grad_scale (the clip factor).
  virtual void optimizer_step(double lr, float grad_scale) = 0;
  virtual int64_t optimizer_steps() const = 0;
  // Mean next-token loss over ids [B,S], no gradients.
  virtual double loss(const std::vector<int32_t>& ids, int64_t B, int64_t S) = 0;

  // Copies the host model's balancing biases to the device (after the host update).
  virtual void upload_balancing_biases(const ZayaModel& host) = 0;
  // Copies the device masters into the host model's tensors.
  virtual void download(ZayaModel& host) = 0;
  // Makes the device model use host.cfg's RoPE settings (a phase changed theta): the device
  // weights and optimizer state are kept, by a round trip through the host when needed.
  virtual void sync_config(ZayaModel& host) = 0;

  // Host copies of the optimizer state, with the CPU Optimizer's names.
  virtual std::vector<std::pair<std::string, Tensor>> optimizer_state() = 0;
  virtual void load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& state,
                                    int64_t steps) = 0;

  virtual std::string name() const = 0;     // "cuda:0 (NVIDIA H200)"
  virtual size_t device_bytes() const = 0;  // model arena + optimizer state
};

// Throws zaya::Error unless CUDA device `device` can train: the build has the CUDA backend and the
// machine has the device. The loop calls it first, before any data or model work.
void check_cuda_step_available(int device = 0);

// The CUDA step over `host` (its weights are uploaded). Throws zaya::Error "built without CUDA"
// in a build without the CUDA backend, and for a machine without a device.
std::unique_ptr<DeviceStep> make_cuda_step(const ZayaModel& host, const OptimizerSettings& settings,
                                           const DeviceStepOptions& options);

}  // namespace zaya
