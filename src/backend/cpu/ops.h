// The CPU reference ops: fp32, plain loops around one packed matrix product (gemm.h),
// multi-threaded with parallel_for over independent rows or output tiles so results do not depend
// on the thread count. Each op is the specification its CUDA counterpart is tested against.
// Signatures: outputs first, then inputs, then sizes. Backward functions sit next to their forward
// in the same file; their comments say which gradients are accumulated (+=) and which are
// overwritten.
//
// Legend: N tokens (B*S), B batch, S sequence, D hidden, K/O linear in/out widths, C conv channels,
// Hq/Hkv query/key-value heads, d head dim, r rotary dim, E routed experts (E+1 router classes), V
// vocab.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace zaya::cpu {

// ---- dense algebra ------------------------------------------------------------------------------
// C[M,N] (=|+=) A[M,K] · B[N,K]^T (+ bias[N]). B may be F32, BF16 or F16 (weights stay in their
// stored dtype and are widened row by row). This is nn.Linear: y = x W^T + b.
void linear(float* y_NO, const float* x_NK, const Tensor& w_OK, const float* bias_O, int64_t N,
            int64_t K, int64_t O, bool accumulate = false);
// dx[N,K] (=|+=) dy[N,O] · W[O,K]
void linear_backward_input(float* dx_NK, const float* dy_NO, const Tensor& w_OK, int64_t N,
                           int64_t K, int64_t O, bool accumulate);
// dW[O,K] += dy[N,O]^T · x[N,K];  db[O] += Σ_n dy[n,:]
void linear_backward_weight(float* dw_OK, float* db_O, const float* dy_NO, const float* x_NK,
                            int64_t N, int64_t K, int64_t O);

// ---- embedding, norms, elementwise
// ---------------------------------------------------------------- y[n,:] = table[ids[n],:]. Ids
// are checked against V (error names the id and position).
void embedding(float* y_ND, const int32_t* ids_N, const Tensor& table_VD, int64_t N, int64_t D);
// dtable[ids[n],:] += dy[n,:] (serial over n per row block: deterministic)
void embedding_backward(float* dtable_VD, const float* dy_ND, const int32_t* ids_N, int64_t N,
                        int64_t D, int64_t V);
// y = w ⊙ x / sqrt(mean(x²) + eps); rstd[n] is saved for backward when non-null.
void rmsnorm(float* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps, int64_t N,
             int64_t D);
// dx (=), dw (+=)
void rmsnorm_backward(float* dx_ND, float* dw_D, const float* dy_ND, const float* x_ND,
                      const float* w_D, const float* rstd_N, int64_t N, int64_t D);
// Residual scaling (ZAYA1.md §3): h_out = (a + hb) ⊙ hs + (h + rb) ⊙ rs. In place on h allowed.
void residual_scale(float* out_ND, const float* a_ND, const float* h_ND, const float* hs_D,
                    const float* hb_D, const float* rs_D, const float* rb_D, int64_t N, int64_t D);
// da, dh (=);  dhs, dhb, drs, drb (+=)
void residual_scale_backward(float* da_ND, float* dh_ND, float* dhs_D, float* dhb_D, float* drs_D,
                             float* drb_D, const float* dout_ND, const float* a_ND,
                             const float* h_ND, const float* hs_D, const float* hb_D,
                             const float* rs_D, const float* rb_D, int64_t N, int64_t D);
// y = (x + b) ⊙ s (the model's input affine)
void affine(float* y_ND, const float* x_ND, const float* s_D, const float* b_D, int64_t N,
            int64_t D);
void gelu(float* y, const float* x, int64_t n);                             // exact erf GELU
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);  // dx (=)
// SwiGLU on the packed gate|up rows: y[n,i] = silu(gu[n,i]) * gu[n,I+i]
void swiglu(float* y_NI, const float* gu_N2I, int64_t N, int64_t I);
void swiglu_backward(float* dgu_N2I, const float* dy_NI, const float* gu_N2I, int64_t N,
                     int64_t I);  // (=)

// ---- loss ---------------------------------------------------------------------------------------
// Mean cross-entropy of logits[n] against targets[n] over n with targets[n] >= 0 (negative targets
// are ignored). Returns the mean; when dlogits is non-null writes d(mean loss)/dlogits (=).
double cross_entropy(float* dlogits_NV, const float* logits_NV, const int32_t* targets_N, int64_t N,
                     int64_t V);

// ---- CCA attention pieces
// ------------------------------------------------------------------------ Mean skip (before the
// convolutions): mq[h] = (q0[h] + k0[h div G]) / 2; mk[g] = mean over the G query heads h of group
// g of mq[h]. Inputs/outputs are rows of N tokens.
void cca_mean_skip(float* mq_NHd, float* mk_NGd, const float* q0_NHd, const float* k0_NGd,
                   int64_t N, int64_t Hq, int64_t Hkv, int64_t d);
// The two causal convolutions of CCA over time on packed channels c = [q0 | k0] (C channels):
// left pad P=(t0-1)+(t1-1) steps (taken from hist_BPC when non-null: the P previous raw inputs of
// each sequence, else zeros), depthwise conv (kernel t0, bias), then grouped conv (groups = C/d, d
// in and d out per group, kernel t1, bias). Both are cross-correlations like PyTorch's Conv1d.
// mid_B(S+P-t0+1)C receives the depthwise output when non-null (for backward).
void cca_conv(float* y_BSC, float* mid, const float* x_BSC, const float* hist_BPC,
              const float* wdw_Ct0, const float* bdw_C, const float* wg_Cdt1, const float* bg_C,
              int64_t B, int64_t S, int64_t C, int64_t d, int64_t t0, int64_t t1);
// dx (=), dwdw, dbdw, dwg, dbg (+=). Requires mid from the forward. hist_BPC is the forward's
// history (null: zero padding); with it, dhist_BPC (=) receives the gradient of the history columns
// when non-null (context parallelism sends it back to the rank that produced them).
void cca_conv_backward(float* dx_BSC, float* dwdw, float* dbdw, float* dwg, float* dbg,
                       const float* dy_BSC, const float* x_BSC, const float* mid,
                       const float* wdw_Ct0, const float* wg_Cdt1, int64_t B, int64_t S, int64_t C,
                       int64_t d, int64_t t0, int64_t t1, const float* hist_BPC = nullptr,
                       float* dhist_BPC = nullptr);
// Per head of d values: x ← sqrt(d) · x / max(‖x‖, eps) · (temp[h] if temp else 1). Saves the
// clamped norm per head in norm_NH when non-null.
void qk_norm(float* y_NHd, float* norm_NH, const float* x_NHd, const float* temp_H, int64_t N,
             int64_t H, int64_t d);
// dx (=), dtemp (+=)
void qk_norm_backward(float* dx_NHd, float* dtemp_H, const float* dy_NHd, const float* x_NHd,
                      const float* norm_NH, const float* temp_H, int64_t N, int64_t H, int64_t d);
// NeoX rotate-half RoPE on the first r dims of every head, in place. pos_N gives each row's
// position; inverse frequencies θ^(−2j/r) are computed in fp32 as transformers does.
void rope(float* x_NHd, const int64_t* pos_N, double theta, int64_t N, int64_t H, int64_t d,
          int64_t r);
void rope_backward(float* dx_NHd, const int64_t* pos_N, double theta, int64_t N, int64_t H,
                   int64_t d, int64_t r);  // in place: applies the inverse rotation to the gradient
// Causal GQA attention, softmax scale 1/sqrt(d). q [B,Sq,Hq,d]; k, v [B,Sk,Hkv,d] with the queries
// at absolute positions q_start..q_start+Sq-1 and keys at 0..Sk-1 (Sk >= q_start+Sq). window > 0
// restricts each query t to keys t-window+1..t. lse_BHS (log-sum-exp of the scaled scores) is saved
// when non-null for backward.
void attention(float* o_BSHd, float* lse_BHS, const float* q_BSHd, const float* k_BSGd,
               const float* v_BSGd, int64_t B, int64_t Sq, int64_t Sk, int64_t q_start, int64_t Hq,
               int64_t Hkv, int64_t d, int64_t window);
// dq (=), dk (=), dv (=). Recomputes probabilities from lse (flash-attention style, no S×S buffer).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t S, int64_t Hq, int64_t Hkv, int64_t d, int64_t window);
// The same for the forward's general form: queries [B,Sq] at positions q_start.., keys and values
// [B,Sk]; dk, dv [B,Sk,Hkv,d] (=) hold these queries' contributions only (keys no query sees get
// 0).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t Sq, int64_t Sk, int64_t q_start, int64_t Hq, int64_t Hkv, int64_t d,
                        int64_t window);

// ---- router
// ---------------------------------------------------------------------------------------- softmax
// over E+1 classes in fp32 (probs), choice = argmax(p + balancing_bias) with ties to the lowest
// index, gate = p[choice].
void router_select(float* probs_NE1, int32_t* choice_N, float* gate_N, const float* logits_NE1,
                   const float* balancing_bias_E1, int64_t N, int64_t E1);

}  // namespace zaya::cpu
