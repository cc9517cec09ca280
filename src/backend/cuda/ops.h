// The CUDA ops of the ZAYA1 training step and of inference: the GPU counterparts of the CPU
// reference ops in backend/cpu/ops.h, which are their specification (tests/gpu compares each one
// with the reference on fresh random inputs, forward and backward).
//
// Numerics (DESIGN.md §Numerics): activations that feed GEMMs and the attention kernels are bf16;
// the residual stream h, norm statistics (rstd), softmax statistics (lse), router logits and
// probabilities, all gradients of parameters and the optimizer states are fp32; every reduction
// accumulates in fp32. Parameter-gradient reductions over tokens are deterministic: no
// floating-point atomics whose order varies (per-block partial sums over a fixed grid, then a
// second pass that sums the partials in a fixed order), so a training step is bit-reproducible on
// one GPU.
//
// Conventions: all pointers are device pointers unless named *_host; every function takes the
// stream last and only enqueues work (no synchronisation, no allocation) unless its comment says
// otherwise. Workspace comes from the caller (see Workspace below), so a step allocates nothing.
// Row-major throughout; a "row" of an activation is one token. Shapes are in the suffix of each
// name (legend as in ops.h: N tokens, B batch, S sequence, D hidden, C conv channels = (Hq+Hkv)·d,
// Hq/Hkv heads, d head dim, r rotary dim, E experts, E1 = E+1 router classes, I expert width, R
// router width, V vocabulary). Gradients: "(=)" overwrites, "(+=)" accumulates.
//
// This header includes only the CUDA runtime and bf16 types; it compiles as C++17 (nvcc) and C++20.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zaya::cuda {

using bf16 = __nv_bfloat16;

// A bump allocator over one device buffer, reset by its owner once per step. Kernels that need
// scratch (partial sums, sort buffers) take a Workspace& and carve from it; they report the bytes
// they need through a *_workspace_bytes function so the owner can size the arena once at start-up.
struct Workspace {
  char* base = nullptr;
  size_t capacity = 0;
  size_t used = 0;
  // 256-byte aligned; throws zaya::Error naming the request and the capacity when it does not fit.
  void* take(size_t bytes);
  template <typename T>
  T* take_n(size_t n) {
    return static_cast<T*>(take(n * sizeof(T)));
  }
  void reset() { used = 0; }
};

// ---- conversions --------------------------------------------------------------------------------
void f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s);
void bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s);
// y[i] += x[i] (fp32), for accumulating gradient pieces.
void add_f32(float* y, const float* x, int64_t n, cudaStream_t s);

// ---- embedding and the input affine
// -------------------------------------------------------------- h[n,:] = (table[ids[n],:] + b) ⊙ s
// (table bf16 copy of the fp32 master; h fp32). Ids outside [0,V) set *bad_id_flag (device int) to
// 1 + the first offending position and produce zeros.
void embed_affine_fwd(float* h_ND, const int32_t* ids_N, const bf16* table_VD, const float* s_D,
                      const float* b_D, int32_t* bad_id_flag, int64_t N, int64_t D, int64_t V,
                      cudaStream_t st);
// Given dh: de = dh ⊙ s (the embedding-row gradient); ds += Σ_n dh⊙(e+b); db += Σ_n dh⊙s;
// dtable[ids[n],:] += de[n,:] — deterministic (tokens sorted by id, each row summed in token
// order). Workspace: embed_affine_bwd_workspace_bytes.
size_t embed_affine_bwd_workspace_bytes(int64_t N, int64_t D, int64_t V);
void embed_affine_bwd(float* dtable_VD, float* ds_D, float* db_D, const float* dh_ND,
                      const int32_t* ids_N, const bf16* table_VD, const float* s_D,
                      const float* b_D, int64_t N, int64_t D, int64_t V, Workspace& ws,
                      cudaStream_t st);

// ---- RMSNorm and residual scaling
// ------------------------------------------------------------------ y = w ⊙ x · rstd, rstd =
// 1/sqrt(mean(x²)+eps); x fp32, y bf16 (a GEMM operand), rstd saved.
void rmsnorm_fwd(bf16* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                 int64_t N, int64_t D, cudaStream_t st);
// Same with an fp32 output (the router's norm, whose output feeds fp32 router math).
void rmsnorm_fwd_f32(float* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                     int64_t N, int64_t D, cudaStream_t st);
// dx (= or += by `accumulate`; dx may be null when only dw is wanted), dw (+=, may be null). dy is
// bf16 (the dgrad GEMM output) or fp32 (_f32 variant); a non-accumulating fp32 dx may alias dy.
size_t rmsnorm_bwd_workspace_bytes(int64_t N, int64_t D);
void rmsnorm_bwd(float* dx_ND, float* dw_D, const bf16* dy_ND, const float* x_ND, const float* w_D,
                 const float* rstd_N, bool accumulate, int64_t N, int64_t D, Workspace& ws,
                 cudaStream_t st);
void rmsnorm_bwd_f32(float* dx_ND, float* dw_D, const float* dy_ND, const float* x_ND,
                     const float* w_D, const float* rstd_N, bool accumulate, int64_t N, int64_t D,
                     Workspace& ws, cudaStream_t st);
// ZAYA1 residual scaling fused with the next RMSNorm:
//   h_out = (a + hb) ⊙ hs + (h + rb) ⊙ rs      (a bf16: the block output; h, h_out fp32; may alias)
//   y = norm_w ⊙ h_out · rstd                  (skipped when y is null)
void residual_scale_rmsnorm_fwd(float* h_out_ND, bf16* y_ND, float* rstd_N, const bf16* a_ND,
                                const float* h_ND, const float* hs_D, const float* hb_D,
                                const float* rs_D, const float* rb_D, const float* norm_w_D,
                                float eps, int64_t N, int64_t D, cudaStream_t st);
// Given dout: da = dout ⊙ hs (bf16, the next dgrad GEMM's input), dh = dout ⊙ rs (fp32, =; may
// alias dout or h); dhs += Σ dout⊙(a+hb); dhb += Σ dout⊙hs; drs += Σ dout⊙(h+rb); drb += Σ dout⊙rs.
size_t residual_scale_bwd_workspace_bytes(int64_t N, int64_t D);
void residual_scale_bwd(bf16* da_ND, float* dh_ND, float* dhs_D, float* dhb_D, float* drs_D,
                        float* drb_D, const float* dout_ND, const bf16* a_ND, const float* h_ND,
                        const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                        int64_t N, int64_t D, Workspace& ws, cudaStream_t st);
// An RMSNorm backward fused with the residual-scale backward that consumes its input gradient (the
// model's chains norm(h_out) -> residual(a, h)): g = acc + dx_norm(dy, x, w, rstd) (acc fp32, may
// be null: g = dx_norm), then residual_scale_bwd with dout = g (da bf16 =, dh fp32 =, may alias
// acc), dw += Σ dy·x·rstd and dhs, dhb, drs, drb as residual_scale_bwd. g never goes to memory.
// Bit-identical to rmsnorm_bwd_f32 into a buffer holding acc (accumulate) followed by
// residual_scale_bwd from that buffer when the calls select the same access width: D % 4 != 0, or
// D % 4 == 0 and every pointer 16-byte aligned (always so in CudaModel).
size_t rmsnorm_residual_bwd_workspace_bytes(int64_t N, int64_t D);
void rmsnorm_residual_bwd(bf16* da_ND, float* dh_ND, float* dw_D, float* dhs_D, float* dhb_D,
                          float* drs_D, float* drb_D, const float* dy_ND, const float* x_ND,
                          const float* w_D, const float* rstd_N, const float* acc_ND,
                          const bf16* a_ND, const float* h_ND, const float* hs_D, const float* hb_D,
                          const float* rs_D, const float* rb_D, int64_t N, int64_t D, Workspace& ws,
                          cudaStream_t st);

// ---- activations
// ------------------------------------------------------------------------------------ SwiGLU on
// packed gate|up rows (bf16): y[n,i] = silu(gu[n,i]) · gu[n,I+i]; fp32 math.
void swiglu_fwd(bf16* y_NI, const bf16* gu_N2I, int64_t N, int64_t I, cudaStream_t st);
void swiglu_bwd(bf16* dgu_N2I, const bf16* dy_NI, const bf16* gu_N2I, int64_t N, int64_t I,
                cudaStream_t st);  // (=)
// Exact (erf) GELU in fp32, optionally adding a bias first: y = gelu(x + b) (b may be null).
void bias_gelu_fwd(float* y, const float* x, const float* b, int64_t N, int64_t F, cudaStream_t st);
// dx = dy ⊙ gelu'(x + b) (=); db += Σ_n dx (when db non-null; deterministic).
size_t bias_gelu_bwd_workspace_bytes(int64_t N, int64_t F);
void bias_gelu_bwd(float* dx, float* db, const float* dy, const float* x, const float* b, int64_t N,
                   int64_t F, Workspace& ws, cudaStream_t st);
// db[f] += Σ_n dy[n,f] (deterministic column sum), fp32 or bf16 dy.
size_t column_sum_workspace_bytes(int64_t N, int64_t F);
void column_sum(float* db_F, const float* dy_NF, int64_t N, int64_t F, Workspace& ws,
                cudaStream_t st);

// ---- CCA (ZAYA1.md §3)
// --------------------------------------------------------------------------- Packed projection
// rows: qkv[n] = [q0 (Hq·d) | k0 (Hkv·d) | vc (Hkv·d/2) | vd (Hkv·d/2)], bf16, row stride ld (= C +
// Hkv·d). The two causal convolutions run over the first C = (Hq+Hkv)·d channels per sequence (left
// zero padding in training; in decoding the P previous raw columns come from hist_BPC, fp32, and
// are updated in place to the last P columns when update_hist). conv out fp32 [N,C]; mid (depthwise
// output, for backward) fp32 [B, S+t1-1, C] when non-null.
void cca_conv_fwd(float* y_NC, float* mid, const bf16* qkv, int64_t ld, float* hist_BPC,
                  bool update_hist, const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1,
                  const float* bg_C, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, cudaStream_t st);
// dx (+=) ADDED into the first C channels of dqkv (bf16 read-add-write with fp32 math, row stride
// ld): cca_qkv_finish_bwd must have written those channels (the mean-skip path) first. dwdw, dbdw,
// dwg, dbg (+=, deterministic). dy fp32 [N,C]; mid from the forward (training: no history).
size_t cca_conv_bwd_workspace_bytes(int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                                    int64_t t1);
void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, Workspace& ws, cudaStream_t st);
// The same with the forward's history hist_BPC (fp32 [B,P,C]: the P raw [q0 | k0] columns before
// each sequence, as cca_conv_fwd took them; null: zero padding, as above): the weight gradients
// include the history columns' terms, and dhist_BPC (=, fp32 [B,P,C], when non-null) receives the
// gradient of the history columns (context parallelism returns it to the rank that produced
// them). cpu::cca_conv_backward's hist/dhist. Same workspace.
void cca_conv_bwd(bf16* dqkv, int64_t ld, float* dwdw, float* dbdw, float* dwg, float* dbg,
                  const float* dy_NC, const bf16* qkv, const float* mid, const float* wdw_Ct0,
                  const float* wg_Cdt1, int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0,
                  int64_t t1, const float* hist_BPC, float* dhist_BPC, Workspace& ws,
                  cudaStream_t st);
// After the convolutions: q = qk_norm(conv_q + mq), k = qk_norm(conv_k + mk)·temp (mean skip from
// q0/k0 as cpu::cca_mean_skip), then partial NeoX RoPE on the first r dims at positions
// pos0 + t (t the index within the sequence; pos0 the decode offset), and the delayed values
// v[t] = [vc[t] | vd[t-1]] (vd[-1] from vd_last_B when non-null, else zero; vd_last updated to the
// last token's vd when update_vd_last). Outputs bf16 q [N,Hq,d], k [N,Hkv,d], v [N,Hkv,d]; saves
// the pre-norm vectors' clamped norms (fp32 [N,Hq+Hkv]) for backward when norms is non-null.
void cca_qkv_finish_fwd(bf16* q_NHd, bf16* k_NGd, bf16* v_NGd, float* norms_NH,
                        const float* conv_NC, const bf16* qkv, int64_t ld, const float* temp_G,
                        float* vd_last_B, bool update_vd_last, int64_t pos0, double theta,
                        int64_t r, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d,
                        cudaStream_t st);
// Backward of cca_qkv_finish_fwd: from dq, dk, dv (bf16, attention backward outputs) to dconv (fp32
// [N,C], =), the mean-skip and value parts of dqkv (q0/k0 channels = the skip path; vc, vd
// channels =), dtemp (+=, deterministic). Needs conv_NC and norms from the forward (positions
// from 0 in each sequence: training).
size_t cca_qkv_finish_bwd_workspace_bytes(int64_t N, int64_t Hq, int64_t Hkv);
void cca_qkv_finish_bwd(float* dconv_NC, bf16* dqkv, int64_t ld, float* dtemp_G, const bf16* dq,
                        const bf16* dk, const bf16* dv, const float* conv_NC, const bf16* qkv,
                        const float* norms_NH, const float* temp_G, double theta, int64_t r,
                        int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d, Workspace& ws,
                        cudaStream_t st);
// The same with RoPE positions pos0 + t (t the index within each sequence), as the forward's pos0:
// context parallelism's chunks sit at their global offsets.
void cca_qkv_finish_bwd(float* dconv_NC, bf16* dqkv, int64_t ld, float* dtemp_G, const bf16* dq,
                        const bf16* dk, const bf16* dv, const float* conv_NC, const bf16* qkv,
                        const float* norms_NH, const float* temp_G, int64_t pos0, double theta,
                        int64_t r, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d,
                        Workspace& ws, cudaStream_t st);
// Ordering: cca_qkv_finish_bwd writes all of dqkv's row (q0/k0 channels with the mean-skip
// gradient, =) and produces dconv; cca_conv_bwd then takes dconv as its dy and ADDS its dx into the
// q0/k0 channels. Run finish_bwd first, conv_bwd second, on the same stream.

// ---- attention
// ----------------------------------------------------------------------------------- Causal GQA
// flash attention, bf16 q [B,S,Hq,d], k/v [B,Sk,Hkv,d] (rows may be strided: ld_q, ld_kv elements
// between tokens), fp32 accumulation and softmax, scale 1/sqrt(d); queries at positions q_start..,
// keys 0..Sk-1; window > 0 limits each query t to keys t-window+1..t. o bf16 [B,S,Hq,d]; lse fp32
// [B,Hq,S] (natural log of the scaled scores' sum of exp) when non-null. Supports d in {32, 64,
// 128}. No S×S matrix in memory.
void attention_fwd(bf16* o, float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                   int64_t window, cudaStream_t st);
// dq, dk, dv (=), bf16, with fp32 accumulation; deterministic (no atomics across query blocks:
// dk/dv per key block, dq per query block, recomputing probabilities from lse).
size_t attention_bwd_workspace_bytes(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t d);
void attention_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* o,
                   const float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Hq, int64_t Hkv, int64_t d, int64_t window, Workspace& ws,
                   cudaStream_t st);
// The backward of the forward's general form: queries [B,S] at positions q_start.., keys and values
// [B,Sk] (Sk >= q_start + S); dq [B,S,Hq,d], dk and dv [B,Sk,Hkv,d] (=), the latter holding these
// queries' contributions only (keys no query sees get 0). Context parallelism calls it once per
// local chunk against the gathered keys. cpu::attention_backward's general form; same workspace
// (attention_bwd_workspace_bytes with the queries' S).
void attention_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* o,
                   const float* lse_BHS, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                   int64_t S, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                   int64_t window, Workspace& ws, cudaStream_t st);

// ---- context parallelism (ZAYA1.md §4; model/backward.h's ContextParallel)
// ---------------------------------------------------------------- Data movement of a rank's chunk
// rows: R rows (slot-major: row = slot·B + b) of S tokens each. One row's halo is T = P·C + VH
// floats: the P raw [q0 | k0] columns before the row (P = (t0−1)+(t1−1)), then the delayed value
// (vd, VH = Hkv·d/2 channels) of the token before it.
// tails[r] (=) = the last P tokens' q0|k0 channels and the last token's vd channels of row r, as
// fp32 (what the rank of the next chunk needs as its halo). qkv rows as in cca_conv_fwd.
void cp_pack_tails(float* tails_RT, const bf16* qkv, int64_t ld, int64_t R, int64_t S, int64_t P,
                   int64_t C, int64_t VH, cudaStream_t st);
// The reverse for the backward: dqkv's last P tokens' q0|k0 channels and the last token's vd
// channels of every row += dtails[r] (bf16 read-add-write, fp32 math).
void cp_add_tail_grads(bf16* dqkv, int64_t ld, const float* dtails_RT, int64_t R, int64_t S,
                       int64_t P, int64_t C, int64_t VH, cudaStream_t st);
// halo[r] = [hist[r] (P·C) | vdl[r] (VH)] split (=) into hist_RPC and vdl_RV (fp32), and the
// backward's dhalo[r] (=) = [dhist[r] | the first token's vd gradient, dv[r·S][VH..KD) as fp32].
void cp_split_halos(float* hist_RPC, float* vdl_RV, const float* halo_RT, int64_t R, int64_t P,
                    int64_t C, int64_t VH, cudaStream_t st);
void cp_pack_halo_grads(float* dhalo_RT, const float* dhist_RPC, const bf16* dv_NKD, int64_t R,
                        int64_t S, int64_t P, int64_t C, int64_t KD, cudaStream_t st);
// Whole-sequence rows [B,S,W] from the blocks of the cp group's ranks (bf16): block j (at
// gathered + j·rank_stride) holds rank j's rows, slot-major [2][B][Lc][W], Lc = S/(2·Cc); rank j
// holds chunks j and 2Cc−1−j. Every element of full is written.
void cp_ranks_to_sequence(bf16* full_BSW, const bf16* gathered, int64_t rank_stride, int64_t B,
                          int64_t S, int64_t Cc, int64_t W, cudaStream_t st);
// The reverse, summing sources: out block j (at out + j·rank_stride, fp32, =) gets, for rank j's
// chunk rows, a[b, t, :] + b2[b, t, :] (fp32 sums of bf16 [B,S,W] sources; b2 may be null). The
// send buffer of the keys' and values' gradient reduce-scatter.
void cp_sequence_to_ranks(float* out, int64_t rank_stride, const bf16* a_BSW, const bf16* b_BSW,
                          int64_t B, int64_t S, int64_t Cc, int64_t W, cudaStream_t st);

// ---- router and expert dispatch
// ------------------------------------------------------------------ EDA state: r += state ⊙ scale
// (fp32, in place; state/scale null in layer 0 means nothing to add).
void router_eda_fwd(float* r_NR, const float* state_NR, const float* scale_R, int64_t N, int64_t R,
                    cudaStream_t st);
// Softmax over E1 classes (fp32), choice = argmax(p + balancing_bias), ties to the lowest index,
// gate = p[choice]. Exactly cpu::router_select's rule.
void router_select(float* probs_NE1, int32_t* choice_N, float* gate_N, const float* logits_NE1,
                   const float* balancing_bias_E1, int64_t N, int64_t E1, cudaStream_t st);
// d logits (=) from d gate (only the chosen class's probability carries gradient).
void router_select_bwd(float* dlogits_NE1, const float* dgate_N, const float* probs_NE1,
                       const int32_t* choice_N, int64_t N, int64_t E1, cudaStream_t st);
// Stable counting sort of tokens by class: counts_E1 and offsets_E1p1 (device), perm_N (perm[j] =
// the token at sorted position j, tokens of one class in token order). Also copies counts to
// counts_host (pinned, E1 entries) and synchronises the stream: the grouped GEMMs need them.
size_t sort_by_expert_workspace_bytes(int64_t N, int64_t E1);
void sort_by_expert(int32_t* perm_N, int32_t* counts_E1, int32_t* offsets_E1p1,
                    int32_t* counts_host, const int32_t* choice_N, int64_t N, int64_t E1,
                    Workspace& ws, cudaStream_t st);
// xs[j,:] = x[perm[j],:] for the first n_routed sorted rows (bf16).
void gather_rows(bf16* xs_MD, const bf16* x_ND, const int32_t* perm, int64_t M, int64_t D,
                 cudaStream_t st);
// out[perm[j],:] = gate[perm[j]] · ys[j,:] for routed rows j < M; rows of skip tokens get
// gate·x (skip_scaled_input) or 0. out bf16 [N,D] (it feeds the residual-scale kernel).
void scatter_gate_rows(bf16* out_ND, const bf16* ys_MD, const bf16* x_ND, const float* gate_N,
                       const int32_t* perm, const int32_t* choice_N, int64_t E,
                       bool skip_scaled_input, int64_t N, int64_t M, int64_t D, cudaStream_t st);
// Backward of scatter_gate_rows: dys[j,:] = gate[perm[j]] · dout[perm[j],:] (bf16, =);
// dgate[n] = <dout[n], y[n]> with y the expert output row (or x for scaled-input skips), fp32 (=);
// dx_skip (+=, fp32, may be null) the gate·dout of scaled-input skip rows.
void scatter_gate_rows_bwd(bf16* dys_MD, float* dgate_N, float* dx_skip_ND, const bf16* dout_ND,
                           const bf16* ys_MD, const bf16* x_ND, const float* gate_N,
                           const int32_t* perm, const int32_t* choice_N, int64_t E,
                           bool skip_scaled_input, int64_t N, int64_t M, int64_t D,
                           cudaStream_t st);
// dx[perm[j],:] += dxs[j,:] (fp32 dx, bf16 dxs; each token appears once in perm: no races).
void scatter_add_rows(float* dx_ND, const bf16* dxs_MD, const int32_t* perm, int64_t M, int64_t D,
                      cudaStream_t st);

// ---- loss
// ----------------------------------------------------------------------------------------
// Cross-entropy over vocabulary chunks, never holding [N,V] logits: the caller computes a chunk's
// logits [N,Vc] (fp32, by GEMM), calls ce_chunk_stats to fold it into running (max, sumexp) per row
// and to pick up the target logit when the target falls in [v0, v0+Vc). After all chunks,
// ce_finalize gives loss_N = lse - target_logit (0 for ignored targets < 0) and lse_N.
void ce_init(float* max_N, float* sumexp_N, float* tlogit_N, int64_t N, cudaStream_t st);
void ce_chunk_stats(float* max_N, float* sumexp_N, float* tlogit_N, const float* logits_NVc,
                    const int32_t* targets_N, int64_t v0, int64_t N, int64_t Vc, cudaStream_t st);
void ce_finalize(float* loss_N, float* lse_N, const float* max_N, const float* sumexp_N,
                 const float* tlogit_N, const int32_t* targets_N, int64_t N, cudaStream_t st);
// Second pass, per chunk: dlogits = scale · (softmax − onehot) written as bf16 [N,Vc] for the dgrad
// and wgrad GEMMs (rows with target < 0 get 0). scale = loss_scale / (number of counted targets).
void ce_chunk_grad(bf16* dlogits_NVc, const float* logits_NVc, const float* lse_N,
                   const int32_t* targets_N, float scale, int64_t v0, int64_t N, int64_t Vc,
                   cudaStream_t st);
// Deterministic sum of loss_N (fp64 out, one value) and the count of targets >= 0.
void sum_loss(double* loss_out, int32_t* count_out, const float* loss_N, const int32_t* targets_N,
              int64_t N, Workspace& ws, cudaStream_t st);

// ---- optimizer
// ----------------------------------------------------------------------------------- Sum of
// squares of n fp32 values into out (fp64), deterministic (for the global grad norm).
size_t sumsq_workspace_bytes(int64_t n);
void sumsq(double* out, const float* x, int64_t n, Workspace& ws, cudaStream_t st);
// Fused AdamW on one tensor (PyTorch semantics, decoupled decay): m = b1 m + (1-b1) g·gs,
// v = b2 v + (1-b2)(g·gs)², p -= lr (m/bc1 / (sqrt(v/bc2)+eps) + wd p); gs = grad scale (clipping).
// Also writes the bf16 copy of p when p_bf16 is non-null.
void adamw_step(float* p, bf16* p_bf16, float* m, float* v, const float* g, float gs, float lr,
                float b1, float b2, float eps, float wd, float bc1, float bc2, int64_t n,
                cudaStream_t st);
// Muon's elementwise pieces: momentum buf = mu·buf + g·gs; update u = g·gs + mu·buf (Nesterov)
// written as bf16 for Newton–Schulz, or fp32; Frobenius normalisation happens in the NS driver.
void muon_momentum(float* buf, float* u, const float* g, float gs, float mu, bool nesterov,
                   int64_t n, cudaStream_t st);
// p = p·(1 − lr·wd) − lr·scale·o; writes the bf16 copy when non-null.
void apply_update(float* p, bf16* p_bf16, const float* o, float lr, float wd, float scale,
                  int64_t n, cudaStream_t st);
void scale_f32(float* y, float a, int64_t n, cudaStream_t st);  // y *= a
void axpby_f32(float* y, float a, const float* x, float b, int64_t n,
               cudaStream_t st);  // y = a·x + b·y

// C[m, n] += bias[n] for an M×N row-major block (fp32 or bf16 C): the GEMM layer's bias when the
// cuBLASLt epilogue cannot take it.
void add_bias_rows(void* C, int64_t ldc, bool c_bf16, const float* bias_N, int64_t M, int64_t N,
                   cudaStream_t st);

}  // namespace zaya::cuda
