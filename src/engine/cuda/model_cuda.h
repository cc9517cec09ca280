// The ZAYA1 model on one CUDA device: fp32 master weights and their bf16 copies in device memory,
// the training forward + backward (bf16 GEMMs on cuBLASLt, fused CCA and attention kernels, grouped
// expert GEMMs over tokens sorted by expert, chunked cross-entropy fused with the tied LM head),
// and inference with a device-resident CCA cache. It computes what ZayaModel::forward and
// forward_backward (model/backward.h) compute, within bf16 tolerance; tests/gpu checks it against
// them.
//
// One arena, sized at construction for the largest micro-batch (max_tokens), holds every activation
// and workspace: a step allocates nothing. Parameters are the tensors of
// ZayaModel::named_tensors(), same names, shapes and order, so the optimizer rules, checkpoints and
// the CPU path share one naming.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/ops.h"
#include "core/tensor.h"
#include "model/backward.h"
#include "model/zaya.h"

namespace zaya::cuda {

struct CudaModelOptions {
  int64_t max_tokens = 4096;  // largest B*S of a micro-batch (sizes the activation arena)
  int64_t max_seq = 4096;     // longest sequence (attention workspace, decode cache default)
  bool recompute = false;     // keep only layer inputs; recompute each layer in backward
  // Budget for the fp32 logits of one chunk of tokens in the fused LM head + cross-entropy (the
  // bf16 dlogits of the chunk take half as much again). Each chunk's embedding-gradient GEMM reads
  // and writes the whole fp32 [V,D] gradient, so fewer, larger chunks move far fewer bytes: at
  // ZAYA1's vocabulary 4 GiB is 4096 tokens per chunk (512 MiB would be 384 tokens, 11x the
  // traffic).
  size_t logits_chunk_bytes = size_t(4) << 30;
  bool profile = false;  // time op classes with CUDA events (adds synchronisation)
  int device = 0;
  // Where the master and gradient buffers put each parameter (named_tensors() order) and their
  // length (TrainStepOptions::flat_offsets, checked the same way); empty: 256-byte aligned in
  // order.
  std::vector<int64_t> flat_offsets;
  int64_t flat_numel = 0;
};

// One parameter on the device. `copy` is the bf16 copy used by GEMMs (null for parameters that
// stay fp32 in the math: norms, biases, scales, temperatures, conv filters, balancing biases).
struct DeviceParam {
  std::string name;
  Shape shape;
  int64_t numel = 0;
  float* master = nullptr;  // fp32
  bf16* copy = nullptr;     // bf16 or null
  float* grad = nullptr;    // fp32 (null for balancing biases)
};

// Milliseconds per op class of the last profiled step (CudaModelOptions::profile).
struct OpClassTimes {
  double gemm = 0, attention = 0, moe_dispatch = 0, norms = 0, loss = 0, cca = 0, other = 0;
};

class CudaModel {
 public:
  CudaModel(const ZayaModel& m, const CudaModelOptions& opt);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ZayaConfig& cfg() const;
  std::vector<DeviceParam>& params();
  // The one master and the one gradient allocation that every parameter lives in, and their
  // length in floats.
  float* master_base() const;
  float* grad_base() const;
  int64_t flat_elems() const;
  cudaStream_t stream() const;
  GemmContext& gemm();

  // Copies the device masters back into m's tensors (fp32; m must have the same config); used for
  // checkpoints and evaluation on the host.
  void download(ZayaModel& m) const;
  // Uploads m's tensors into the masters and refreshes the bf16 copies.
  void upload(const ZayaModel& m);
  // Refreshes every bf16 copy from its master (after an optimizer that did not write them).
  void refresh_copies();
  // The same for the tensors of one layer (layer_of_param: -1 the embedding, input affine and
  // final norm), enqueued on the stream; `current` (per parameter, params() order) marks those
  // whose copies are already up to date (the optimizer wrote them), which are skipped.
  void refresh_copies(int64_t layer, const std::vector<bool>* current = nullptr);
  void zero_grads();

  // Forward + backward of one micro-batch; ids/targets are host [B,S] (targets < 0 ignored).
  // ACCUMULATES loss_scale · d(mean loss)/d(param) into the device grads, as forward_backward does.
  // Synchronises at the end to return the stats (loss, tokens, routed counts per layer and class).
  // `ready` (may be null) is told as layers' gradients are enqueued (model/backward.h). With `cp`
  // (a group of C >= 2 ranks, model/backward.h's ContextParallel) every rank of the group passes
  // the same whole rows and computes its two chunks of each: the gradients are its part of the
  // sum, the loss its share of the mean, tokens and routed counts its own tokens'; halos, keys and
  // values go through the group's communicator (device buffers for NCCL, pinned host copies for
  // MPI), synchronising the stream around each exchange. `needed` (may be null) is told before the
  // forward's kernels first read each layer's weights (LayerWeightsNeeded, model/backward.h).
  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                             float loss_scale = 1.0f, const LayerGradsReady* ready = nullptr,
                             const ContextParallel* cp = nullptr,
                             const LayerWeightsNeeded* needed = nullptr);
  // Logits of every position, copied to the host as fp32 [B,S,V] (for tests and eval of small
  // models; V·B·S floats must fit in the arena's logits chunk budget, checked).
  Tensor forward_logits(const std::vector<int32_t>& ids, int64_t B, int64_t S);
  // Mean next-token loss without gradients.
  double loss(const std::vector<int32_t>& ids, int64_t B, int64_t S);
  // The summed cross-entropy of ids [B,S] against targets (< 0 ignored) and the count of scored
  // tokens, without gradients. With `cp` (as forward_backward) this rank's chunks only: the sums
  // over the group are the rows'.
  std::pair<double, int64_t> loss_sum(const int32_t* ids, const int32_t* targets, int64_t B,
                                      int64_t S, const ContextParallel* cp = nullptr);

  const OpClassTimes& last_profile() const;
  size_t arena_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zaya::cuda
