// Kernels of cached decoding on the GPU (one new token per sequence per step), written so that a
// whole decode step can be captured once in a CUDA graph and replayed: nothing here takes the
// sequence position as an argument; it is read from a device counter (len_B, tokens already in
// the cache of each sequence), which the step itself advances at its end.
//
// Decoding at small batch is bound by reading the weights, so the matrix-vector products here are
// warp-per-output-row kernels with 16-byte loads that stream each weight row once for all M rows
// (M <= 8), instead of GEMMs. The expert products pick each row's expert on the device (from the
// router's choice), so no host round trip is needed per layer.
//
// Legend as in ops.h; M rows = B sequences (one token each); cap the cache capacity per sequence.
// All pointers are device pointers; all functions only enqueue work on the stream.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/decode/decode_policy.h"

namespace zaya::cuda {

using bf16 = __nv_bfloat16;

// Largest M the matrix-vector kernels take (decode batch).
constexpr int kGemvMaxRows = 8;

// Every launcher below takes the DecodePolicy (decode_policy.h) it launches under, last; callers
// that pass none get the default one.
// Whether launches under `policy` use programmatic dependent launch on the current device.
bool decode_pdl_active(const DecodePolicy& policy = {});

// Where a decode kernel stamps the trace: as it passes its programmatic-dependency wait (the
// kernel kinds), and the router also after each of its stages (cluster barriers) and its choice.
enum class DecodeTraceEvent : unsigned {
  Gemv,           // gemv_bf16 (q|k|v, o projection, LM head)
  GemvF32,        // gemv_f32
  ExpertSwiglu,   // decode_experts, first launch
  ExpertDown,     // decode_experts, second launch
  ExpertActDone,  // decode_experts, first launch: block 0 has stored its act rows
  CcaConv,
  CcaFinish,
  Attention,
  AttnScores,    // chunk 0 of the first kv head: its scores are in shared memory
  AttnPV,        // chunk 0 of the first kv head: its P·V sums are in registers
  AttnPartials,  // chunk 0 of the first kv head has stored its partials (before the counter)
  AttnCombine,   // the combining block of the first kv head starts the combine
  Norm,          // decode_residual_norm
  Router,
  RouterSums,    // the first warp's first down-projection sum done (before its cluster exchange)
  RouterDown,    // after the down projection and EDA (every block's v complete)
  RouterFc1,     // after fc1 + GELU
  RouterFc2,     // after fc2 + GELU
  RouterLogits,  // after the class logits (before the softmax and choice)
  RouterSelect,  // after the logits, softmax and choice
  Argmax,
  ArgmaxFinal,
  Advance,
  Count
};
const char* decode_trace_event_name(DecodeTraceEvent ev);
// Whether this build has the decode trace (CMake option ZAYA_DECODE_TRACE, off by default).
bool decode_trace_built();
// Turns the decode trace on (buf: a zero-filled device buffer of 1 + capacity 64-bit words; [0]
// counts the stamps, then each is (global timer ns << 8) | event, in the order the atomics landed)
// or off (nullptr). A timing instrument: one thread per launch adds an atomic round trip. Applies
// to every later launch on the current device, graph replays included. Without the trace built in,
// turning it on throws zaya::Error.
void set_decode_trace(unsigned long long* buf, size_t capacity);

// y[m,o] = Σ_k x[m,k] W[o,k] (+ bias[o]) for m < M <= kGemvMaxRows. W bf16 [O, ldw] (ldw >= K,
// K a multiple of 8), x bf16 [M, K] (row stride ldx); y fp32 or bf16 [M, ldy]. fp32 accumulation.
// early_trigger: as decode_residual_norm's (only for a next launch whose prologue reads weights
// only). stage_x: each block copies the M input rows into shared memory once after its wait and
// reads them there (where they fit 48 KB; the same bits).
void gemv_bf16(float* y_f32, bf16* y_bf16, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
               int64_t ldw, const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
               bool early_trigger = false, bool stage_x = false, const DecodePolicy& policy = {});
// The same with fp32 weights and inputs (the router MLP, which stays fp32).
void gemv_f32(float* y, int64_t ldy, const float* x, int64_t ldx, const float* W, int64_t ldw,
              const float* bias, int64_t M, int64_t O, int64_t K, cudaStream_t st,
              const DecodePolicy& policy = {});
// The experts of decode rows, two launches: act = silu(x·Wg_e^T) ⊙ (x·Wu_e^T) with e = choice[m]
// (packed gate|up rows [E, 2I, D]), then out[m] = gate[m] · act[m]·Wd_e^T ([E, D, I]); rows whose
// choice is the skip class (>= E) get gate[m]·x[m] (skip_scaled_input) or 0. x, act, out bf16.
// stage_x (16-byte path): each block of the SwiGLU launch copies its row of x, and each block of
// the down launch its row of act, into shared memory once and its warps read it there; the same
// bits. down_rows (with stage_x): output rows per block of the down launch, 8, 4 or 2 (smaller
// blocks fit beside the SwiGLU launch's blocks sooner); the same bits.
void decode_experts(bf16* out_MD, bf16* act_MI, const bf16* x_MD, const bf16* gate_up_E2ID,
                    const bf16* down_EDI, const float* gate_M, const int32_t* choice_M, int64_t E,
                    bool skip_scaled_input, int64_t M, int64_t D, int64_t I, cudaStream_t st,
                    bool stage_x = false, int down_rows = 8, const DecodePolicy& policy = {});

// The CCA convolutions for one token per sequence (cca_conv_fwd with S = 1): the depthwise conv
// (kernel t0) over hist_BPC (P = (t0−1)+(t1−1) earlier rows, fp32 [B,P,C]) and the token's q0|k0
// channels of qkv (row stride ld), then the grouped conv (kernel t1, d×d per head group) into y
// fp32 [M,C]. hist is only read: decode_qkv_finish advances it. Needs d % 8 == 0, M <= 8.
void decode_conv(float* y_MC, const bf16* qkv, int64_t ld, const float* hist_BPC,
                 const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1, const float* bg_C,
                 int64_t M, int64_t C, int64_t d, int64_t t0, int64_t t1, cudaStream_t st,
                 const DecodePolicy& policy = {});
// After the convolutions, for one token per sequence at position len_B[b]: mean skip, QK-norm
// (temperature on k), partial NeoX RoPE, delayed value (vd_last_B holds vd of the previous token
// and is updated), and the new k, v appended to the cache at index len_B[b]. q out bf16 [M,Hq,d];
// k/v cache bf16 [B, cap, Hkv, d]. Also advances the conv history hist_BPC (P rows per sequence;
// null or P = 0: none) by this token's q0|k0 channels, after decode_conv has read it.
void decode_qkv_finish(bf16* q_MHd, bf16* kcache, bf16* vcache, float* vd_last_B, float* hist_BPC,
                       int64_t P, const float* conv_MC, const bf16* qkv, int64_t ld,
                       const float* temp_G, const int32_t* len_B, int64_t cap, float theta,
                       int64_t r, int64_t M, int64_t Hq, int64_t Hkv, int64_t d, cudaStream_t st,
                       const DecodePolicy& policy = {});
// Split-context attention of one query per sequence over keys 0..len_B[b] (causal, optional
// sliding window), fp32 softmax, in one launch: chunk partials in ws, combined by the last block of
// each (sequence, kv head) through a counter in ws. ws: decode_attention_workspace_bytes, zero-
// filled once before the first call (the kernel leaves its counters at zero again). o bf16
// [M,Hq,d]; d 32, 64 or 128; M <= 8. chunk: keys per split block (a multiple of 16 up to 256); 0
// picks it from the cache capacity (about one block per SM in all). pipe: 16-key passes whose K
// rows are loaded together (1, 2 or 4); the same scores in the same order either way. len_B is
// read before the launch's programmatic-dependency wait: the kernel launched just before this one
// must not write it (in a decode step only the step's last launch, advance_lengths, does).
// exact_heads: a kernel compiled for exactly 4 query heads per kv head where that, d = 128 and
// pipe 1 or 2 apply (smaller code; the same bits). trigger_at: where each block lets the next
// launch start under programmatic dependent launch — 0 right after its wait, 1 once its scores
// are computed, 2 once its partials are stored; the same bits.
size_t decode_attention_workspace_bytes(int64_t M, int64_t Hq, int64_t d, int64_t cap);
void decode_attention(bf16* o_MHd, const bf16* q_MHd, const bf16* kcache, const bf16* vcache,
                      const int32_t* len_B, int64_t cap, int64_t window, int64_t M, int64_t Hq,
                      int64_t Hkv, int64_t d, void* ws, cudaStream_t st, int chunk = 0,
                      int pipe = 1, bool exact_heads = false, int trigger_at = 0,
                      const DecodePolicy& policy = {});
// Decode rows (block per row): h = (a + hb)⊙hs + (h + rb)⊙rs in place (skipped when a is null),
// then y = norm_w ⊙ h · rstd in bf16 — residual_scale_rmsnorm_fwd / rmsnorm_fwd for a few rows.
// early_trigger: under programmatic dependent launch the next launch may start its prologue before
// this one waits on its own predecessor; only for a next launch
// whose prologue reads nothing a running kernel writes. The same bits either way.
void decode_residual_norm(float* h_MD, bf16* y_MD, const bf16* a_MD, const float* hs_D,
                          const float* hb_D, const float* rs_D, const float* rb_D,
                          const float* norm_w_D, float eps, int64_t M, int64_t D, cudaStream_t st,
                          bool early_trigger = false, const DecodePolicy& policy = {});
// Copies S new k and v rows per sequence (bf16 [B,S,Hkv,d]) into the cache at offset `past`
// (prefill: the host knows the position; a plain launch).
void kv_append(bf16* kcache, bf16* vcache, const bf16* k, const bf16* v, int64_t past, int64_t cap,
               int64_t B, int64_t S, int64_t Hkv, int64_t d, cudaStream_t st,
               const DecodePolicy& policy = {});
// ids_out[m] = argmax_v logits[m,v] (ties to the lowest id); logits fp32 [M, V]. Two passes over
// slices of each row (ws: argmax_workspace_bytes(M)). hist (optional, with len_B): the token is
// also written to hist[len_B[m]·M + m] — a history by position that a decode step fills without a
// copy of its own (len_B as the step has it: not yet advanced).
size_t argmax_workspace_bytes(int64_t M);
void argmax_rows(int32_t* ids_out, const float* logits_MV, int64_t M, int64_t V, void* ws,
                 cudaStream_t st, int32_t* hist = nullptr, const int32_t* len_B = nullptr,
                 const DecodePolicy& policy = {});
// The greedy end of a decode step in two launches: logits = gemv_bf16 of x by W ([V, D], the tied
// LM head; the same bits), each block folding its rows' best (logit, index) into keys_M (zero
// before the first call; each call leaves them at zero again) with an atomic max, then one small
// launch that writes each row's token (the largest logit, ties to the lowest index; a NaN logit
// outranks every number) to ids_out and, when set, hist[len_B[m]·M + m], and advances len_B by
// one — argmax_rows followed by advance_lengths(len_B, 1, M) in two launches instead of three.
// lm_head_greedy_supported: M <= 8, D a multiple of 8, 16-byte aligned x and W rows.
// stage_x: each block copies the M input rows into shared memory once and its warps read them
// there (where they fit 48 KB); no_l1: the head's rows are loaded without allocating in L1, which
// then keeps the input rows. The same bits either way.
bool lm_head_greedy_supported(int64_t M, int64_t V, int64_t D, const bf16* x, int64_t ldx,
                              const bf16* W);
void lm_head_greedy(float* logits_MV, const bf16* x, int64_t ldx, const bf16* W, int64_t M,
                    int64_t V, int64_t D, unsigned long long* keys_M, int32_t* ids_out,
                    int32_t* hist, int32_t* len_B, cudaStream_t st, bool stage_x = false,
                    bool no_l1 = false, const DecodePolicy& policy = {});
// The decode step's first launch: h = (table[ids[m]] + b)⊙s (embed_affine_fwd: an id outside
// [0, V) gives a zero row and sets bad_id_flag to the first such row + 1), then
// y = norm_w ⊙ h · rstd (decode_residual_norm with a null) — one launch, the same bits as the two.
// decode_embed_norm_supported: D a multiple of 4 up to 4096 and 16-byte aligned pointers.
bool decode_embed_norm_supported(int64_t D, std::initializer_list<const void*> ptrs);
void decode_embed_norm(float* h_MD, bf16* y_MD, const int32_t* ids_M, const bf16* table_VD,
                       const float* s_D, const float* b_D, int32_t* bad_id_flag,
                       const float* norm_w_D, float eps, int64_t M, int64_t D, int64_t V,
                       cudaStream_t st, const DecodePolicy& policy = {});
// The router of decode rows in one launch (a thread-block cluster per row on sm_90): the down
// projection r = x·W_down^T + b (x bf16 [M,D] with row stride ldx, W_down bf16 [R,D], fp32 out),
// r += state ⊙ scale (EDA; state null in layer 0; r_MR keeps the result as the next layer's
// state), RMSNorm, fc1 + exact GELU, fc2 + GELU, class logits, fp32 softmax (probs), choice =
// argmax of probs + balancing bias (ties to the lowest class), gate = probs[choice].
// max_cluster: the largest cluster the launch may use (1, 2, 4, 8, 16; 0: 16); the results do
// not depend on it.
void decode_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, cudaStream_t st, int max_cluster = 0,
                   const DecodePolicy& policy = {});
// How the router is laid out on the device; timing only, the results do not depend on it.
struct DecodeRouterLayout {
  int max_cluster = 0;      // as above
  bool stage_mlp = true;    // fc1/fc2 rows and the class rows copied into shared memory first
  bool one_per_sm = false;  // shared memory padded so that no two blocks of a cluster share an SM
  // fc1/fc2 rows and the class rows loaded into registers before the wait instead (where R is a
  // multiple of 32 up to 256, E + 1 ≤ 24 and the cluster leaves ≤ 16 rows per block; else the
  // layout above); the same bits.
  bool mlp_regs = false;
  // The stages' results exchanged with st.async stores counted on an mbarrier per stage instead
  // of generic stores and a cluster barrier (whose release compiles to a GPU-scope memory
  // barrier) after each stage; only where the cluster has more than one block. The same bits.
  bool async_exchange = false;
  // The block's row of x copied into shared memory once after the wait and read there by its warps
  // (with mlp_regs and async_exchange, where they apply); the same bits.
  bool stage_x = false;
};
void decode_router(float* r_MR, float* probs_ME1, int32_t* choice_M, float* gate_M,
                   const bf16* x_MD, int64_t ldx, const bf16* down_w_RD, const float* down_b_R,
                   const float* state_MR, const float* scale_R, const float* norm_w_R, float eps,
                   const float* fc1_w, const float* fc1_b, const float* fc2_w, const float* fc2_b,
                   const float* out_w, const float* balancing_E1, int64_t M, int64_t D, int64_t R,
                   int64_t E1, cudaStream_t st, const DecodeRouterLayout& layout,
                   const float* r0_MR = nullptr, const DecodePolicy& policy = {});
// With r0_MR: the down projection's sums x·W_down + b of every row were computed by
// decode_norm_gemv, the launch before; the router starts from them (its form with registers and
// st.async: decode_router_pre_down_supported), the same bits.
bool decode_router_pre_down_supported(int64_t R, int64_t E1, const DecodeRouterLayout& layout);
// A residual norm (decode_residual_norm's arithmetic and bits) and the GEMV that reads it in one
// launch of ⌈O/8⌉ blocks per row: each block computes the whole norm of its row, then 8 of the
// O outputs out[m, o] = x[m]·W[o] (+ bias[o]) (gemv_bf16's sums; fp32 out32 or bf16 out16, row
// stride ldo) from rows loaded before its wait. The residual goes from h_in to h_out (not
// aliased); x is stored to y_MD when set. decode_norm_gemv_supported: D a multiple of 8 up to
// 4096, 16-byte aligned pointers. The decode step computes the router's down-projection sums
// (decode_router's r0_MR) with it.
bool decode_norm_gemv_supported(int64_t D, std::initializer_list<const void*> ptrs);
void decode_norm_gemv(const float* h_in_MD, float* h_out_MD, bf16* y_MD, const bf16* a_MD,
                      const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                      const float* norm_w_D, float eps, const bf16* W_OD, const float* bias_O,
                      float* out32, bf16* out16, int64_t ldo, int64_t M, int64_t D, int64_t O,
                      cudaStream_t st, bool early_trigger, const DecodePolicy& policy = {});
// len_B[b] += n for every sequence.
void advance_lengths(int32_t* len_B, int32_t n, int64_t B, cudaStream_t st,
                     const DecodePolicy& policy = {});

}  // namespace zaya::cuda
