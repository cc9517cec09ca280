// DataParallelStep (data_parallel_step.h): ZeRO-1 around an inner TrainStep.
#include "engine/data_parallel_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "optim/param_rules.h"
#include "sizing/zero1_layout.h"

namespace zaya {

std::vector<Zero1Item> zero1_items(ZayaModel& model, const OptimizerSettings& optim) {
  std::vector<std::pair<std::string, Shape>> tensors;
  for (auto& [name, t] : model.tensor_slots()) tensors.emplace_back(name, t->shape());
  return zero1_items(tensors, optim);
}

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class DpStep final : public DataParallelStep {
 public:
  DpStep(std::unique_ptr<TrainStep> inner, std::vector<Zero1Item> items, Zero1Plan plan,
         Communicator& comm, Communicator& host, bool overlap)
      : inner_(std::move(inner)),
        items_(std::move(items)),
        plan_(std::move(plan)),
        comm_(comm),
        host_(host),
        rank_(comm.rank()),
        overlap_(overlap) {
    const auto& lay = inner_->layout();
    ZAYA_CHECK(lay.size() == items_.size(), "data parallel: the step has {} tensors, not {}",
               lay.size(), items_.size());
    for (size_t i = 0; i < lay.size(); i++) {
      ZAYA_CHECK(lay[i].name == items_[i].name && lay[i].numel == items_[i].numel,
                 "data parallel: tensor {} of the step is '{}' ({} elements), expected '{}' ({})",
                 i, lay[i].name, lay[i].numel, items_[i].name, items_[i].numel);
      ZAYA_CHECK(lay[i].has_grad == (items_[i].kind != OwnedKind::NoGrad),
                 "data parallel: '{}' has_grad disagrees with its optimizer assignment",
                 lay[i].name);
      // The collectives run in place on the step's buffers: they must be in the plan's layout.
      ZAYA_CHECK(lay[i].offset == plan_.offset[i],
                 "data parallel: the step put '{}' at flat offset {}, the plan at {}", lay[i].name,
                 lay[i].offset, plan_.offset[i]);
    }
    mask_ = plan_.mask(rank_);
    // The tensors whose compute copies this rank's update writes in full:
    // the gated forward refreshes only the others from the gathered masters.
    current_.assign(items_.size(), false);
    for (size_t i = 0; i < items_.size(); i++)
      current_[i] = plan_.part(items_, i, rank_).second == items_[i].numel;
    const FlatBuffer g = inner_->grads();
    flat_floats_ = g.numel;
    ZAYA_CHECK(flat_floats_ == plan_.flat_numel,
               "data parallel: the step's flat buffers hold {} elements, the plan's {}",
               flat_floats_, plan_.flat_numel);
    const bool step_on_device = g.device == Device::CUDA;
    ZAYA_CHECK(step_on_device || !comm_.buffer_on_device(),
               "data parallel: the {} communicator works on GPU buffers but the step is on the CPU",
               comm_.backend());
    device_work_ = step_on_device && comm_.buffer_on_device();
    mirror_ = step_on_device && !comm_.buffer_on_device();
    if (mirror_) {
      host_g_ = static_cast<float*>(alloc_pinned_host(size_t(flat_floats_) * sizeof(float)));
      host_m_ = static_cast<float*>(alloc_pinned_host(size_t(flat_floats_) * sizeof(float)));
    }
    plan_buckets();
    for (const ParamSlot& sl : lay) layers_ = std::max(layers_, layer_of_param(sl.name) + 1);
    // The all-gather overlaps the next forward where the collectives run on the GPU beside the
    // step and the step tells when it needs each layer.
    gather_overlap_ = device_work_ && overlap_ && inner_->set_weights_needed({});
  }
  ~DpStep() override {
    if (pending_) comm_.synchronize();  // nothing may still write into the step's buffers
    free_pinned_host(host_g_);
    free_pinned_host(host_m_);
  }

  const Zero1Plan& plan() const override { return plan_; }
  const std::vector<Zero1Item>& items() const override { return items_; }
  int64_t reduce_scatters() const override { return reduce_scatters_; }
  const DataParallelTimes& last_times() const override { return times_; }
  DataParallelMemory memory() const override {
    DataParallelMemory m;
    m.masters = m.grads = flat_floats_ * int64_t(sizeof(float));
    m.optimizer_state = plan_.state_floats[size_t(rank_)] * int64_t(sizeof(float));
    m.padding = plan_.padding(items_) * int64_t(sizeof(float));
    m.staging = mirror_ ? 2 * m.masters : 0;
    return m;
  }

  std::string name() const override {
    return fmt::format("{} (rank {} of {}, ZeRO-1 over {}{})", inner_->name(), rank_, plan_.world,
                       comm_.backend(), mirror_ ? ", host-staged" : "");
  }
  size_t device_bytes() const override { return inner_->device_bytes(); }
  bool reports_mfu() const override { return inner_->reports_mfu(); }
  const std::vector<ParamSlot>& layout() const override { return inner_->layout(); }

  void zero_grads() override {
    reduced_ = false;
    issued_ = 0;
    in_backward_ = 0;
    hook_ms_ = 0;
    micro_total_ = micro_seen_ = 0;
    inner_->zero_grads();
  }
  void begin_accumulation(int64_t micro_batches) override {
    micro_total_ = micro_batches;
    micro_seen_ = 0;
  }
  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                             float loss_scale) override {
    ZAYA_CHECK(issued_ == 0,
               "data parallel: a forward_backward after the step's gradients started reducing "
               "(begin_accumulation announced {} micro-batches)",
               micro_total_);
    reduced_ = false;
    // Overlap: the last micro-batch's backward reduces buckets as its layers complete. Not on
    // the host-staged path, whose copies would wait for the GPU at every layer.
    const bool eager =
        overlap_ && !mirror_ && !device_cp_ && micro_total_ > 0 && micro_seen_ + 1 == micro_total_;
    micro_seen_++;
    // The first forward after an update reads each layer once its all-gather is done.
    const bool gated = pending_;
    struct Unhook {
      TrainStep& s;
      bool grads, weights;
      ~Unhook() {
        if (grads) s.set_grads_ready({});
        if (weights) s.set_weights_needed({});
      }
    } unhook{*inner_, eager, gated};
    if (eager) inner_->set_grads_ready([this](int64_t layer) { layer_ready(layer); });
    if (gated) inner_->set_weights_needed([this](int64_t layer) { weights_needed(layer); });
    const StepStats stats = inner_->forward_backward(ids, targets, B, S, loss_scale);
    finish_gather();  // nothing left once the forward asked for its last layer
    return stats;
  }
  // The ranks of a context-parallel group hold the same weights: ZeRO-1 runs over all of them
  // (this step's communicator), the inner step splits the sequences.
  // NCCL does not promise progress to two communicators' kernels running at once, so with a
  // context-parallel group on the GPU (its exchanges run inside the forward and the backward)
  // this step's collectives stay out of them: no overlap either way.
  void set_context_parallel(Communicator* cp) override {
    finish_gather();
    inner_->set_context_parallel(cp);
    device_cp_ = device_work_ && cp && cp->size() > 1 && cp->buffer_on_device();
  }

  double grad_sq_norm(const ParamMask& owned) override {
    ZAYA_CHECK(owned.empty(),
               "data parallel: grad_sq_norm takes no mask (ownership is the plan's)");
    reduce_grads();
    double sq = inner_->grad_sq_norm(mask_);
    host_.host_all_reduce(&sq, 1, RedOp::Sum);
    return sq;
  }

  void optimizer_step(double lr, float grad_scale, const ParamMask& owned) override {
    ZAYA_CHECK(owned.empty(),
               "data parallel: optimizer_step takes no mask (ownership is the plan's)");
    finish_gather();
    reduce_grads();
    const double t0 = now_ms();
    inner_->optimizer_step(lr, grad_scale, mask_);
    times_.update = now_ms() - t0;
    gather_weights();
  }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  int64_t muon_matrices_last_step() const override { return inner_->muon_matrices_last_step(); }
  void update_balancing(const std::vector<std::vector<int64_t>>& counts) override {
    finish_gather();
    inner_->update_balancing(counts);
  }
  int64_t balancing_steps() const override { return inner_->balancing_steps(); }

  // Whatever reads the weights outside the gated forward waits for the all-gather first.
  FlatBuffer grads() override { return inner_->grads(); }
  FlatBuffer masters() override {
    finish_gather();
    return inner_->masters();
  }
  void weights_changed() override {
    finish_gather();
    inner_->weights_changed();
  }
  void eval_loss(const std::vector<int32_t>& rows, int64_t B, int64_t S1, LossSum& acc) override {
    finish_gather();
    inner_->eval_loss(rows, B, S1, acc);
  }
  bool eval_splits_context() const override { return inner_->eval_splits_context(); }
  void set_rope(const RopeSettings& h, const RopeSettings& s) override {
    finish_gather();
    inner_->set_rope(h, s);
  }
  void set_recompute(bool on) override {
    finish_gather();
    inner_->set_recompute(on);
  }
  void export_weights(ZayaModel& host) override {
    finish_gather();
    inner_->export_weights(host);
  }

  std::vector<std::pair<std::string, Tensor>> state() override {
    finish_gather();
    auto [opt, bal] = split_step_state(inner_->state());
    std::map<std::string, Tensor> mine(opt.begin(), opt.end());
    NamedTensors out;
    for (size_t i = 0; i < items_.size(); i++) {
      const int owner = plan_.owner[i];
      for (const std::string& nm : state_names(items_[i])) {
        if (owner == Zero1Plan::kSplit) {  // dim-0 slices, assembled on rank 0 in rank order
          Tensor whole = rank_ == 0 ? Tensor::zeros(items_[i].shape) : Tensor();
          for (int r = 0; r < plan_.world; r++) {
            const auto [off, len] = plan_.part(items_, i, r);
            if (len == 0 || (r != rank_ && rank_ != 0)) continue;
            if (r == rank_) {
              auto it = mine.find(nm);
              ZAYA_CHECK(it != mine.end() && it->second.numel() == len,
                         "data parallel: rank {} owns {} elements of '{}' but has no such '{}'",
                         rank_, len, items_[i].name, nm);
              Tensor t = it->second.to(DType::F32);
              if (rank_ == 0)
                std::memcpy(whole.f32() + off, t.f32(), size_t(len) * sizeof(float));
              else
                host_.send(t.f32(), size_t(len), DType::F32, 0);
            } else {
              host_.recv(whole.f32() + off, size_t(len), DType::F32, r);
            }
          }
          if (rank_ == 0) out.emplace_back(nm, whole);
          continue;
        }
        if (rank_ == owner) {
          auto it = mine.find(nm);
          ZAYA_CHECK(it != mine.end(), "data parallel: rank {} owns '{}' but has no '{}'", rank_,
                     items_[i].name, nm);
          Tensor t = it->second.to(DType::F32);
          if (rank_ == 0)
            out.emplace_back(nm, t);
          else
            host_.send(t.f32(), size_t(t.numel()), DType::F32, 0);
        } else if (rank_ == 0) {
          Tensor t = Tensor::zeros(items_[i].shape);
          host_.recv(t.f32(), size_t(t.numel()), DType::F32, owner);
          out.emplace_back(nm, t);
        }
      }
    }
    if (rank_ != 0) return {};
    return join_step_state(std::move(out), bal);
  }

  void sync() override {
    finish_gather();
    inner_->sync();
  }
  void* stream() const override { return inner_->stream(); }

  // This rank's pieces: the state of the tensors it owns, whole or its dim-0 slice (the plan's
  // owned_state_pieces), and (rank 0 alone) the balancing moments every rank holds alike.
  // The inner step's pieces are its own (whole tensors, or the CPU step's slices under their
  // tensors' names; on the GPU views of device memory), placed here in the global tensors.
  std::vector<NamedState> owned_state() override {
    finish_gather();
    NamedTensors pieces;
    for (NamedState& s : inner_->owned_state())
      pieces.emplace_back(std::move(s.name), std::move(s.tensor));
    auto [opt, bal] = split_step_state(pieces);
    std::map<std::string, Tensor> mine(opt.begin(), opt.end());
    std::vector<NamedState> out;
    for (const OwnedStatePiece& p : owned_state_pieces(plan_, items_, rank_)) {
      auto it = mine.find(p.name);
      ZAYA_CHECK(it != mine.end(), "data parallel: rank {} owns (part of) '{}' but has no '{}'",
                 rank_, items_[p.item].name, p.name);
      Tensor t = it->second.dtype() == DType::F32 ? it->second : it->second.to(DType::F32);
      out.push_back({p.name, std::move(t), items_[p.item].shape, p.offset});
    }
    if (rank_ == 0)
      for (auto& piece : whole_tensors(bal)) out.push_back(std::move(piece));
    return out;
  }

  std::vector<int> weight_writers() const override { return zaya::weight_writers(plan_); }

  // Reads exactly the pieces this rank owns now, whatever world size wrote them.
  void load_state_from(const StateSource& source, int64_t opt_steps,
                       int64_t balancing_steps) override {
    finish_gather();
    NamedTensors mine;
    for (const OwnedStatePiece& p : owned_state_pieces(plan_, items_, rank_)) {
      ZAYA_CHECK(source.global_shape(p.name) == items_[p.item].shape,
                 "data parallel: the checkpoint's '{}' has shape {}, expected {}", p.name,
                 shape_str(source.global_shape(p.name)), shape_str(items_[p.item].shape));
      mine.emplace_back(p.name, source.read(p.name, p.offset, p.shape));
    }
    std::set<std::string> known;
    for (const Zero1Item& it : items_)
      for (std::string& nm : state_names(it)) known.insert(std::move(nm));
    for (const std::string& n : source.names()) {
      if (n.rfind("balance.", 0) == 0)
        mine.emplace_back(n, source.read_whole(n));
      else
        ZAYA_CHECK(known.count(n), "the checkpoint's state '{}' belongs to no tensor of this model",
                   n);
    }
    inner_->load_state(mine, opt_steps, balancing_steps);
  }

  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t opt_steps,
                  int64_t balancing_steps) override {
    finish_gather();
    std::map<std::string, OwnedStatePiece> owned;  // state name → this rank's box of it
    for (OwnedStatePiece& p : owned_state_pieces(plan_, items_, rank_))
      owned.emplace(p.name, std::move(p));
    NamedTensors mine;
    for (const auto& kv : state) {
      auto it = owned.find(kv.first);
      if (kv.first.rfind("balance.", 0) == 0 || (it != owned.end() && it->second.whole)) {
        mine.push_back(kv);
      } else if (it != owned.end()) {
        const OwnedStatePiece& p = it->second;
        ZAYA_CHECK(kv.second.shape() == items_[p.item].shape,
                   "data parallel: state '{}' has shape {}, expected {}", kv.first,
                   shape_str(kv.second.shape()), shape_str(items_[p.item].shape));
        mine.emplace_back(kv.first,
                          kv.second.slice(0, p.offset[0], p.offset[0] + p.shape[0]).clone());
      }
    }
    inner_->load_state(mine, opt_steps, balancing_steps);
  }

 private:
  // Per bucket the layer whose backward completes it (the lowest layer among its tensors; -1
  // when it holds the embedding, the input affine or the final norm, which the backward finishes
  // last). Buckets are issued in the order the backward completes them, the same on every rank
  // (the plan and the names are).
  void plan_buckets() {
    const int64_t nb = plan_.buckets();
    bucket_layer_.assign(size_t(nb), std::numeric_limits<int64_t>::max());
    for (int64_t k = 0; k < nb; k++)
      for (size_t i : plan_.bucket_list[size_t(k)].items)
        bucket_layer_[size_t(k)] =
            std::min(bucket_layer_[size_t(k)], layer_of_param(items_[i].name));
    order_.resize(size_t(nb));
    for (int64_t k = 0; k < nb; k++) order_[size_t(k)] = k;
    std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
      return bucket_layer_[size_t(a)] > bucket_layer_[size_t(b)];
    });
  }

  // This rank's range of bucket k in the flat buffers: {offset, elements} (0 elements: none).
  std::pair<int64_t, int64_t> own_range(int64_t k) const {
    const Zero1Bucket& b = plan_.bucket_list[size_t(k)];
    if (!b.rooted.empty()) return b.rooted[size_t(rank_)];
    return {b.start + int64_t(rank_) * b.chunk, b.chunk};
  }

  // Starts bucket k's reduction in place on `work` (the flat gradients): a reduce-scatter that
  // leaves this rank's sums in its own chunk, or (rooted) one reduce per slice to its owner.
  void issue_bucket(int64_t k, float* work) {
    const Zero1Bucket& b = plan_.bucket_list[size_t(k)];
    if (b.rooted.empty()) {
      float* base = work + b.start;
      comm_.reduce_scatter(base, base + int64_t(rank_) * b.chunk, size_t(b.chunk), DType::F32,
                           RedOp::Sum);
    } else {
      comm_.group_begin();
      for (int r = 0; r < plan_.world; r++) {
        const auto [off, n] = b.rooted[size_t(r)];
        if (n > 0) comm_.reduce(work + off, work + off, size_t(n), DType::F32, RedOp::Sum, r);
      }
      comm_.group_end();
    }
    reduce_scatters_++;
  }

  // The inner step's backward finished `layer` (LayerGradsReady): start every bucket it
  // completed. On the GPU the reads are ordered after the step's stream, not waited for.
  void layer_ready(int64_t layer) {
    if (issued_ == order_.size() || bucket_layer_[size_t(order_[issued_])] < layer) return;
    const double t0 = now_ms();
    float* work = inner_->grads().data;
    if (device_work_) comm_.after_stream(inner_->stream());
    while (issued_ < order_.size() && bucket_layer_[size_t(order_[issued_])] >= layer) {
      issue_bucket(order_[issued_++], work);
      if (layer >= 0) in_backward_++;
    }
    hook_ms_ += now_ms() - t0;
  }

  void reduce_grads() {
    if (reduced_) return;
    const double t0 = now_ms();
    const FlatBuffer g = inner_->grads();
    float* work = g.data;
    if (mirror_) {
      // The backward ran on the step's own stream, which the copy does not wait for.
      inner_->sync();
      copy_step_bytes(host_g_, g.data, size_t(g.numel) * sizeof(float));
      work = host_g_;
    } else if (device_work_) {
      comm_.after_stream(inner_->stream());  // the collectives read what the backward wrote
    }
    // The buckets the backward did not start (all of them without overlap).
    while (issued_ < order_.size()) issue_bucket(order_[issued_++], work);
    comm_.synchronize();  // before the step's stream reads the sums
    if (mirror_) {
      for (int64_t k = 0; k < plan_.buckets(); k++) {
        const auto [off, n] = own_range(k);
        if (n > 0) copy_step_bytes(g.data + off, work + off, size_t(n) * sizeof(float));
      }
      finish_step_copies();
    }
    reduced_ = true;
    times_.reduce_scatter = now_ms() - t0 + hook_ms_;
    times_.buckets_in_backward = in_backward_;
  }

  void gather_weights() {
    const double t0 = now_ms();
    const FlatBuffer m = inner_->masters();
    float* work = m.data;
    if (mirror_) {
      inner_->sync();  // the update ran on the step's own stream
      for (int64_t k = 0; k < plan_.buckets(); k++) {
        const auto [off, n] = own_range(k);
        if (n > 0) copy_step_bytes(host_m_ + off, m.data + off, size_t(n) * sizeof(float));
      }
      work = host_m_;
    } else if (device_work_) {
      comm_.after_stream(inner_->stream());  // the collectives read what the update wrote
    }
    issue_gathers(work);
    if (gather_overlap_ && !device_cp_) {
      pending_ = true;
      times_.all_gather = now_ms() - t0;  // issuing; the wait comes in the next forward
      return;
    }
    if (device_work_) comm_.synchronize();  // before the step's stream reads the masters
    if (mirror_) {
      for (const Zero1Bucket& b : plan_.bucket_list)
        copy_step_bytes(m.data + b.start, host_m_ + b.start,
                        size_t(b.elements(plan_.world)) * sizeof(float));
      finish_step_copies();
    }
    inner_->weights_changed();
    times_.all_gather = now_ms() - t0;
  }

  // Every bucket's all-gather in place on `work` (the masters; this rank's chunk holds its
  // update), or (rooted) one broadcast per slice from its owner, in the order the forward reads
  // them (a bucket's layer is the lowest of its tensors, so the buckets of layers <= l hold every
  // tensor of layer l), with a mark after each layer's.
  // MPI: all done on return. NCCL: all on the communicator's stream; with the overlap the next
  // forward's weights_needed(l) makes the step's stream wait for mark l and refreshes that
  // layer's bf16 copies, else gather_weights waits for the whole.
  void issue_gathers(float* work) {
    comm_.clear_marks();
    gate_mark_.assign(size_t(layers_ + 1), 0);
    size_t j = order_.size();  // order_ runs from the last layer down: walk it backwards
    for (int64_t l = -1; l < layers_; l++) {
      while (j > 0 && (bucket_layer_[size_t(order_[j - 1])] <= l || l + 1 == layers_)) {
        const Zero1Bucket& b = plan_.bucket_list[size_t(order_[--j])];
        if (b.rooted.empty()) {
          float* base = work + b.start;
          comm_.all_gather(base + int64_t(rank_) * b.chunk, base, size_t(b.chunk), DType::F32);
        } else {
          comm_.group_begin();
          for (int r = 0; r < plan_.world; r++) {
            const auto [off, n] = b.rooted[size_t(r)];
            if (n > 0) comm_.broadcast(work + off, work + off, size_t(n), DType::F32, r);
          }
          comm_.group_end();
        }
      }
      gate_mark_[size_t(l + 1)] = comm_.mark();
    }
  }

  // LayerWeightsNeeded of the gated forward: layer l's weights are complete after mark l.
  void weights_needed(int64_t layer) {
    if (!pending_) return;
    ZAYA_CHECK(layer >= -1 && layer < layers_,
               "data parallel: the forward asked for layer {} of {}", layer, layers_);
    comm_.stream_wait(inner_->stream(), gate_mark_[size_t(layer + 1)]);
    inner_->layer_weights_changed(layer, current_);
    if (layer + 1 == layers_) {
      // Every wait is enqueued: the host waits for the gather here, in the collective section,
      // so a peer that never joins ends in the watchdog rather than in the forward's last sync.
      const double t0 = now_ms();
      comm_.synchronize();
      pending_ = false;
      times_.all_gather_wait = now_ms() - t0;
    }
  }

  // The all-gather in full, for any reader of the weights outside the gated forward.
  void finish_gather() {
    if (!pending_) return;
    const double t0 = now_ms();
    comm_.synchronize();
    pending_ = false;
    inner_->weights_changed();  // every layer's copies (some may be refreshed twice)
    times_.all_gather_wait = now_ms() - t0;
  }

  std::unique_ptr<TrainStep> inner_;
  std::vector<Zero1Item> items_;
  Zero1Plan plan_;
  Communicator& comm_;
  Communicator& host_;
  int rank_ = 0;
  ParamMask mask_, current_;
  int64_t flat_floats_ = 0;
  bool overlap_ = true;
  bool device_work_ = false, mirror_ = false, reduced_ = false;
  std::vector<int64_t> bucket_layer_;  // per bucket: the layer that completes it
  std::vector<int64_t> order_;         // buckets in the order the backward completes them
  size_t issued_ = 0;                  // of order_, started this step
  int64_t in_backward_ = 0;            // started inside the backward (layer >= 0)
  int64_t micro_total_ = 0, micro_seen_ = 0;
  double hook_ms_ = 0;
  bool gather_overlap_ = false, pending_ = false;  // the all-gather overlaps the next forward
  bool device_cp_ = false;  // a context-parallel group over NCCL: no overlap (set_context_parallel)
  int64_t layers_ = 0;
  std::vector<int> gate_mark_;  // per layer + 1: the communicator's mark after its buckets
  float *host_g_ = nullptr, *host_m_ = nullptr;
  int64_t reduce_scatters_ = 0;
  DataParallelTimes times_;
};

}  // namespace

std::unique_ptr<DataParallelStep> make_data_parallel_step(ZayaModel& model,
                                                          const OptimizerSettings& optim,
                                                          const BalancingSettings& balancing,
                                                          TrainStepOptions options,
                                                          Communicator& comm, Communicator& host,
                                                          int64_t bucket_elems, bool overlap) {
  ZAYA_CHECK(comm.size() == host.size() && comm.rank() == host.rank(),
             "data parallel: the {} communicator (rank {} of {}) and the host one (rank {} of {}) "
             "differ",
             comm.backend(), comm.rank(), comm.size(), host.rank(), host.size());
  ZAYA_CHECK(!host.buffer_on_device(), "data parallel: the host communicator must be MPI");
  std::vector<Zero1Item> items = zero1_items(model, optim);
  // Expert stacks and big AdamW tensors by dim-0 slices (both steps keep and update a slice).
  Zero1Plan plan = plan_zero1(items, comm.size(), bucket_elems, true);
  options.owned_state = plan.mask(comm.rank());
  options.flat_offsets = plan.offset;  // the collectives run in place on the step's buffers
  options.flat_numel = plan.flat_numel;
  options.owned_slices.assign(items.size(), {0, -1});
  for (size_t i = 0; i < items.size(); i++)
    if (plan.owner[i] == Zero1Plan::kSplit) {
      const Dim0Slice e = plan.slices[i][size_t(comm.rank())];
      if (e.count > 0) options.owned_slices[i] = {e.first, e.count};
    }
  auto inner = make_train_step(model, optim, balancing, options);
  return std::make_unique<DpStep>(std::move(inner), std::move(items), std::move(plan), comm, host,
                                  overlap);
}

}  // namespace zaya
