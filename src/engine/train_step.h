// TrainStep: the training loop's view of one device that holds a model replica with its gradients
// and its optimizer state, whatever the device. CpuStep (engine/cpu_step.cpp: the CPU reference ops
// and the fp32 Optimizer) and CudaStep (engine/cuda/cuda_step_cuda.cpp: CudaModel + CudaOptimizer)
// implement it; train/trainer.cpp runs every backend through it and has no device branches.
//
// A step's life: zero_grads → forward_backward per micro-batch (accumulating) → grad_sq_norm →
// optimizer_step → update_balancing. The parts are separate so that a data-parallel wrapper can put
// collectives between them without knowing the device:
//   1. gradients ready: grads() is every gradient in one flat fp32 buffer, laid out as layout()
//      says (name, shape, offset), for a reduce-scatter (ZeRO-1) or an all-reduce in place;
//   2. update of an owned subset: grad_sq_norm(owned) and optimizer_step(..., owned) touch only the
//      parameters a rank owns (whole tensors, so Muon sees whole matrices);
//   3. all-gather of weights: masters() is every fp32 master weight in one flat buffer with the
//      same layout; after other ranks' updates are written into it, weights_changed() refreshes
//      what the device derives from the masters (the bf16 copies on the GPU).
// The routed-token counts given to update_balancing are the caller's (all-reduced across ranks
// when there are several), so every replica takes the same balancing decision.
//
// Named state (state()/load_state()) is what checkpoints store: the optimizer's moments and Muon
// momentum under the CPU Optimizer's names, and the balancing update's moments, as whole tensors
// (ckpt/named_state.h says where a piece sits in its global tensor). The weights themselves are
// exported into a host ZayaModel (export_weights) and stored in the `transformers` layout.
//
// Deliberately not here: data, schedules, the NaN guard, metrics, checkpoint files, collectives.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/named_state.h"
#include "ckpt/sharded.h"
#include "core/tensor.h"
#include "model/backward.h"
#include "model/zaya.h"
#include "optim/balancing.h"
#include "optim/optimizer.h"

namespace zaya {

// Where one parameter sits in the flat gradient and master buffers. Offsets are in elements; the
// CUDA layout pads each tensor's start for alignment, so offsets are not always prefix sums.
struct ParamSlot {
  std::string name;  // the `transformers` name
  Shape shape;
  int64_t offset = 0, numel = 0;
  bool has_grad = true;  // false for the balancing biases (updated from routing counts)
};

// A flat fp32 buffer of a step: host memory (Device::CPU) or device memory (Device::CUDA).
struct FlatBuffer {
  float* data = nullptr;
  int64_t numel = 0;
  Device device = Device::CPU;
};

// Which parameters an update covers: owned[i] for layout()[i]. Empty means every parameter.
using ParamMask = std::vector<bool>;

// Accumulates the held-out loss the way the loop averages it: Σ mean_loss · predictions over
// batches, and the number of predictions.
struct LossSum {
  double total = 0;
  int64_t count = 0;
  void add(double mean_loss, int64_t predictions) {
    total += mean_loss * double(predictions);
    count += predictions;
  }
};

struct TrainStepOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  int device_index = 0;        // CUDA device
  int64_t max_tokens = 0;      // largest B·S of a micro-batch or of an evaluation batch (CUDA)
  int64_t max_seq = 0;         // longest sequence (CUDA)
  bool recompute = false;      // activation recomputation in backward (CUDA)
  bool ns_bf16 = true;         // Muon's Newton–Schulz GEMMs in bf16, else fp32 (CUDA)
  // ZeRO-1: the parameters whose optimizer state this step keeps (empty: all). Both steps
  // allocate moments and momentum only for these (the CUDA one also sizes its Muon scratch by
  // them), and optimizer_step may update only them; state() and load_state() cover just them.
  ParamMask owned_state;
  // With owned_state, per parameter: the dim-0 slice [first, first + count) (experts of a 3-D
  // tensor, rows of a 2-D one) that the step keeps and updates, its state then being of shape
  // [count, ...] under the tensor's name (count < 0, or an empty list: the whole tensor).
  std::vector<std::pair<int64_t, int64_t>> owned_slices;
  // Where the flat gradient and master buffers put each parameter (tensor_slots() order), and
  // their length, so that another layout (ZeRO-1's in-place buckets, dist/zero1.h) is the step's
  // own; empty: the step's default. Every offset is 64-float aligned except the continuations of
  // the packed qkv matrix (continues_packed_qkv), which must follow their predecessor directly;
  // tensors may not overlap. Gaps hold zeros. The step checks and throws zaya::Error otherwise.
  std::vector<int64_t> flat_offsets;
  int64_t flat_numel = 0;
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;

  virtual std::string name() const = 0;     // "cpu", "cuda:0 (NVIDIA H200)"
  virtual size_t device_bytes() const = 0;  // memory the step holds on its device (0 on CPU)
  virtual bool reports_mfu() const = 0;     // whether MFU means anything on this device
  virtual const std::vector<ParamSlot>& layout() const = 0;

  virtual void zero_grads() = 0;
  // Accumulates loss_scale · d(mean loss)/d(param) into the gradients (forward_backward's
  // contract, model/backward.h); returns the loss, the counted tokens and the routed counts.
  virtual StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B,
                                     int64_t S, float loss_scale) = 0;
  // Σ g² over the gradients of the parameters in `owned` (all when empty), in double.
  virtual double grad_sq_norm(const ParamMask& owned = {}) = 0;
  // One optimizer update of the parameters in `owned` (all when empty) at learning rate lr, with
  // gradients read as g·grad_scale (the clip factor, or 1).
  virtual void optimizer_step(double lr, float grad_scale, const ParamMask& owned = {}) = 0;
  virtual int64_t optimizer_steps() const = 0;
  // Matrices Newton–Schulz-orthogonalised by the last optimizer_step (a 3-D expert tensor counts
  // its E matrices); -1 where the step does not count them.
  virtual int64_t muon_matrices_last_step() const { return -1; }
  // The aux-loss-free balancing update from this step's routed counts (summed over ranks).
  virtual void update_balancing(const std::vector<std::vector<int64_t>>& counts) = 0;
  virtual int64_t balancing_steps() const = 0;

  // Stage views for data parallelism (see the file comment).
  virtual FlatBuffer grads() = 0;
  virtual FlatBuffer masters() = 0;
  virtual void weights_changed() = 0;

  // Next-token loss of rows [B, S1] (S1 − 1 predictions each), no gradients, added into `acc`.
  virtual void eval_loss(const std::vector<int32_t>& rows, int64_t B, int64_t S1, LossSum& acc) = 0;
  // Whether eval_loss splits the rows over the context-parallel group of set_context_parallel
  // (the CUDA step: its arena then holds chunks, not whole sequences): every rank of the group
  // passes the same rows and adds its share, and the group's sum is the rows' loss. Otherwise each
  // rank scores whole rows alone.
  virtual bool eval_splits_context() const { return false; }

  // Makes the model use these RoPE settings from the next forward on (a phase changed theta);
  // the weights and optimizer state are kept.
  virtual void set_rope(const RopeSettings& hybrid, const RopeSettings& sliding) = 0;
  // Activation recomputation from the next forward on (a phase turned it on or off): the CUDA
  // step keeps only each layer's input and recomputes the layer in the backward, with the same
  // results bit for bit; the weights and optimizer state are kept. The CPU reference step keeps
  // every activation and ignores it.
  virtual void set_recompute(bool on) { (void)on; }

  // Copies the fp32 master weights (balancing biases included) into `host`, a model of the same
  // config: for checkpoints and the exported model.
  virtual void export_weights(ZayaModel& host) = 0;

  // Checkpointed state: optimizer moments and momentum (optim.*) and balancing moments (balance.*).
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
  // Restores state() and the step counters, so the next step continues bit-exactly. Unknown or
  // missing names are errors.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                          int64_t optimizer_steps, int64_t balancing_steps) = 0;

  // Sharded checkpoints (ckpt/sharded.h). The state pieces this process stores, each placed in
  // its global tensor (default: state() as whole tensors); which rank writes each weight,
  // per layout() slot (default: 0 for all); and restoring from a source that serves any piece of
  // any tensor, whichever world size wrote it (default: every name whole, through load_state).
  virtual std::vector<NamedState> owned_state();
  virtual std::vector<int> weight_writers() const;
  virtual void load_state_from(const StateSource& source, int64_t optimizer_steps,
                               int64_t balancing_steps);
  // Waits until the masters() hold the last update (the GPU step's stream); no-op on the CPU.
  virtual void sync() {}
  // The CUDA stream (a cudaStream_t) the step's work runs on in order; nullptr on the CPU.
  virtual void* stream() const { return nullptr; }
  // Overlap (data parallelism): from now on every forward_backward tells `fn` as its backward
  // completes layers' gradients (model/backward.h's LayerGradsReady); an empty fn stops it. The
  // CPU and CUDA steps have it; the default ignores it (the gradients are then all ready after
  // forward_backward returns, as before).
  virtual void set_grads_ready(LayerGradsReady fn) { (void)fn; }
  // Overlap of the weight all-gather with the next forward: from now on every forward_backward
  // calls `fn` before it first reads each layer's weights (model/backward.h's LayerWeightsNeeded;
  // an empty fn stops it); the caller then makes them ready (on the GPU by ordering the step's
  // stream) and calls layer_weights_changed(layer). Returns whether this step calls it: the CUDA
  // step does; the default does not (the weights must then be complete before forward_backward).
  virtual bool set_weights_needed(LayerWeightsNeeded fn) {
    (void)fn;
    return false;
  }
  // weights_changed() for the tensors of one layer (layer_of_param), enqueued on the step's
  // stream: the compute copies of those masters. `current` (layout order; empty: none) marks the
  // tensors whose copies are already up to date (this rank's optimizer updated all of them).
  virtual void layer_weights_changed(int64_t layer, const ParamMask& current) {
    (void)layer;
    (void)current;
    weights_changed();
  }
  // Called by the loop after zero_grads(): the gradients of this step are complete after
  // `micro_batches` forward_backward calls. A data-parallel step uses it to reduce buckets during
  // the last one's backward; others ignore it.
  virtual void begin_accumulation(int64_t micro_batches) { (void)micro_batches; }
  // Context parallelism (model/backward.h): from now on forward_backward gets the full rows of a
  // sequence group and computes this rank's two chunks over `cp` (null or size 1: whole rows).
  // The CPU step has it; others refuse a group of 2 or more with a zaya::Error.
  virtual void set_context_parallel(Communicator* cp);
};

// A step's named state is the optimizer's (optim.*) followed by the balancing update's (balance.*).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
NamedTensors join_step_state(NamedTensors optimizer, const NamedTensors& balancing);
// Splits state() back into the optimizer's part and the balancing part (names "balance.*").
std::pair<NamedTensors, NamedTensors> split_step_state(const NamedTensors& state);

// The step for options.device over `model` (weights uploaded to, or taken over by, the step: the
// CPU step trains `model`'s tensors in place, re-homed into its flat master buffer, so `model`
// must outlive it). Throws zaya::Error for an unknown device, a build without CUDA, or a machine
// without the CUDA device.
std::unique_ptr<TrainStep> make_train_step(ZayaModel& model, const OptimizerSettings& optim,
                                           const BalancingSettings& balancing,
                                           const TrainStepOptions& options);

// Byte copies between host memory and a step's flat buffers, in any direction (cudaMemcpy with
// cudaMemcpyDefault in a CUDA build; memcpy otherwise), and page-locked host staging buffers (the
// data-parallel step's host-staged MPI path for GPU ranks). Copies to or from host memory are
// synchronous; a device-to-device copy may still run when it returns, and no copy waits for work
// on a step's own (non-blocking) stream: call the step's sync() first when it wrote the source,
// and finish_step_copies() before another stream reads the destination.
void copy_step_bytes(void* dst, const void* src, size_t bytes);
// Waits until every copy_step_bytes issued so far has completed (no-op without CUDA).
void finish_step_copies();
// The layer index of a parameter named "model.layers.<n>. ...", or -1 for the others (the
// embedding, the input affine, the final norm): the LayerGradsReady index that completes it.
int64_t layer_of_param(const std::string& name);
// Checks TrainStepOptions::flat_offsets / flat_numel against the parameters' names and sizes
// (see there); a no-op when flat_offsets is empty.
void check_flat_layout(const std::vector<std::pair<std::string, int64_t>>& names_numel,
                       const std::vector<int64_t>& offsets, int64_t flat_numel);
// CUDA devices this process sees (0 in a build without CUDA or on a machine without a GPU).
int visible_cuda_devices();
void* alloc_pinned_host(size_t bytes);
void free_pinned_host(void* p);

// This rank's part of a sharded checkpoint (ckpt/sharded.h) from a step: the weights it writes
// (weight_writers(), read from masters(), host or GPU), its state pieces (owned_state()), and on
// rank 0 every weight's placement. The caller adds config_json and trainer_json (rank 0). Call
// after sync(); the sources stay valid until the step changes its masters.
RankContribution checkpoint_contribution(TrainStep& step, int rank, int world);
// How a checkpoint writer may copy from the step's memory (ckpt/async_writer.h): ordinary memory
// and memcpy for a CPU step; for a GPU step, by `snapshot` (checkpoint.snapshot): "host" =
// page-locked host memory filled by device-to-host copies; "device" = a ring in the GPU's memory
// filled by device-to-device copies, read by the writer through a page-locked bounce buffer;
// "auto" = "device" when the GPU has ring_bytes (the ring the writer will allocate) plus 2 GiB
// free, else "host". Call from the thread that drives the step (its current CUDA device).
StagingMemory checkpoint_staging(TrainStep& step, const std::string& snapshot = "host",
                                 size_t ring_bytes = 0);
// The CUDA build's GPU ring (the current device) and the current device's free bytes; a build
// without CUDA throws / returns 0.
StagingMemory device_ring_staging();
size_t free_device_bytes();

// Throws zaya::Error unless options.device can train here (for "cuda": the build has the CUDA
// backend and the machine has the device). The loop calls it first, before any data or model work.
void check_train_device(const TrainStepOptions& options);

}  // namespace zaya
