// make_train_step: the TrainStep for a device name, and the CUDA factory's stand-in for a build
// without the CUDA backend (the CUDA build defines it in engine/cuda/cuda_step_cuda.cpp).
#include "engine/train_step.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "dist/comm.h"
#include "engine/cpu_step.h"
#include "engine/cuda/cuda_step.h"

namespace zaya {

std::vector<NamedState> TrainStep::owned_state() {
  return whole_tensors(state());
}

void TrainStep::set_context_parallel(Communicator* cp) {
  ZAYA_CHECK(!cp || cp->size() < 2, "context parallelism (cp = {}) is not available on {}",
             cp ? cp->size() : 1, name());
}

int64_t layer_of_param(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t layer = 0;
  size_t i = prefix.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; i++) {
    layer = layer * 10 + (name[i] - '0');
    if (layer > (int64_t(1) << 40)) return -1;
  }
  return i < name.size() && name[i] == '.' ? layer : -1;
}

void check_flat_layout(const std::vector<std::pair<std::string, int64_t>>& names_numel,
                       const std::vector<int64_t>& offsets, int64_t flat_numel) {
  if (offsets.empty()) return;
  ZAYA_CHECK(offsets.size() == names_numel.size(),
             "train step: the flat layout has {} offsets for {} parameters", offsets.size(),
             names_numel.size());
  std::vector<std::pair<int64_t, int64_t>> spans;  // [offset, end)
  for (size_t i = 0; i < offsets.size(); i++) {
    const auto& [name, numel] = names_numel[i];
    const int64_t o = offsets[i];
    ZAYA_CHECK(o >= 0 && o + numel <= flat_numel,
               "train step: '{}' at flat offset {} ({} elements) lies outside the {} of the "
               "flat buffers",
               name, o, numel, flat_numel);
    if (continues_packed_qkv(name)) {
      ZAYA_CHECK(i > 0 && offsets[i - 1] + names_numel[i - 1].second == o,
                 "train step: '{}' at flat offset {} does not follow '{}' directly", name, o,
                 i > 0 ? names_numel[i - 1].first : std::string("nothing"));
    } else {
      ZAYA_CHECK(o % 64 == 0, "train step: '{}' at flat offset {} is not 64-float aligned", name,
                 o);
    }
    spans.emplace_back(o, o + numel);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); i++)
    ZAYA_CHECK(spans[i].first >= spans[i - 1].second,
               "train step: the flat layout overlaps two tensors at offset {}", spans[i].first);
}

std::vector<int> TrainStep::weight_writers() const {
  return std::vector<int>(layout().size(), 0);
}

RankContribution checkpoint_contribution(TrainStep& step, int rank, int world) {
  RankContribution c;
  c.rank = rank;
  c.world = world;
  c.state = step.owned_state();
  const FlatBuffer m = step.masters();
  const std::vector<ParamSlot>& lay = step.layout();
  const std::vector<int> writers = step.weight_writers();
  ZAYA_CHECK(writers.size() == lay.size(), "checkpoint: {} weight writers for {} tensors",
             writers.size(), lay.size());
  for (size_t i = 0; i < lay.size(); i++) {
    if (writers[i] == rank)
      c.weights.push_back({lay[i].name, lay[i].shape, m.data + lay[i].offset});
    if (rank == 0) c.placements.push_back({lay[i].name, lay[i].shape, writers[i]});
  }
  return c;
}

StagingMemory checkpoint_staging(TrainStep& step, const std::string& snapshot, size_t ring_bytes) {
  ZAYA_CHECK(snapshot == "auto" || snapshot == "device" || snapshot == "host",
             "checkpoint snapshot '{}': expected auto, device or host", snapshot);
  if (step.masters().device != Device::CUDA) return {};
  constexpr size_t kHeadroom = size_t(2) << 30;
  if (snapshot == "device" || (snapshot == "auto" && free_device_bytes() >= ring_bytes + kHeadroom))
    return device_ring_staging();
  StagingMemory m;
  m.alloc = alloc_pinned_host;
  m.free = free_pinned_host;
  m.copy = copy_step_bytes;
  m.where = "pinned host";
  return m;
}

void TrainStep::load_state_from(const StateSource& source, int64_t optimizer_steps,
                                int64_t balancing_steps) {
  NamedTensors all;
  for (const std::string& n : source.names()) all.emplace_back(n, source.read_whole(n));
  load_state(all, optimizer_steps, balancing_steps);
}

#if !defined(ZAYA_HAVE_CUDA)
void check_cuda_step_available(int) {
  fail(
      "train.device = \"cuda\": this zaya was built without CUDA (configure with -DZAYA_CUDA=ON "
      "on a machine with nvcc to get the GPU training path)");
}

std::unique_ptr<TrainStep> make_cuda_step(ZayaModel&, const OptimizerSettings&,
                                          const BalancingSettings&, const TrainStepOptions& o) {
  check_cuda_step_available(o.device_index);
  return nullptr;  // not reached
}

void copy_step_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void finish_step_copies() {}

StagingMemory device_ring_staging() {
  fail("checkpoint.snapshot = \"device\": this zaya was built without CUDA");
}

size_t free_device_bytes() {
  return 0;
}

int visible_cuda_devices() {
  return 0;
}

void* alloc_pinned_host(size_t bytes) {
  void* p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  ZAYA_CHECK(p != nullptr, "cannot allocate {} bytes of host staging memory", bytes);
  return p;
}

void free_pinned_host(void* p) {
  std::free(p);
}
#endif

NamedTensors join_step_state(NamedTensors optimizer, const NamedTensors& balancing) {
  optimizer.insert(optimizer.end(), balancing.begin(), balancing.end());
  return optimizer;
}

std::pair<NamedTensors, NamedTensors> split_step_state(const NamedTensors& state) {
  std::pair<NamedTensors, NamedTensors> parts;
  for (auto& kv : state)
    (kv.first.rfind("balance.", 0) == 0 ? parts.second : parts.first).push_back(kv);
  return parts;
}

void check_train_device(const TrainStepOptions& o) {
  if (o.device == "cuda") {
    check_cuda_step_available(o.device_index);
    return;
  }
  ZAYA_CHECK(o.device == "cpu", "train.device = \"{}\": expected \"cpu\" or \"cuda\"", o.device);
}

std::unique_ptr<TrainStep> make_train_step(ZayaModel& model, const OptimizerSettings& optim,
                                           const BalancingSettings& balancing,
                                           const TrainStepOptions& options) {
  check_train_device(options);
  if (options.device == "cuda") return make_cuda_step(model, optim, balancing, options);
  return make_cpu_step(model, optim, balancing, options);
}

}  // namespace zaya
