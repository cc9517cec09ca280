// Training forward + backward of the whole ZAYA1 model (ZAYA1.md §3) on the CPU reference ops:
// the forward of ZayaModel::forward without a cache (all positions), keeping the activations the
// backward needs, then reverse-mode through the tied LM head, every layer (MoE with the EDA router
// state chain, CCA attention) and the input affine/embedding. Gradients accumulate into a
// ModelGrads that mirrors ZayaModel::named_tensors(), in fp32.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/zaya.h"

namespace zaya {

class Communicator;

// Gradients with the same names, shapes and order as model.named_tensors(), fp32.
struct ModelGrads {
  std::vector<std::pair<std::string, Tensor>> tensors;
  void zero();
  // The gradient of the named tensor; throws zaya::Error naming an unknown name.
  Tensor& get(const std::string& name);
};

// Zero-initialised gradients for every tensor of the model.
ModelGrads make_grads(const ZayaModel& m);

struct StepStats {
  double loss = 0;                           // mean cross-entropy over tokens with target >= 0
  int64_t tokens = 0;                        // number of such tokens
  std::vector<std::vector<int64_t>> routed;  // per layer, tokens per class 0..E (E = skip)
};

// Context parallelism (ZAYA1.md §4): the C ranks of `comm` share every sequence. Each row is cut
// into 2·C chunks of L = S/(2C) tokens and rank i computes chunks i and 2C−1−i (context_chunks),
// so every rank does the same causal-attention work. Keys and values are all-gathered (CCA's are
// small: Hkv heads) and their gradients reduce-scattered; the convolutions' history (the last
// (t0−1)+(t1−1) pre-convolution [q0 | k0] columns) and the delayed value (Wv_del x of the last
// token) of each chunk go point to point to the rank of the next chunk, and their gradients come
// back to the rank that produced them. RoPE positions are the global ones.
struct ContextParallel {
  Communicator* comm = nullptr;  // the cp group, size C >= 2 (null or size 1: no splitting)
  bool send_halo_grads = true;   // false drops the halo gradients (tests: a detached halo fails)
};
// Called by the backward as it finishes: layer(layer) once the gradients of every parameter of
// layers >= `layer` ("model.layers.<n>.") are final for this micro-batch (L−1 first, then down),
// and layer(-1) once every gradient is (the embedding, the input affine and the final norm last).
// A data-parallel step starts reducing the buckets those complete (engine/data_parallel_step.h).
// On the GPU it is called when the layer's kernels are enqueued, not done: order reads after the
// step's stream.
using LayerGradsReady = std::function<void(int64_t layer)>;
// The forward's counterpart, for weights that arrive while it runs (a data-parallel step's
// all-gather): needed(layer) before the forward first reads a weight of layer `layer`, in
// increasing order, each once: -1 first (the embedding, the input affine and the final norm),
// then 0 .. L−1 (layer l+1's before layer l's kernels, whose last ones read the next input norm).
// On the GPU it is called as the kernels are enqueued: a stream wait orders them.
using LayerWeightsNeeded = std::function<void(int64_t layer)>;

// The global chunk indices rank `rank` of a cp group of `size` holds, in its slot order.
std::array<int64_t, 2> context_chunks(int rank, int size);
// Refuses (zaya::Error) a sequence length that C ranks cannot split: not divisible by 2·C, or
// chunks shorter than the convolutions' history.
void check_context_split(const ZayaConfig& cfg, int64_t S, int64_t C);
// The global index (b·S + t) in [B,S] rows of local token n of rank `rank` of a cp group of `size`
// (local tokens slot-major: slot n / (B·L), row (n / L) % B, offset n % L, L = S/(2·size)).
int64_t context_global_index(int64_t n, int64_t B, int64_t S, int rank, int size);
// The ids and targets of this rank's two chunks of every row of [B,S] (B·S/size tokens, in the
// local order of context_global_index) into lids, ltargets.
void context_take_chunks(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S, int rank,
                         int size, std::vector<int32_t>& lids, std::vector<int32_t>& ltargets);
// The point-to-point part of the halo exchange, on buffers in the communicator's memory: this
// rank's tails [2][row] (slot-major) go to the ranks of the chunks after them, halos [2][row]
// receive from the ranks of the chunks before them. Slots without a peer are left as they are: the
// caller zeroes halos first (chunk 0 has no predecessor) and, on the group's last rank, copies its
// own slot-0 tail into its slot-1 halo (chunk C−1 precedes chunk C on the same rank).
void context_pass_tails(Communicator& c, const float* tails, float* halos, size_t row);
// The reverse for the backward: the halos' gradients go back to their producers and dtails
// receives this rank's tails' gradients from the ranks of the next chunks; the caller zeroes dtails
// first (the last chunk feeds nothing) and, on the last rank, copies its slot-1 gradient into its
// slot-0 dtails.
void context_return_halos(Communicator& c, const float* dhalos, float* dtails, size_t row);

// ids, targets: [B,S] int32; targets[n] < 0 are ignored. Computes the mean cross-entropy and
// ACCUMULATES (+=) loss_scale * d(mean loss)/d(param) into grads (loss_scale = 1/micro_batches for
// gradient accumulation). Balancing biases get no gradient (the choice is discrete). Every weight
// must be fp32 (training keeps fp32 master weights); anything else is refused with an error.
// Deterministic: the result does not depend on the thread count. Scratch memory (about one step's
// activations) is kept by the calling thread between calls, so repeated steps do not reallocate.
// With `cp`, every rank of the group passes the same full rows and computes its two chunks: the
// gradients are this rank's part (their sum over the group is the whole gradient), StepStats.loss
// its share of the mean (the shares sum to the mean over the group's scored tokens), tokens and
// routed its own tokens' counts. A sequence length not divisible by 2·C, or chunks shorter than
// the convolutions' history, is refused with an error. `ready` (may be null) is told as the
// backward completes layers (LayerGradsReady).
StepStats forward_backward(const ZayaModel& m, const int32_t* ids, const int32_t* targets,
                           int64_t B, int64_t S, ModelGrads& grads, float loss_scale = 1.0f,
                           const ContextParallel* cp = nullptr,
                           const LayerGradsReady* ready = nullptr);

}  // namespace zaya
