// DeviceStep on one CUDA device: a CudaModel (weights, gradients, activations) and a CudaOptimizer
// (AdamW + Muon state); see device_step.h.
#include <cuda_runtime.h>

#include "backend/cuda/model_cuda.h"
#include "backend/cuda/optim_cuda.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "optim/param_rules.h"
#include "train/device_step.h"

namespace zaya {

namespace {

class CudaStep final : public DeviceStep {
 public:
  CudaStep(const ZayaModel& host, const OptimizerSettings& settings, const DeviceStepOptions& o)
      : opt_(o), settings_(settings) {
    check_cuda_step_available(o.device);
    ZAYA_CUDA_CHECK(cudaSetDevice(o.device));
    cudaDeviceProp prop{};
    ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
    name_ = fmt::format("cuda:{} ({})", o.device, prop.name);
    build(host);
  }

  void zero_grads() override { model_->zero_grads(); }

  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                             float loss_scale) override {
    return model_->forward_backward(ids, targets, B, S, loss_scale);
  }

  double grad_sq_norm() override { return optim_->grad_sq_norm(); }

  void optimizer_step(double lr, float grad_scale) override { optim_->step(lr, grad_scale); }

  int64_t optimizer_steps() const override { return optim_->steps(); }

  double loss(const std::vector<int32_t>& ids, int64_t B, int64_t S) override {
    return model_->loss(ids, B, S);
  }

  void upload_balancing_biases(const ZayaModel& host) override {
    const auto named = host.named_tensors();
    auto& params = model_->params();
    ZAYA_ASSERT(named.size() == params.size());
    for (size_t i = 0; i < params.size(); i++) {
      if (!is_balancing_bias(params[i].name)) continue;
      ZAYA_ASSERT(named[i].first == params[i].name);
      const Tensor& t = named[i].second;
      ZAYA_CHECK(t.dtype() == DType::F32 && t.is_contiguous() && t.numel() == params[i].numel,
                 "{}: the host balancing biases must be contiguous fp32 [{}]", params[i].name,
                 params[i].numel);
      ZAYA_CUDA_CHECK(cudaMemcpyAsync(params[i].master, t.f32(), t.nbytes(), cudaMemcpyHostToDevice,
                                      model_->stream()));
    }
    // The host tensors are pageable and change on the next update: finish the copies now.
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  }

  void download(ZayaModel& host) override {
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
    model_->download(host);
  }

  void sync_config(ZayaModel& host) override {
    const ZayaConfig& c = model_->cfg();
    if (c.rope_hybrid.theta == host.cfg.rope_hybrid.theta &&
        c.rope_sliding.theta == host.cfg.rope_sliding.theta &&
        c.rope_hybrid.partial_rotary_factor == host.cfg.rope_hybrid.partial_rotary_factor &&
        c.rope_sliding.partial_rotary_factor == host.cfg.rope_sliding.partial_rotary_factor)
      return;
    // CudaModel takes its configuration at construction: rebuild it around the same weights and
    // optimizer state (a phase change happens a few times per run, so the round trip is cheap
    // next to the phase itself).
    auto state = optim_->state_tensors();
    const int64_t steps = optim_->steps();
    // download() expects the device model's configuration: hand it the old RoPE settings for the
    // copy and put the new ones back afterwards.
    const ZayaConfig wanted = host.cfg;
    host.cfg.rope_hybrid = c.rope_hybrid;
    host.cfg.rope_sliding = c.rope_sliding;
    download(host);
    host.cfg = wanted;
    optim_.reset();
    model_.reset();
    build(host);
    optim_->load_state(state, steps);
  }

  std::vector<std::pair<std::string, Tensor>> optimizer_state() override {
    return optim_->state_tensors();
  }

  void load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& state,
                            int64_t steps) override {
    optim_->load_state(state, steps);
  }

  std::string name() const override { return name_; }

  size_t device_bytes() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b - free_b;
  }

 private:
  void build(const ZayaModel& host) {
    cuda::CudaModelOptions mo;
    mo.max_tokens = opt_.max_tokens;
    mo.max_seq = opt_.max_seq;
    mo.recompute = opt_.recompute;
    mo.device = opt_.device;
    model_ = std::make_unique<cuda::CudaModel>(host, mo);
    cuda::CudaOptimizerOptions oo;
    oo.ns_bf16 = opt_.ns_bf16;
    optim_ = std::make_unique<cuda::CudaOptimizer>(model_->params(), settings_, model_->gemm(),
                                                   model_->stream(), oo);
  }

  DeviceStepOptions opt_;
  OptimizerSettings settings_;
  std::string name_;
  // Declared in this order so the optimizer (which points into the model's parameters) goes
  // first.
  std::unique_ptr<cuda::CudaModel> model_;
  std::unique_ptr<cuda::CudaOptimizer> optim_;
};

}  // namespace

void check_cuda_step_available(int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  ZAYA_CHECK(e == cudaSuccess && n > 0, "train.device = \"cuda\": no CUDA device ({})",
             e == cudaSuccess ? std::string("none found") : std::string(cudaGetErrorString(e)));
  ZAYA_CHECK(device >= 0 && device < n, "train.device: CUDA device {} does not exist ({} found)",
             device, n);
}

std::unique_ptr<DeviceStep> make_cuda_step(const ZayaModel& host, const OptimizerSettings& settings,
                                           const DeviceStepOptions& options) {
  return std::make_unique<CudaStep>(host, settings, options);
}

}  // namespace zaya
