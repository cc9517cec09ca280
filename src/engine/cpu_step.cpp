// CpuStep: TrainStep on the CPU reference backend (model/backward.h's forward_backward, the fp32
// Optimizer, the host balancing update). The model's tensors are re-homed into one flat fp32
// master buffer, and the gradients live in one flat buffer with the same layout, so a
// data-parallel wrapper can reduce or gather them as one span; every tensor starts on a 64-byte
// boundary, as a tensor of its own would. Training writes the model's tensors in place.
#include "engine/cpu_step.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "dist/comm.h"
#include "optim/grad_utils.h"
#include "optim/param_rules.h"

namespace zaya {

namespace {

constexpr int64_t kAlignFloats = 16;  // 64 bytes

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

class CpuStep final : public TrainStep {
 public:
  CpuStep(ZayaModel& model, const OptimizerSettings& optim, const BalancingSettings& balancing,
          const TrainStepOptions& options)
      : model_(model), owned_state_(options.owned_state), slices_(options.owned_slices) {
    auto slots = model.tensor_slots();
    std::vector<std::pair<std::string, int64_t>> sizes;
    for (auto& [name, t] : slots) sizes.emplace_back(name, t->numel());
    check_flat_layout(sizes, options.flat_offsets, options.flat_numel);
    int64_t total = 0;
    for (size_t i = 0; i < slots.size(); i++) {
      auto& [name, t] = slots[i];
      ParamSlot s;
      s.name = name;
      s.shape = t->shape();
      s.numel = t->numel();
      s.offset = options.flat_offsets.empty() ? total : options.flat_offsets[i];
      s.has_grad = !is_balancing_bias(name);
      layout_.push_back(s);
      total += round_up(s.numel, kAlignFloats);
    }
    if (!options.flat_offsets.empty()) total = options.flat_numel;
    master_ = Tensor::zeros({std::max<int64_t>(total, 1)});
    grad_ = Tensor::zeros({std::max<int64_t>(total, 1)});
    for (size_t i = 0; i < slots.size(); i++) {
      const ParamSlot& s = layout_[i];
      Tensor& t = *slots[i].second;
      Tensor home = view_at(master_, s);
      home.copy_from(t);  // widens bf16 or memory-mapped weights into owned fp32
      t = home;
      grads_.tensors.emplace_back(s.name, view_at(grad_, s));
    }
    for (size_t i = 0; i < slots.size(); i++)
      params_.push_back({layout_[i].name, *slots[i].second, grads_.tensors[i].second});
    ZAYA_CHECK(owned_state_.empty() || owned_state_.size() == params_.size(),
               "train step: the state ownership mask has {} entries for {} parameters",
               owned_state_.size(), params_.size());
    ZAYA_CHECK(slices_.empty() || slices_.size() == params_.size(),
               "train step: the owned-slices list has {} entries for {} parameters", slices_.size(),
               params_.size());
    opt_ =
        std::make_unique<Optimizer>(owned_state_.empty() ? params_ : subset(owned_state_), optim);
    balance_ = std::make_unique<BalancingBiasUpdater>(
        BalancingBiasUpdater::from_params(params_, balancing));
  }

  std::string name() const override { return "cpu"; }
  size_t device_bytes() const override { return 0; }
  bool reports_mfu() const override { return false; }
  const std::vector<ParamSlot>& layout() const override { return layout_; }

  void zero_grads() override { grad_.fill(0.0f); }  // the gaps too (collectives write them)

  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                             float loss_scale) override {
    return zaya::forward_backward(model_, ids, targets, B, S, grads_, loss_scale,
                                  cp_.comm ? &cp_ : nullptr, ready_ ? &ready_ : nullptr);
  }
  void set_grads_ready(LayerGradsReady fn) override { ready_ = std::move(fn); }
  void set_context_parallel(Communicator* cp) override {
    cp_.comm = cp && cp->size() > 1 ? cp : nullptr;
  }

  double grad_sq_norm(const ParamMask& owned) override {
    return zaya::grad_sq_norm(owned.empty() ? params_ : subset(owned));
  }

  void optimizer_step(double lr, float grad_scale, const ParamMask& owned) override {
    // The CPU optimizer reads the gradients as they are: apply the clip factor to them first.
    const ParamMask& scaled = owned.empty() ? owned_state_ : owned;
    if (grad_scale != 1.0f) scale_grads(scaled.empty() ? params_ : subset(scaled), grad_scale);
    if (owned.empty() || !owned_state_.empty()) {
      ZAYA_CHECK(owned.empty() || owned == owned_state_,
                 "train step: optimizer_step's mask differs from the parameters whose state this "
                 "step keeps");
      opt_->step(lr);
    } else {
      opt_->step(lr, owned);
    }
  }
  int64_t optimizer_steps() const override { return opt_->steps(); }
  int64_t muon_matrices_last_step() const override { return opt_->muon_matrices_last_step(); }

  void update_balancing(const std::vector<std::vector<int64_t>>& counts) override {
    balance_->update(counts);
  }
  int64_t balancing_steps() const override { return balance_->steps(); }

  FlatBuffer grads() override { return {grad_.f32(), grad_.numel(), Device::CPU}; }
  FlatBuffer masters() override { return {master_.f32(), master_.numel(), Device::CPU}; }
  void weights_changed() override {}  // the model computes from the masters themselves

  void eval_loss(const std::vector<int32_t>& rows, int64_t B, int64_t S1, LossSum& acc) override {
    // One row at a time: each row's S1 − 1 predictions weigh the same in the mean.
    for (int64_t r = 0; r < B; r++) {
      std::vector<int32_t> row(rows.begin() + r * S1, rows.begin() + (r + 1) * S1);
      acc.add(model_.loss(row, 1, S1), S1 - 1);
    }
  }

  void set_rope(const RopeSettings& hybrid, const RopeSettings& sliding) override {
    model_.cfg.rope_hybrid = hybrid;
    model_.cfg.rope_sliding = sliding;
  }

  void export_weights(ZayaModel& host) override {
    if (&host == &model_) return;
    auto dst = host.tensor_slots();
    ZAYA_CHECK(dst.size() == layout_.size(), "export_weights: the model has {} tensors, not {}",
               dst.size(), layout_.size());
    for (size_t i = 0; i < dst.size(); i++) dst[i].second->copy_from(view_at(master_, layout_[i]));
  }

  std::vector<std::pair<std::string, Tensor>> state() override {
    return join_step_state(opt_->state_tensors(), balance_->state_tensors());
  }

  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t opt_steps,
                  int64_t balancing_steps) override {
    auto [ost, bst] = split_step_state(state);
    opt_->load_state(ost, opt_steps);
    balance_->load_state(bst, balancing_steps);
  }

 private:
  static Tensor view_at(const Tensor& flat, const ParamSlot& s) {
    return Tensor::from_storage(flat.storage(), size_t(s.offset) * sizeof(float), s.shape,
                                DType::F32);
  }

  std::vector<ParamRef> subset(const ParamMask& owned) const {
    ZAYA_CHECK(owned.size() == params_.size(),
               "train step: the ownership mask has {} entries for {} parameters", owned.size(),
               params_.size());
    std::vector<ParamRef> out;
    for (size_t i = 0; i < params_.size(); i++) {
      if (!owned[i]) continue;
      const ParamRef& p = params_[i];
      if (slices_.empty() || slices_[i].second < 0) {
        out.push_back(p);
        continue;
      }
      // A dim-0 slice (experts of a 3-D tensor, rows of a 2-D one): contiguous, so the optimizer
      // updates it in place; its state is [count, ...] under the tensor's name.
      const auto [first, count] = slices_[i];
      ZAYA_CHECK(p.value.dim() >= 1 && count > 0 && first + count <= p.value.shape()[0],
                 "train step: slice [{}, {}) of '{}' (shape {})", first, first + count, p.name,
                 shape_str(p.value.shape()));
      out.push_back(
          {p.name, p.value.slice(0, first, first + count), p.grad.slice(0, first, first + count)});
    }
    return out;
  }

  ZayaModel& model_;
  ContextParallel cp_;  // comm null: whole rows
  LayerGradsReady ready_;
  ParamMask owned_state_;
  std::vector<std::pair<int64_t, int64_t>> slices_;
  std::vector<ParamSlot> layout_;
  Tensor master_, grad_;
  ModelGrads grads_;
  std::vector<ParamRef> params_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<BalancingBiasUpdater> balance_;
};

}  // namespace

std::unique_ptr<TrainStep> make_cpu_step(ZayaModel& model, const OptimizerSettings& optim,
                                         const BalancingSettings& balancing,
                                         const TrainStepOptions& options) {
  return std::make_unique<CpuStep>(model, optim, balancing, options);
}

}  // namespace zaya
