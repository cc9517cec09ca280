// Inference of the ZAYA1 model on one CUDA device: batched prefill with the training-path kernels
// and cuBLASLt GEMMs, then cached decoding one token per sequence per step with weight-streaming
// matrix-vector kernels (backend/cuda/decode/decode_kernels.h), replayed from a CUDA graph so that a step costs one
// launch. Weights are bf16 copies (the router MLP and all vectors stay fp32); the cache holds K and
// V in bf16, and the convolution history and delayed value in fp32, on the device.
//
// It computes what ZayaModel::forward with an InferenceCache computes, within bf16 tolerance;
// tests/gpu/test_cuda_infer.cpp checks prefill and every decode step against it. Deliberately not
// here: sequences of different lengths in one batch (all sequences advance together), paged
// caches, speculative decoding.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/decode/decode_policy.h"
#include "core/tensor.h"
#include "model/sampling.h"
#include "model/zaya.h"

namespace zaya::cuda {

// The op classes of a decode step, for set_decode_skip (names: decode_op_name).
enum class DecodeOp : unsigned {
  Qkv,        // the q|k|v projection GEMV
  CcaConv,    // the CCA convolutions
  CcaFinish,  // mean skip, QK-norm, RoPE, cache writes
  Attention,  // split-context attention
  OProj,      // the o projection with the post-attention residual norm
  Router,     // the router (one cluster launch)
  Experts,    // SwiGLU and down projection with the post-MLP residual norm
  LmHead,     // the LM head GEMV
  Count
};
const char* decode_op_name(DecodeOp op);

struct CudaInferOptions {
  int64_t max_batch = 1;              // sequences decoded together (<= 8)
  int64_t max_context = 4096;         // cache capacity per sequence (prompt + new tokens)
  int64_t max_prefill_tokens = 8192;  // B·S rows of one prefill pass (longer prompts are chunked)
  bool graphs = true;                 // replay decode steps from a captured CUDA graph
  // How the decode kernels are launched (programmatic dependent launch where the device has it,
  // unless ZAYA_DECODE_PDL=0 in the environment); the same bits under every policy.
  DecodePolicy policy = decode_policy_from_environment();
  int device = 0;
};

class CudaInference {
 public:
  CudaInference(const ZayaModel& m, const CudaInferOptions& opt);
  ~CudaInference();
  CudaInference(const CudaInference&) = delete;
  CudaInference& operator=(const CudaInference&) = delete;

  const ZayaConfig& cfg() const;
  // Empties the cache for `batch` sequences (1 <= batch <= max_batch).
  void reset(int64_t batch);
  int64_t batch() const;
  int64_t length() const;  // tokens per sequence already in the cache
  int64_t max_context() const;
  // The most rows (B·S) whose logits one prefill(..., all_logits) returns.
  int64_t max_logits_rows() const;

  // Runs S new tokens per sequence (ids host [B,S], B = batch()) through the model, appending them
  // to the cache. Returns fp32 logits on the host: of the last position [B,1,V], or of every
  // position [B,S,V] when all_logits (checked to fit the prefill budget).
  Tensor prefill(const std::vector<int32_t>& ids, int64_t S, bool all_logits = false);
  // One decode step with one token per sequence; returns the logits [B,1,V] on the host.
  Tensor decode(const std::vector<int32_t>& ids);
  // n greedy decode steps entirely on the device (the argmax of each step feeds the next), starting
  // from one token per sequence; returns the n new tokens per sequence, [n][B] flattened. The steps
  // are enqueued back to back (the argmax written on the device into the next step's input and a
  // token history) and the host waits once, at the end.
  std::vector<int32_t> decode_greedy(const std::vector<int32_t>& first, int64_t n);
  // Captures (without running) the graphs decode_greedy replays — one step, and groups of eight
  // steps as one graph — once a decode step has run, so that a timed decode_greedy only replays.
  // Otherwise they are captured on first use.
  void prepare_decode_graphs();

  // decode_greedy with the decode trace on (set_decode_trace): returns the stamps, (event id, ns)
  // in the order they landed, and the tokens in `tokens`. For `zaya bench infer --trace`.
  std::vector<std::pair<unsigned, uint64_t>> trace_decode(const std::vector<int32_t>& first,
                                                          int64_t n, std::vector<int32_t>* tokens);

  // One eager decode step (no graph) with CUDA events between ops: milliseconds per op class, in
  // the order first seen. Advances the cache like decode(). For `zaya bench infer --profile`.
  std::vector<std::pair<std::string, double>> profile_decode(const std::vector<int32_t>& ids);

  // A timing experiment, never for real decoding: the op classes (bits 1 << DecodeOp) whose
  // launches the decode step leaves out (0: none), so that the step time without them shows what
  // they cost inside the graph. Their outputs keep stale values, so the tokens decoded are
  // meaningless. The captured decode graphs are dropped and captured again.
  void set_decode_skip(unsigned ops);

  size_t device_bytes() const;  // weights + cache + activations held on the device
  // Bytes a batch-1 decode step must read at the current length: the weights of the active path
  // (attention, router, the chosen experts — one per layer at top-1 — the LM head and the token's
  // embedding row) plus the K/V cache up to the current length. For the bandwidth roofline.
  double decode_bytes_per_step() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// zaya::generate (engine/decoder.h) over this engine, batch 1: prefill the prompt, then decode with
// sampling on the host (or, when opt.greedy, on the device, up to 8 steps enqueued at a time: a
// stop token leaves at most 7 steps decoded past it, unused). Defined in cuda_decoder_cuda.cpp.
std::vector<int32_t> generate_cuda(CudaInference& inf, const std::vector<int32_t>& prompt,
                                   int64_t max_new, const SamplingOptions& opt,
                                   int32_t stop_id = -1,
                                   const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace zaya::cuda
