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

#include "core/tensor.h"
#include "model/sampling.h"
#include "model/zaya.h"

namespace zaya::cuda {

// Choices of the decode step that change its speed (and, for the attention's chunking, the order
// of the split-context sums, not what they compute).
struct DecodeTuning {
  // Keys per split-context attention block (a multiple of 16 up to 256); 0: chosen from the cache
  // capacity (decode_attention).
  int attn_chunk = 0;
  // 16-key passes of an attention block whose K rows are loaded together (1, 2 or 4; 2 covers a
  // 32-key chunk, the automatic size at ~1K keys, in one round trip after the wait); the same
  // bits. Measured on the H200 (8 layers, 1,097 keys, one process, 2026-12-05): 2 passes 0.6105
  // against 0.6170 ms/step with the router's cluster barriers, 0.5945 against 0.6031 with its
  // st.async exchange — the default.
  int attn_pipe = 2;
  // The attention's combining block stages the chunk partials in shared memory beside its (max,
  // sum) pass (decode_attention's stage_combine); the same bits.
  bool attn_stage_combine = false;
  // The attention as one thread-block cluster per (sequence, kv head): up to 16 blocks of 16
  // warps, each taking one chunk of the cache in one round of loads, combined in the first block's
  // shared memory (decode_attention's cluster form; only with attn_chunk 0). Not the split form's
  // bits (other chunk sizes); checked against the CPU reference.
  bool attn_cluster = false;
  // The largest thread-block cluster of the router launch (1, 2, 4, 8 or 16); 0: the largest the
  // device schedules. Results do not depend on it.
  int router_cluster = 0;
  // The router's MLP rows staged in shared memory (true) or read where they are, and its shared
  // memory padded so that every block of its cluster has an SM to itself. Results do not depend
  // on either.
  bool router_stage = true;
  bool router_one_per_sm = false;
  // The router's fc1/fc2 rows and class rows loaded into registers before its wait instead of
  // staged in shared memory (DecodeRouterLayout::mlp_regs; where the sizes allow). The same bits.
  // Measured on the H200 (8 layers, 1,097 keys, one process): 0.6421 against 0.6527 ms/step
  // (attention split), 0.6472 against 0.6653 (attention cluster) — the default.
  bool router_mlp_regs = true;
  // The router's stages hand their results to the cluster's other blocks with st.async stores
  // counted on an mbarrier per stage (DecodeRouterLayout::async_exchange) instead of stores and a
  // cluster barrier per stage, whose release is a GPU-scope memory barrier (MEMBAR.ALL.GPU in the
  // SASS: Nsight Compute put 13% of the router's stall cycles on it, and 9% on barriers). The
  // same bits. Measured on the H200 (8 layers, 1,097 keys, one process, 2026-12-05): 0.6031
  // against 0.6170 ms/step (one attention pass in flight), 0.5945 against 0.6105 (two) — the
  // default.
  bool router_async = true;
  // The post-attention and post-MLP residual norms in the last block of the o projection and of
  // the expert combine (true), or as launches of their own (false, the default: 0.669 against
  // 0.698 ms per step on the H200, docs/PERFORMANCE.md); the same bits.
  bool fuse_norms = false;
  // The post-MLP residual norm computed by every block of the next layer's q|k|v GEMV at its start
  // instead of by a launch of its own (the last layer's, into the final norm, keeps its launch);
  // the residual then alternates between two buffers. The same bits; not with fuse_norms.
  bool fold_qkv_norm = false;
  // Early triggers: the residual-norm launches (norm_early_trigger) and the o projection
  // (oproj_early_trigger) let their successor (the router; the next q|k|v GEMV or the LM head;
  // the post-attention norm) start before they wait on their own predecessor, not after, so the
  // successor's prologue (its weights; the router's cluster start and staging) overlaps two
  // launches instead of one — with both, the router starts during the attention. Only these
  // launches do it: their successors' prologues read weights only (the o projection only when
  // its norm is a launch of its own, i.e. without fuse_norms). The same bits. Measured on the H200
  // (8 layers, 1,097 keys, one process): norms early 0.6595 ms/step, neither 0.6682, o projection
  // early 0.6694, both 0.6765 (the attention slows by ~2 µs per layer while the o projection, the
  // norm and the router start beside it) — so the norms' early trigger is the default.
  bool norm_early_trigger = true;
  bool oproj_early_trigger = false;
  // With norm_early_trigger: whether the post-MLP norm (whose successor, the next q|k|v GEMV,
  // streams 6.5 MB of weight rows in its prologue at ZAYA1's size, beside the expert-down
  // launch's own dependent loads) triggers early too (true), or after its wait (false) while the
  // post-attention norm keeps its early trigger. The same bits. Measured on an H100 (2026-12-05,
  // one process): after its wait +3.5 to +6 µs per 8-layer step, within noise at 40 layers — so
  // early, as the other norms.
  bool mlp_norm_early_trigger = true;
  // The q|k|v and o GEMVs copy their input rows (M×K bf16) into shared memory once per block
  // after the wait, instead of every warp reading them from global memory (eight warps of a block
  // requesting the same lines at once). The same bits. Measured on the H200 (one process,
  // alternating): 0.6616/0.6622 against 0.6636/0.6628 ms/step in 2026-12-03's chain (within
  // noise); with 2026-12-05's defaults 0.5805/0.5816 against 0.5861/0.5864 — the default since.
  bool gemv_stage_x = true;
  // The expert SwiGLU and down launches stage their input row (x; act) in shared memory the same
  // way (decode_experts' stage_x; the SwiGLU's copy rides with the choice's load). The same bits.
  // Measured on an H100 (2026-12-05, one process): 0.6915 against 0.7112 ms/step, and 0.6573
  // against 0.6756 with router_down_in_norm — the default.
  bool expert_stage_x = true;
  // Output rows (warps) per block of the expert-down launch with staged input rows: 8, 4 or 2.
  // The SwiGLU launch's blocks (82 registers a thread, 256 threads) leave room for about one
  // 256-thread down block per SM while they run, so half of the down launch only starts loading
  // its 8 MB of rows once SwiGLU blocks retire; smaller blocks fill the room left more finely, at
  // the cost of more copies of act into shared memory. The same bits. Measured slower on the H200
  // (2026-12-05, one process): 4 rows +11 µs/step, 2 rows +9 µs against 8 (0.5320 ms/step).
  int expert_down_rows = 8;
  // The router's row of x staged the same way (DecodeRouterLayout::stage_x; with router_mlp_regs
  // and router_async). The same bits. Measured on an H100 (2026-12-05, one process): 0.6991
  // against 0.7112 ms/step — the default where router_down_in_norm does not apply (with it the
  // router reads no x).
  bool router_stage_x = true;
  // The post-attention residual norm's launch also computes the router's down-projection sums
  // (decode_norm_gemv: ⌈R/8⌉ blocks per row, each the whole norm and then 8 of the sums from rows
  // loaded before its wait), and the router starts from them (decode_router's r0): its blocks no
  // longer stream the 1 MB of down-projection rows through 16 SMs after their wait, load x or
  // exchange the first stage. The residual moves to the other buffer at that norm. Only with the
  // router's default layout (mlp_regs, async, automatic cluster, not one per SM) and without
  // router_norm or fuse_norms. The same bits. Measured on an H100 (2026-12-05, one process, two
  // rounds): 0.6816/0.6827 against 0.7108/0.7092 ms/step — the default.
  bool router_down_in_norm = true;
  // The post-MLP residual norm computed by the next layer's q|k|v projection launch
  // (decode_norm_gemv: every block the whole norm with its vectors in registers, x in shared
  // memory, then 8 of the q|k|v rows loaded before its wait), the launch of its own gone; the
  // residual alternates between two buffers. fold_qkv_norm's aim with a lighter block (it staged
  // the five vectors, 40 KB, in shared memory in each of the GEMV's blocks). Not with
  // fold_qkv_norm or fuse_norms. The same bits. Measured on an H100 (2026-12-05, one process):
  // −5 to −7 µs/step alone and beside router_down_in_norm in one call, +1.5 to +4.5 µs beside
  // both that and expert_stage_x in the next — off until the H200 decides.
  bool qkv_norm_gemv = false;
  // The step's ends in fewer launches: the LM head's GEMV folds its argmax into per-block atomics
  // and one small launch commits the token and the lengths (lm_head_greedy: two launches instead
  // of the GEMV, two argmax passes and the length update), and the next step's embedding and first
  // norm are one launch (decode_embed_norm). The same bits. Measured on the H200 (8 layers, 1,097
  // keys, one process, 2026-12-03): 0.6283 against 0.6365 ms/step — the default.
  bool fused_step_ends = true;
  // The CCA convolutions and the finish (mean skip, QK-norm, RoPE, cache writes) as one launch of
  // one block per head (decode_conv_finish) instead of two. The same bits. Measured slower on the
  // H200 (same run): 0.6754 against 0.6283 ms/step — ten blocks do the work that the two
  // launches spread over the whole GPU (finish to attention 11.6 µs per layer against 2.7 + 3.8).
  bool fuse_cca = false;
  // The split attention kernel compiled for the model's query heads per kv head (4, with d = 128
  // and one pass in flight) instead of for up to 8 with a runtime bound: about half of its
  // per-head loops' code. A measurement of how far the decode kernels' code size (the attention's
  // is ~72 KB of SASS, this one 53 KB) shows in their latency. The same bits. Measured on the
  // H200 (8 layers, 1,097 keys, one process, alternating, 2026-12-04): 0.6165/0.6158/0.6160
  // against 0.6272/0.6255/0.6253 ms/step — the default.
  bool attn_exact_heads = true;
  // Where each split-attention block lets the o projection's launch start (decode_attention's
  // trigger_at): 0 right after its wait, 1 once its scores are computed, 2 once its partials are
  // stored. A later trigger keeps the o projection's prologue (its 4 MB of weight rows) from
  // competing with the attention's own dependent loads (wait → scores took 4.1 µs per layer in an
  // H100 trace of 2026-12-05, for one round trip of loads), at the risk of those rows arriving
  // after the o projection's wait. The same bits. Measured on the H200 (2026-12-05, one process,
  // alternating): 8 layers 0.5312/0.5359/0.5361 ms/step at 0, 0.5273/0.5319/0.5274/0.5343 at 2,
  // 0.5269/0.5334 at 1 (within the ±3 µs noise); the 40-layer model 1.7342/1.7334 at 0 against
  // 1.6975/1.7164 at 2 — 2 is the default.
  int attn_trigger = 2;
  // The CCA finish (mean skip, QK-norm, RoPE, cache and history writes) folded into the split
  // attention launch (decode_attention_finish): each attention block finishes its kv head's group
  // itself after the wait, so q never goes through memory and the finish's launch, with its kernel
  // boundary on the critical path (~3.9 µs from the finish passing its wait to the attention
  // passing its own, in the trace of 2026-12-04), is gone. Not with fuse_cca. The same bits.
  // Measured slower on the H200 (2026-12-05, one process): +8 to +17 µs/step in every
  // combination with the other choices of that run (0.6269 against 0.6170 ms/step alone).
  bool attn_finish = false;
  // The expert SwiGLU and down products as one launch with a grid barrier between them
  // (decode_experts' one-launch form, where it applies; not with fuse_norms): the down rows load
  // beside the SwiGLU rows instead of after the first launch, whose 16 MB of rows held in
  // registers leave room for only part of the down launch's blocks. The same bits. Measured
  // slower on the H200 (2026-12-04): 0.6392/0.6378 against 0.6324/0.6328 ms/step.
  bool fuse_experts = false;
  // The expert-down launch's prologue puts its weight rows into shared memory with cp.async
  // instead of registers (decode_experts' down_smem): ~30 instead of ~50 registers a thread, so
  // that more of the launch can be resident beside the SwiGLU launch (82 registers a thread, 2–3
  // blocks an SM) and stream its rows while the SwiGLU runs. The same bits. Measured slower on
  // the H200 (2026-12-05, one process): +9 µs/step under the driver's carveout (0.6000 against
  // 0.5908 ms/step), +65 µs with the two expert launches asking for the largest one.
  bool expert_down_smem = false;
  // The SwiGLU launch hints the chosen expert's down rows (8 MB at ZAYA1's size) towards L2 once it
  // has read the router's choice (decode_experts' down_l2), so that the down launch's blocks that
  // only become resident as SwiGLU blocks retire (its 50 registers a thread beside the SwiGLU's
  // 82 leave room for about half of them) load their rows from L2. The same bits. Not yet measured
  // on a GPU: off.
  bool expert_down_l2 = false;
  // The post-attention residual norm computed by the router's cluster instead of a launch of its
  // own between the o projection and the router (decode_router's norm_in): each of the cluster's
  // blocks computes its share of the row and sends it to the others by st.async, so the norm's
  // kernel boundary and its round trips leave the critical path. Only with router_async and
  // router_mlp_regs (else the norm keeps its launch); not with fuse_norms. The same bits. Not yet
  // measured on a GPU: off.
  bool router_norm = false;
  // The preferred shared-memory carveout of every decode kernel (set_decode_smem_carveout): -1
  // leaves it to the driver per kernel; 0–100 percent asks the same split of all of them, so that
  // a kernel's blocks never wait for an SM to drain before its L1/shared split can change. The
  // same bits. Measured on the H200 (2026-12-05, one process): 100% 0.6586, 0% 0.5938 against
  // 0.5908 ms/step with the driver's choice — the largest split's small L1 costs far more than
  // any mismatch between neighbours, so the driver's choice stays.
  int smem_carveout = -1;
  // The weight streams of the decode kernels (the q|k|v and o GEMVs, the experts, the LM head)
  // loaded with L2 evict_first priority, so that the ~1.4 GB they stream through the 50 MB L2
  // each step displace each other before the kernels' code, the KV cache and the activations
  // (set_decode_weights_evict_first). The same bits. Measured on the H200 (2026-12-04, one
  // process, alternating): 0.6184/0.6180 against 0.6161/0.6151 ms/step without — +2.5 µs, off.
  bool weights_evict_first = false;
  // The LM head's GEMV loads each warp's row before its programmatic-dependency wait (as the
  // q|k|v and o GEMVs do), so that its first wave — launched while the last residual norm waits
  // on the experts, by that norm's early trigger — has ~34 MB of the head's 1.07 GB in flight
  // before the final hidden state lands. The same bits. Measured on the H200 (2026-12-04, three
  // calls): +3 to +4 µs/step in one, −2.5 and −3.4 µs in two others — within the noise, off.
  bool lm_head_prefetch = false;
  // The LM head's greedy GEMV as one resident grid whose warps stride over the head's rows with
  // the next row's loads in flight (lm_head_greedy's persistent form) instead of ~32K one-row-
  // per-warp blocks in ~31 waves: it streams the 1.07 GB at ~4.49 TB/s against the ~4.69 TB/s
  // of reads `zaya bench mem` measures. The same bits. Measured on the H200 (2026-12-04):
  // 0.691–0.706 against 0.612–0.615 ms/step (+80–90 µs), off. Likely causes, not separated: at
  // 105 registers two 8-warp blocks fit an SM (32 rows in flight against ~40 for five blocks of
  // the one-row-per-warp launch at 48), and each warp's rows lie a grid apart in memory, where
  // the waves of that launch walk the matrix in order.
  bool lm_head_persistent = false;
  // The LM head's blocks copy the input row into shared memory once and their warps read it there
  // (lm_head_stage_x), and the head's rows are loaded without allocating in L1 (lm_head_no_l1), so
  // that the 1.07 GB streamed through L1 does not evict the input row every warp reads (each
  // warp's 4 KB of x would otherwise come from L2 as often as its 4 KB of weights). The same bits.
  // Measured on an H100 (2026-12-05, one process, two rounds): both 0.6664/0.6648 against
  // 0.6726/0.6673 ms/step, either alone within ±3 µs of neither — both the default.
  bool lm_head_stage_x = true;
  bool lm_head_no_l1 = true;
  // MiB of the LM head's first rows kept in L2 across steps (a persisting access policy window on
  // its launch, with fused_step_ends; clamped to the device's set-aside limit); 0: none. The
  // same bits. Measured slower on the H200 (same run): 32 MiB 0.6362 against 0.6283 ms/step.
  int lm_head_l2_mib = 0;
  // A timing experiment, never for real decoding: the op classes (bits 1 << DecodeOp) whose
  // launches the decode step leaves out, so that the step time without them shows what they cost
  // inside the graph. Their outputs keep stale values, so the tokens decoded are meaningless.
  unsigned skip = 0;
};

// The op classes of a decode step, for DecodeTuning::skip (names: decode_op_name).
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
  DecodeTuning decode;
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

  // Changes the decode choices (the captured decode graph is dropped and captured again).
  void set_decode_tuning(const DecodeTuning& t);

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
