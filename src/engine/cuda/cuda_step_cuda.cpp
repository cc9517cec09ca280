// TrainStep on one CUDA device: a CudaModel (weights, gradients, activations) and a CudaOptimizer
// (AdamW + Muon state); see engine/train_step.h and engine/cuda/cuda_step.h.
#include <cuda_runtime.h>

#include <functional>

#include "core/cuda_check.h"
#include "core/error.h"
#include "dist/comm.h"
#include "engine/cuda/cuda_step.h"
#include "engine/cuda/model_cuda.h"
#include "engine/cuda/optim_cuda.h"
#include "optim/param_rules.h"

namespace zaya {

namespace {

class CudaStep final : public TrainStep {
 public:
  CudaStep(ZayaModel& host, const OptimizerSettings& settings, const BalancingSettings& balancing,
           const TrainStepOptions& o)
      : host_(host), opt_(o), settings_(settings) {
    check_cuda_step_available(o.device_index);
    ZAYA_CUDA_CHECK(cudaSetDevice(o.device_index));
    cudaDeviceProp prop{};
    ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device_index));
    name_ = fmt::format("cuda:{} ({})", o.device_index, prop.name);
    build(host);
    // The host keeps the balancing biases (updated there from the routed counts, then uploaded):
    // owned fp32 copies, whatever the checkpoint's dtype.
    std::vector<ParamRef> biases;
    for (auto& [name, t] : host.tensor_slots())
      if (is_balancing_bias(name)) {
        *t = t->to(DType::F32);
        biases.push_back({name, *t, Tensor()});
      }
    balance_ = std::make_unique<BalancingBiasUpdater>(
        BalancingBiasUpdater::from_params(biases, balancing));
  }

  std::string name() const override { return name_; }

  size_t device_bytes() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b - free_b;
  }

  bool reports_mfu() const override { return true; }
  const std::vector<ParamSlot>& layout() const override { return layout_; }

  void zero_grads() override { model_->zero_grads(); }

  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                             float loss_scale) override {
    return model_->forward_backward(ids, targets, B, S, loss_scale, ready_ ? &ready_ : nullptr,
                                    cp_.comm ? &cp_ : nullptr, needed_ ? &needed_ : nullptr);
  }
  void set_grads_ready(LayerGradsReady fn) override { ready_ = std::move(fn); }
  bool set_weights_needed(LayerWeightsNeeded fn) override {
    needed_ = std::move(fn);
    return true;
  }
  void layer_weights_changed(int64_t layer, const ParamMask& current) override {
    model_->refresh_copies(layer, current.empty() ? nullptr : &current);
  }
  void set_context_parallel(Communicator* cp) override {
    cp_.comm = cp && cp->size() > 1 ? cp : nullptr;
  }
  void* stream() const override { return model_->stream(); }

  double grad_sq_norm(const ParamMask& owned) override { return optim_->grad_sq_norm(owned); }

  void optimizer_step(double lr, float grad_scale, const ParamMask& owned) override {
    optim_->step(lr, grad_scale, owned);
  }
  int64_t optimizer_steps() const override { return optim_->steps(); }

  void update_balancing(const std::vector<std::vector<int64_t>>& counts) override {
    balance_->update(counts);
    upload_balancing_biases();
  }
  int64_t balancing_steps() const override { return balance_->steps(); }

  FlatBuffer grads() override { return {model_->grad_base(), flat_numel_, Device::CUDA}; }
  FlatBuffer masters() override { return {model_->master_base(), flat_numel_, Device::CUDA}; }
  void weights_changed() override { model_->refresh_copies(); }
  void sync() override { ZAYA_CUDA_CHECK(cudaStreamSynchronize(model_->stream())); }

  void eval_loss(const std::vector<int32_t>& rows, int64_t B, int64_t S1, LossSum& acc) override {
    if (!cp_.comm) {
      // Every row has S1 − 1 predictions, so the batch mean weighs them as the CPU's row loop does.
      acc.add(model_->loss(rows, B, S1), B * (S1 - 1));
      return;
    }
    // Context parallelism: the first S1 − 1 tokens of each row against the next ones, split as in
    // training (S1 − 1 is the phase's seq_len); this rank's share of the sum and count.
    const int64_t S = S1 - 1;
    std::vector<int32_t> ids(size_t(B * S)), targets(size_t(B * S));
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < S; t++) {
        ids[size_t(b * S + t)] = rows[size_t(b * S1 + t)];
        targets[size_t(b * S + t)] = rows[size_t(b * S1 + t + 1)];
      }
    const auto [sum, count] = model_->loss_sum(ids.data(), targets.data(), B, S, &cp_);
    acc.total += sum;
    acc.count += count;
  }
  bool eval_splits_context() const override { return cp_.comm != nullptr; }

  void set_rope(const RopeSettings& hybrid, const RopeSettings& sliding) override {
    const ZayaConfig& c = model_->cfg();
    if (c.rope_hybrid.theta == hybrid.theta && c.rope_sliding.theta == sliding.theta &&
        c.rope_hybrid.partial_rotary_factor == hybrid.partial_rotary_factor &&
        c.rope_sliding.partial_rotary_factor == sliding.partial_rotary_factor) {
      host_.cfg.rope_hybrid = hybrid;
      host_.cfg.rope_sliding = sliding;
      return;
    }
    rebuild([&] {
      host_.cfg.rope_hybrid = hybrid;
      host_.cfg.rope_sliding = sliding;
    });
  }

  void set_recompute(bool on) override {
    if (on == opt_.recompute) return;
    rebuild([&] { opt_.recompute = on; });
  }

  void export_weights(ZayaModel& host) override {
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
    model_->download(host);
  }

  // Checkpoints snapshot the optimizer state where it lives: views of the device buffers, which
  // the staging copy reads (device-to-device into a GPU ring, or into page-locked memory).
  std::vector<NamedState> owned_state() override {
    return whole_tensors(join_step_state(optim_->state_views(), balance_->state_tensors()));
  }
  std::vector<std::pair<std::string, Tensor>> state() override {
    return join_step_state(optim_->state_tensors(), balance_->state_tensors());
  }

  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t opt_steps,
                  int64_t balancing_steps) override {
    auto [ost, bst] = split_step_state(state);
    optim_->load_state(ost, opt_steps);
    balance_->load_state(bst, balancing_steps);
  }

 private:
  // CudaModel takes its configuration (RoPE, recomputation) at construction: rebuild it around
  // the same weights and optimizer state, with `change` applied in between (a phase change
  // happens a few times per run, so the round trip is cheap next to the phase itself).
  // download() expects the device model's configuration: copy with the old RoPE settings first.
  void rebuild(const std::function<void()>& change) {
    const ZayaConfig& c = model_->cfg();
    auto state = optim_->state_tensors();
    const int64_t steps = optim_->steps();
    host_.cfg.rope_hybrid = c.rope_hybrid;
    host_.cfg.rope_sliding = c.rope_sliding;
    export_weights(host_);
    change();
    optim_.reset();
    model_.reset();
    build(host_);
    optim_->load_state(state, steps);
  }

  void build(const ZayaModel& host) {
    cuda::CudaModelOptions mo;
    mo.max_tokens = opt_.max_tokens;
    mo.max_seq = opt_.max_seq;
    mo.recompute = opt_.recompute;
    mo.device = opt_.device_index;
    mo.flat_offsets = opt_.flat_offsets;
    mo.flat_numel = opt_.flat_numel;
    model_ = std::make_unique<cuda::CudaModel>(host, mo);
    cuda::CudaOptimizerOptions oo;
    oo.ns_bf16 = opt_.ns_bf16;
    oo.owned_state = opt_.owned_state;  // layout order = params() order
    oo.owned_slices = opt_.owned_slices;
    optim_ = std::make_unique<cuda::CudaOptimizer>(model_->params(), settings_, model_->gemm(),
                                                   model_->stream(), oo);
    // The layout: offsets into the one master allocation (the gradients use the same offsets).
    auto& params = model_->params();
    const float* base = model_->master_base();
    layout_.clear();
    flat_numel_ = model_->flat_elems();
    for (const auto& p : params) {
      ParamSlot s;
      s.name = p.name;
      s.shape = p.shape;
      s.numel = p.numel;
      s.offset = int64_t(p.master - base);
      s.has_grad = p.grad != nullptr;
      ZAYA_ASSERT(!p.grad || p.grad - model_->grad_base() == s.offset);
      ZAYA_ASSERT(s.offset + s.numel <= flat_numel_);
      layout_.push_back(s);
    }
  }

  // Copies the host model's balancing biases to the device (after the host update).
  void upload_balancing_biases() {
    const auto named = host_.named_tensors();
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

  ZayaModel& host_;
  TrainStepOptions opt_;
  OptimizerSettings settings_;
  std::string name_;
  std::vector<ParamSlot> layout_;
  int64_t flat_numel_ = 0;
  std::unique_ptr<BalancingBiasUpdater> balance_;
  // Declared in this order so the optimizer (which points into the model's parameters) goes
  // first.
  std::unique_ptr<cuda::CudaModel> model_;
  std::unique_ptr<cuda::CudaOptimizer> optim_;
  LayerGradsReady ready_;      // set by a data-parallel step around the last micro-batch
  LayerWeightsNeeded needed_;  // set by a data-parallel step around the first one
  ContextParallel cp_;         // comm null: whole rows
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

std::unique_ptr<TrainStep> make_cuda_step(ZayaModel& host, const OptimizerSettings& optim,
                                          const BalancingSettings& balancing,
                                          const TrainStepOptions& options) {
  return std::make_unique<CudaStep>(host, optim, balancing, options);
}

}  // namespace zaya
