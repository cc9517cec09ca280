// CudaInference (infer_cuda.h): weights and cache on the device, batched prefill through the
// training-path kernels and cuBLASLt, and decode steps through the weight-streaming kernels of
// backend/cuda/decode/decode_kernels.h, captured once into a CUDA graph and replayed. Every buffer is carved out of one
// device allocation made at construction; prefill and decode allocate nothing.
#include "engine/cuda/infer_cuda.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/carver.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/decode/decode_kernels.h"
#include "backend/cuda/ops.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace zaya::cuda {

namespace {

// The router's layout in the decode step: the largest cluster the device schedules, the MLP rows
// in registers, the stages exchanged by st.async, its row of x staged in shared memory.
constexpr DecodeRouterLayout kRouterLayout{0, true, false, true, true, true};

// Weights of one layer on the device. Matrices that feed GEMMs/GEMVs are bf16; the router MLP
// (small, decides routing) and every vector stay fp32.
struct DevLayer {
  bf16 *wqkv = nullptr, *wo = nullptr, *r_down = nullptr, *gate_up = nullptr, *down = nullptr;
  float *ln_in = nullptr, *ln_post = nullptr, *conv_dw_w = nullptr, *conv_dw_b = nullptr,
        *conv_g_w = nullptr, *conv_g_b = nullptr, *temp = nullptr;
  float *pa_hs = nullptr, *pa_hb = nullptr, *pa_rs = nullptr, *pa_rb = nullptr;
  float *pm_hs = nullptr, *pm_hb = nullptr, *pm_rs = nullptr, *pm_rb = nullptr;
  float *r_down_b = nullptr, *r_scale = nullptr, *r_norm = nullptr, *fc1_w = nullptr,
        *fc1_b = nullptr, *fc2_w = nullptr, *fc2_b = nullptr, *out_w = nullptr,
        *balancing = nullptr;
  // Cache.
  bf16 *kc = nullptr, *vc = nullptr;
  float *hist = nullptr, *vd_last = nullptr;
};

}  // namespace

struct CudaInference::Impl {
  ZayaConfig c;
  CudaInferOptions opt;
  int64_t D, d, Hq, Hkv, C, QD, KD, VH, LD, R, E, E1, I, V, P, NL;
  int64_t NP;  // prefill rows budget
  cudaStream_t st = nullptr;
  std::unique_ptr<GemmContext> gemm;
  char* arena = nullptr;
  size_t arena_bytes = 0;
  Workspace ws;  // scratch for the training-path kernels (sort_by_expert)
  size_t ws_bytes = 0;
  // The router starts from sums the post-attention norm's launch computed (decode_norm_gemv, then
  // decode_router's r0) where both kernels take the model's sizes and the buffers' layout.
  bool router_pre_down_ok = false;
  unsigned skip = 0;  // set_decode_skip
  std::vector<DevLayer> L;
  bf16* embed = nullptr;
  float *in_s = nullptr, *in_b = nullptr, *final_norm = nullptr;
  // Activations (prefill sizes; decode uses the first rows).
  float *h = nullptr, *rstd = nullptr, *conv = nullptr, *r[2] = {nullptr, nullptr}, *rn = nullptr,
        *t1 = nullptr, *t2 = nullptr, *rlog = nullptr, *probs = nullptr, *gate = nullptr,
        *logits = nullptr, *attn_ws = nullptr;
  float* h2 = nullptr;  // decode: the residual's other buffer (router_pre_down_ok)
  float* r0 = nullptr;  // decode: the router's first sums (router_pre_down_ok)
  void* argmax_ws = nullptr;
  unsigned long long* lm_keys = nullptr;  // lm_head_greedy's per-row keys (zero between steps)
  bf16 *x = nullptr, *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr,
       *a = nullptr, *xs = nullptr, *gu = nullptr, *act = nullptr, *ys = nullptr;
  int32_t *ids = nullptr, *choice = nullptr, *perm = nullptr, *counts = nullptr, *offsets = nullptr,
          *bad = nullptr, *len = nullptr;
  int32_t* tok_hist = nullptr;     // [position][batch]: each decode step's argmax, at its position
  int32_t* counts_host = nullptr;  // pinned
  int64_t logits_rows = 0;         // rows the logits buffer holds
  int64_t B = 1, length = 0;
  // The captured decode step, and kGraphSteps of them captured as one graph (greedy decoding: the
  // steps' launches then follow each other inside one graph, no gap between graph launches).
  struct StepGraph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    int64_t batch = 0;
    void drop() {
      if (exec) cudaGraphExecDestroy(exec), exec = nullptr;
      if (graph) cudaGraphDestroy(graph), graph = nullptr;
      batch = 0;
    }
  };
  static constexpr int64_t kGraphSteps = 8;
  StepGraph one_step, k_steps;
  int decode_steps_run = 0;
  // Per-op timing of an eager decode step (profile_decode): events recorded between ops.
  bool profiling = false;
  std::vector<std::pair<const char*, cudaEvent_t>> marks;
  void mark(const char* what) {
    if (!profiling) return;
    cudaEvent_t e;
    ZAYA_CUDA_CHECK(cudaEventCreate(&e));
    ZAYA_CUDA_CHECK(cudaEventRecord(e, st));
    marks.emplace_back(what, e);
  }

  Impl(const ZayaModel& m, const CudaInferOptions& o);
  ~Impl();
  void plan(Carver& cv);
  void upload(const ZayaModel& m);
  void zero_cache();
  void router(int64_t li, int64_t N, bool gemv, const float* r0_sums = nullptr);
  const float* next_norm(int64_t li) const;
  void run_prefill(int64_t S, bool all_logits);
  void run_decode_step();
  void decode_launch(int64_t steps = 1);
  StepGraph& step_graph(int64_t steps);  // captured (not run) for the current batch if needed
  void set_skip(unsigned ops);
};

CudaInference::Impl::Impl(const ZayaModel& m, const CudaInferOptions& o) : c(m.cfg), opt(o) {
  ZAYA_CHECK(o.max_batch >= 1 && o.max_batch <= kGemvMaxRows,
             "cuda inference: max_batch must be in 1..{}, got {}", kGemvMaxRows, o.max_batch);
  ZAYA_CHECK(o.max_context >= 1 && o.max_prefill_tokens >= o.max_batch,
             "cuda inference: max_context {} and max_prefill_tokens {} must be positive",
             o.max_context, o.max_prefill_tokens);
  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  ZAYA_CHECK(e == cudaSuccess && ndev > o.device, "cuda inference: no CUDA device {} ({})",
             o.device, e == cudaSuccess ? std::to_string(ndev) + " found" : cudaGetErrorString(e));
  ZAYA_CUDA_CHECK(cudaSetDevice(o.device));
  D = c.hidden_size, d = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  C = c.conv_channels(), QD = Hq * d, KD = Hkv * d, VH = KD / 2, LD = C + KD;
  R = c.router_hidden_size, E = c.num_experts, E1 = E + 1, I = c.moe_intermediate_size;
  V = c.vocab_size, P = (c.cca_time0 - 1) + (c.cca_time1 - 1), NL = c.num_hidden_layers;
  NP = std::max(o.max_prefill_tokens, o.max_batch);
  ZAYA_CHECK(d == 32 || d == 64 || d == 128,
             "cuda inference: head dim {} is not supported by the GPU attention and CCA kernels "
             "(32, 64 or 128)",
             d);
  L.resize(size_t(NL));
  ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  gemm = std::make_unique<GemmContext>();
  Carver sizing;
  plan(sizing);
  arena_bytes = sizing.used();
  ZAYA_CUDA_CHECK(cudaMalloc(&arena, arena_bytes));
  Carver cv(arena);
  plan(cv);
  ZAYA_CUDA_CHECK(cudaMallocHost(&counts_host, size_t(E1) * sizeof(int32_t)));
  upload(m);
  zero_cache();
  // The router starting from sums computed by the post-attention norm's launch: its register and
  // st.async form at the decode step's router layout, and the norm's vector layout for every layer
  // (else the norm and the router stay as they are).
  const DecodeRouterLayout lay{0, true, false, true, true};
  router_pre_down_ok = decode_router_pre_down_supported(R, E1, lay);
  for (const DevLayer& l : L)
    for (float* hi : {h, h2})
      router_pre_down_ok =
          router_pre_down_ok &&
          decode_norm_gemv_supported(D, {hi, hi == h ? h2 : h, x, a, l.pa_hs, l.pa_hb, l.pa_rs,
                                         l.pa_rb, l.ln_post, l.r_down});
}

void CudaInference::Impl::set_skip(unsigned ops) {
  ZAYA_CHECK(ops < (1u << unsigned(DecodeOp::Count)),
             "cuda inference: decode skip mask {:#x} names no op class", ops);
  skip = ops;
  one_step.drop();
  k_steps.drop();
  decode_steps_run = 0;  // the next step runs eagerly (launch set-up outside any capture)
}

CudaInference::Impl::~Impl() {
  one_step.drop();
  k_steps.drop();
  if (counts_host) cudaFreeHost(counts_host);
  if (arena) cudaFree(arena);
  if (st) cudaStreamDestroy(st);
}

void CudaInference::Impl::plan(Carver& cv) {
  const int64_t cap = opt.max_context, MB = opt.max_batch;
  embed = cv.take<bf16>(V * D);
  in_s = cv.take<float>(D), in_b = cv.take<float>(D), final_norm = cv.take<float>(D);
  for (auto& l : L) {
    l.wqkv = cv.take<bf16>(LD * D);
    l.wo = cv.take<bf16>(D * QD);
    l.r_down = cv.take<bf16>(R * D);
    l.gate_up = cv.take<bf16>(E * 2 * I * D);
    l.down = cv.take<bf16>(E * D * I);
    for (float** p : {&l.ln_in, &l.ln_post, &l.pa_hs, &l.pa_hb, &l.pa_rs, &l.pa_rb, &l.pm_hs,
                      &l.pm_hb, &l.pm_rs, &l.pm_rb})
      *p = cv.take<float>(D);
    l.conv_dw_w = cv.take<float>(C * c.cca_time0);
    l.conv_dw_b = cv.take<float>(C);
    l.conv_g_w = cv.take<float>(C * d * c.cca_time1);
    l.conv_g_b = cv.take<float>(C);
    l.temp = cv.take<float>(Hkv);
    l.r_down_b = cv.take<float>(R), l.r_scale = cv.take<float>(R), l.r_norm = cv.take<float>(R);
    l.fc1_w = cv.take<float>(R * R), l.fc1_b = cv.take<float>(R);
    l.fc2_w = cv.take<float>(R * R), l.fc2_b = cv.take<float>(R);
    l.out_w = cv.take<float>(E1 * R), l.balancing = cv.take<float>(E1);
    l.kc = cv.take<bf16>(MB * cap * KD), l.vc = cv.take<bf16>(MB * cap * KD);
    l.hist = cv.take<float>(MB * std::max<int64_t>(P, 1) * C);
    l.vd_last = cv.take<float>(MB * VH);
  }
  const int64_t N = NP;
  h = cv.take<float>(N * D), rstd = cv.take<float>(N), conv = cv.take<float>(N * C);
  h2 = cv.take<float>(opt.max_batch * D);
  r0 = cv.take<float>(opt.max_batch * R);
  r[0] = cv.take<float>(N * R), r[1] = cv.take<float>(N * R), rn = cv.take<float>(N * R);
  t1 = cv.take<float>(N * R), t2 = cv.take<float>(N * R);
  rlog = cv.take<float>(N * E1), probs = cv.take<float>(N * E1), gate = cv.take<float>(N);
  x = cv.take<bf16>(N * D), qkv = cv.take<bf16>(N * LD), q = cv.take<bf16>(N * QD);
  k = cv.take<bf16>(N * KD), v = cv.take<bf16>(N * KD), o = cv.take<bf16>(N * QD);
  a = cv.take<bf16>(N * D), xs = cv.take<bf16>(N * D), gu = cv.take<bf16>(N * 2 * I);
  act = cv.take<bf16>(N * I), ys = cv.take<bf16>(N * D);
  ids = cv.take<int32_t>(N), choice = cv.take<int32_t>(N), perm = cv.take<int32_t>(N);
  counts = cv.take<int32_t>(E1), offsets = cv.take<int32_t>(E1 + 1), bad = cv.take<int32_t>(1);
  len = cv.take<int32_t>(MB);
  tok_hist = cv.take<int32_t>(MB * cap);
  // Logits: the last position of each sequence always; every position when it fits 256 MiB.
  logits_rows = std::max<int64_t>(MB, std::min<int64_t>(N, (int64_t(256) << 20) / (4 * V)));
  logits = cv.take<float>(logits_rows * V);
  attn_ws = cv.take<float>(int64_t(decode_attention_workspace_bytes(MB, Hq, d, cap) / 4) + 1);
  argmax_ws = cv.take<char>(int64_t(argmax_workspace_bytes(MB)));
  lm_keys = cv.take<unsigned long long>(MB);
  ws_bytes = sort_by_expert_workspace_bytes(N, E1) + 4096;
  char* wsp = cv.take<char>(int64_t(ws_bytes));
  ws.base = wsp, ws.capacity = ws_bytes, ws.used = 0;
}

namespace {

void put_f32(float* dst, const Tensor& t, int64_t n) {
  ZAYA_CHECK(t.numel() == n, "cuda inference: tensor of {} elements where {} were expected",
             t.numel(), n);
  Tensor f = t.dtype() == DType::F32 && t.is_contiguous() ? t : t.to(DType::F32);
  ZAYA_CUDA_CHECK(cudaMemcpy(dst, f.raw(), size_t(n) * 4, cudaMemcpyHostToDevice));
}

void put_bf16(bf16* dst, const Tensor& t, int64_t n) {
  ZAYA_CHECK(t.numel() == n, "cuda inference: tensor of {} elements where {} were expected",
             t.numel(), n);
  Tensor b = t.dtype() == DType::BF16 && t.is_contiguous() ? t : t.to(DType::BF16);
  ZAYA_CUDA_CHECK(cudaMemcpy(dst, b.raw(), size_t(n) * 2, cudaMemcpyHostToDevice));
}

}  // namespace

void CudaInference::Impl::upload(const ZayaModel& m) {
  put_bf16(embed, m.embed, V * D);
  put_f32(in_s, m.input_scale, D), put_f32(in_b, m.input_bias, D);
  put_f32(final_norm, m.final_norm, D);
  for (int64_t li = 0; li < NL; li++) {
    const LayerWeights& w = m.layers[size_t(li)];
    DevLayer& l = L[size_t(li)];
    put_bf16(l.wqkv, w.wq, QD * D);
    put_bf16(l.wqkv + QD * D, w.wk, KD * D);
    put_bf16(l.wqkv + (QD + KD) * D, w.wv_cur, VH * D);
    put_bf16(l.wqkv + (QD + KD + VH) * D, w.wv_del, VH * D);
    put_bf16(l.wo, w.wo, D * QD);
    put_bf16(l.r_down, w.r_down_w, R * D);
    put_bf16(l.gate_up, w.experts_gate_up, E * 2 * I * D);
    put_bf16(l.down, w.experts_down, E * D * I);
    put_f32(l.ln_in, w.ln_in, D), put_f32(l.ln_post, w.ln_post, D);
    put_f32(l.pa_hs, w.post_attn.hs, D), put_f32(l.pa_hb, w.post_attn.hb, D);
    put_f32(l.pa_rs, w.post_attn.rs, D), put_f32(l.pa_rb, w.post_attn.rb, D);
    put_f32(l.pm_hs, w.post_mlp.hs, D), put_f32(l.pm_hb, w.post_mlp.hb, D);
    put_f32(l.pm_rs, w.post_mlp.rs, D), put_f32(l.pm_rb, w.post_mlp.rb, D);
    put_f32(l.conv_dw_w, w.conv_dw_w, C * c.cca_time0), put_f32(l.conv_dw_b, w.conv_dw_b, C);
    put_f32(l.conv_g_w, w.conv_g_w, C * d * c.cca_time1), put_f32(l.conv_g_b, w.conv_g_b, C);
    put_f32(l.temp, w.temp, Hkv);
    put_f32(l.r_down_b, w.r_down_b, R);
    if (li > 0) put_f32(l.r_scale, w.r_states_scale, R);
    put_f32(l.r_norm, w.r_norm, R);
    put_f32(l.fc1_w, w.r_fc1_w, R * R), put_f32(l.fc1_b, w.r_fc1_b, R);
    put_f32(l.fc2_w, w.r_fc2_w, R * R), put_f32(l.fc2_b, w.r_fc2_b, R);
    put_f32(l.out_w, w.r_out_w, E1 * R), put_f32(l.balancing, w.balancing_bias, E1);
  }
  // cudaMemcpy from pageable memory may return before its DMA lands, and the work that follows
  // runs on a non-blocking stream that does not wait for the legacy stream: finish it here.
  ZAYA_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaInference::Impl::zero_cache() {
  const int64_t cap = opt.max_context, MB = opt.max_batch;
  for (auto& l : L) {
    ZAYA_CUDA_CHECK(cudaMemsetAsync(l.kc, 0, size_t(MB * cap * KD) * 2, st));
    ZAYA_CUDA_CHECK(cudaMemsetAsync(l.vc, 0, size_t(MB * cap * KD) * 2, st));
    ZAYA_CUDA_CHECK(cudaMemsetAsync(l.hist, 0, size_t(MB * std::max<int64_t>(P, 1) * C) * 4, st));
    ZAYA_CUDA_CHECK(cudaMemsetAsync(l.vd_last, 0, size_t(MB * VH) * 4, st));
  }
  ZAYA_CUDA_CHECK(cudaMemsetAsync(len, 0, size_t(MB) * 4, st));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(bad, 0, 4, st));
  // decode_attention's counters start at zero (each launch leaves them there again).
  ZAYA_CUDA_CHECK(cudaMemsetAsync(
      attn_ws, 0, decode_attention_workspace_bytes(MB, Hq, d, opt.max_context), st));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(lm_keys, 0, size_t(opt.max_batch) * sizeof(*lm_keys), st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  length = 0;
}

// The router of layer li on rows x (bf16, N rows): down projection, EDA state, norm, MLP, select.
// r[li % 2] receives this layer's state; r[(li + 1) % 2] holds the previous layer's.
void CudaInference::Impl::router(int64_t li, int64_t N, bool gemv, const float* r0_sums) {
  Impl& s = *this;
  DevLayer& l = s.L[size_t(li)];
  float* rc = s.r[li % 2];
  const float* rp = s.r[(li + 1) % 2];
  if (gemv) {  // decode rows: the whole router in one launch
    decode_router(rc, s.probs, s.choice, s.gate, s.x, s.D, l.r_down, l.r_down_b,
                  li > 0 ? rp : nullptr, l.r_scale, l.r_norm, float(s.c.rms_norm_eps), l.fc1_w,
                  l.fc1_b, l.fc2_w, l.fc2_b, l.out_w, l.balancing, N, s.D, s.R, s.E1, s.st,
                  kRouterLayout, r0_sums, s.opt.policy);
    return;
  }
  s.gemm->gemm(false, true, N, s.R, s.D, 1.f, s.x, s.D, l.r_down, s.D, 0.f, rc, s.R, GemmType::BF16,
               GemmType::F32, l.r_down_b, s.st);
  if (li > 0) router_eda_fwd(rc, rp, l.r_scale, N, s.R, s.st);
  rmsnorm_fwd_f32(s.rn, s.rstd, rc, l.r_norm, float(s.c.rms_norm_eps), N, s.R, s.st);
  s.gemm->gemm(false, true, N, s.R, s.R, 1.f, s.rn, s.R, l.fc1_w, s.R, 0.f, s.t1, s.R,
               GemmType::F32, GemmType::F32, l.fc1_b, s.st);
  bias_gelu_fwd(s.t2, s.t1, nullptr, N, s.R, s.st);
  s.gemm->gemm(false, true, N, s.R, s.R, 1.f, s.t2, s.R, l.fc2_w, s.R, 0.f, s.t1, s.R,
               GemmType::F32, GemmType::F32, l.fc2_b, s.st);
  bias_gelu_fwd(s.t2, s.t1, nullptr, N, s.R, s.st);
  s.gemm->gemm(false, true, N, s.E1, s.R, 1.f, s.t2, s.R, l.out_w, s.R, 0.f, s.rlog, s.E1,
               GemmType::F32, GemmType::F32, nullptr, s.st);
  router_select(s.probs, s.choice, s.gate, s.rlog, l.balancing, N, s.E1, s.st);
}

// The residual scale after the MoE block of layer li, fused with the next norm (the next layer's
// input norm, or the final norm after the last layer).
const float* CudaInference::Impl::next_norm(int64_t li) const {
  return li + 1 < NL ? L[size_t(li + 1)].ln_in : final_norm;
}

void CudaInference::Impl::run_prefill(int64_t S, bool all_logits) {
  const int64_t N = B * S, past = length;
  const float eps = float(c.rms_norm_eps);
  embed_affine_fwd(h, ids, embed, in_s, in_b, bad, N, D, V, st);
  rmsnorm_fwd(x, rstd, h, L[0].ln_in, eps, N, D, st);
  for (int64_t li = 0; li < NL; li++) {
    DevLayer& l = L[size_t(li)];
    const RopeSettings& rs = c.rope_for_layer(li);
    const int64_t rot = int64_t(double(d) * rs.partial_rotary_factor);
    const int64_t window = c.layer_is_sliding(li) ? c.sliding_window : 0;
    gemm->gemm(false, true, N, LD, D, 1.f, x, D, l.wqkv, D, 0.f, qkv, LD, GemmType::BF16,
               GemmType::BF16, nullptr, st);
    cca_conv_fwd(conv, nullptr, qkv, LD, l.hist, true, l.conv_dw_w, l.conv_dw_b, l.conv_g_w,
                 l.conv_g_b, B, S, C, d, c.cca_time0, c.cca_time1, st);
    cca_qkv_finish_fwd(q, k, v, nullptr, conv, qkv, LD, l.temp, l.vd_last, true, past, rs.theta,
                       rot, B, S, Hq, Hkv, d, st);
    kv_append(l.kc, l.vc, k, v, past, opt.max_context, B, S, Hkv, d, st, opt.policy);
    attention_fwd(o, nullptr, q, l.kc, l.vc, B, S, opt.max_context, past, Hq, Hkv, d, window, st);
    gemm->gemm(false, true, N, D, QD, 1.f, o, QD, l.wo, QD, 0.f, a, D, GemmType::BF16,
               GemmType::BF16, nullptr, st);
    residual_scale_rmsnorm_fwd(h, x, rstd, a, h, l.pa_hs, l.pa_hb, l.pa_rs, l.pa_rb, l.ln_post, eps,
                               N, D, st);
    router(li, N, false);
    ws.reset();
    sort_by_expert(perm, counts, offsets, counts_host, choice, N, E1, ws, st);  // synchronises
    int64_t routed = 0;
    for (int64_t e = 0; e < E; e++) routed += counts_host[e];
    if (routed > 0) {
      gather_rows(xs, x, perm, routed, D, st);
      gemm->grouped_gemm(true, counts_host, E, 2 * I, D, 1.f, xs, D, l.gate_up, D, 2 * I * D, 0.f,
                         gu, 2 * I, GemmType::BF16, st);
      swiglu_fwd(act, gu, routed, I, st);
      gemm->grouped_gemm(true, counts_host, E, D, I, 1.f, act, I, l.down, I, D * I, 0.f, ys, D,
                         GemmType::BF16, st);
    }
    scatter_gate_rows(a, ys, x, gate, perm, choice, E, c.skip_output == SkipOutput::ScaledInput, N,
                      routed, D, st);
    residual_scale_rmsnorm_fwd(h, x, rstd, a, h, l.pm_hs, l.pm_hb, l.pm_rs, l.pm_rb, next_norm(li),
                               eps, N, D, st);
  }
  // x now holds the final-normed rows. Logits of every row, or of each sequence's last row.
  if (all_logits)
    gemm->gemm(false, true, N, V, D, 1.f, x, D, embed, D, 0.f, logits, V, GemmType::BF16,
               GemmType::F32, nullptr, st);
  else if (B <= kGemvMaxRows)
    gemv_bf16(logits, nullptr, V, x + (S - 1) * D, S * D, embed, D, nullptr, B, V, D, st, false,
              false, opt.policy);
  else
    gemm->gemm(false, true, B, V, D, 1.f, x + (S - 1) * D, S * D, embed, D, 0.f, logits, V,
               GemmType::BF16, GemmType::F32, nullptr, st);
  advance_lengths(len, int32_t(S), B, st, opt.policy);
}

// One token per sequence, positions from the device counter `len`; graph-capturable (no host
// reads, no synchronisation, no position arguments). The launch forms are the ones measured
// fastest (docs/PERFORMANCE.md, the decode sections; the alternatives are gone from the engine):
// two 16-key passes in flight per attention block, which lets the o projection start once its
// partials are stored; GEMV and expert inputs staged in shared memory; the residual norms as
// launches of their own that let their successor start before they wait; the router's first sums
// computed by the post-attention norm's launch; the step's ends in fewer launches.
void CudaInference::Impl::run_decode_step() {
  const int64_t M = B;
  const float eps = float(c.rms_norm_eps);
  const DecodePolicy& pol = opt.policy;
  constexpr int kAttnPipe = 2, kAttnTrigger = 2;
  constexpr bool kEarly = true;  // the norms' early trigger
  mark("start");
  // The embedding and the first norm as one launch, the LM head's argmax folded into its GEMV and
  // the token and lengths committed by one more (the same bits as the separate launches, which
  // run where the fused ones do not take the sizes).
  const bool fused_ends = decode_embed_norm_supported(D, {h, x, embed, in_s, in_b, L[0].ln_in}) &&
                          lm_head_greedy_supported(M, V, D, x, D, embed);
  if (fused_ends) {
    decode_embed_norm(h, x, ids, embed, in_s, in_b, bad, L[0].ln_in, eps, M, D, V, st, pol);
  } else {
    embed_affine_fwd(h, ids, embed, in_s, in_b, bad, M, D, V, st);
    decode_residual_norm(h, x, nullptr, nullptr, nullptr, nullptr, nullptr, L[0].ln_in, eps, M, D,
                         st, false, pol);
  }
  mark("embedding, norms, residuals");
  const auto on = [&](DecodeOp op) { return (skip & (1u << unsigned(op))) == 0; };
  // The post-attention norm's launch also computes the router's first sums, from which the router
  // starts; the residual then moves to the other buffer (hc: the current one).
  const bool pre_down = router_pre_down_ok && on(DecodeOp::Router);
  float* hc = h;
  for (int64_t li = 0; li < NL; li++) {
    DevLayer& l = L[size_t(li)];
    const RopeSettings& rs = c.rope_for_layer(li);
    const int64_t rot = int64_t(double(d) * rs.partial_rotary_factor);
    const int64_t window = c.layer_is_sliding(li) ? c.sliding_window : 0;
    if (on(DecodeOp::Qkv))
      gemv_bf16(nullptr, qkv, LD, x, D, l.wqkv, D, nullptr, M, LD, D, st, false, true, pol);
    mark("qkv, o projections");
    if (on(DecodeOp::CcaConv))
      decode_conv(conv, qkv, LD, l.hist, l.conv_dw_w, l.conv_dw_b, l.conv_g_w, l.conv_g_b, M, C, d,
                  c.cca_time0, c.cca_time1, st, pol);
    mark("cca conv");
    if (on(DecodeOp::CcaFinish))
      decode_qkv_finish(q, l.kc, l.vc, l.vd_last, l.hist, P, conv, qkv, LD, l.temp, len,
                        opt.max_context, float(rs.theta), rot, M, Hq, Hkv, d, st, pol);
    mark("cca qk-norm, rope, cache");
    if (on(DecodeOp::Attention))
      decode_attention(o, q, l.kc, l.vc, len, opt.max_context, window, M, Hq, Hkv, d, attn_ws, st,
                       0, kAttnPipe, true, kAttnTrigger, pol);
    mark("attention");
    // The o projection, then the post-attention residual + norm; the experts, then the post-MLP
    // residual + norm (into the next layer's input norm).
    if (on(DecodeOp::OProj)) {
      gemv_bf16(nullptr, a, D, o, QD, l.wo, QD, nullptr, M, D, QD, st, false, true, pol);
      if (pre_down) {
        float* hn = hc == h ? h2 : h;
        decode_norm_gemv(hc, hn, x, a, l.pa_hs, l.pa_hb, l.pa_rs, l.pa_rb, l.ln_post, eps, l.r_down,
                         l.r_down_b, r0, nullptr, R, M, D, R, st, kEarly, pol);
        hc = hn;
      } else {
        decode_residual_norm(hc, x, a, l.pa_hs, l.pa_hb, l.pa_rs, l.pa_rb, l.ln_post, eps, M, D, st,
                             kEarly, pol);
      }
    }
    mark("o projection + residual norm");
    if (pre_down)
      router(li, M, true, r0);
    else if (on(DecodeOp::Router))
      router(li, M, true);
    mark("router");
    if (on(DecodeOp::Experts)) {
      decode_experts(a, act, x, l.gate_up, l.down, gate, choice, E,
                     c.skip_output == SkipOutput::ScaledInput, M, D, I, st, true, 8, pol);
      decode_residual_norm(hc, x, a, l.pm_hs, l.pm_hb, l.pm_rs, l.pm_rb, next_norm(li), eps, M, D,
                           st, kEarly, pol);
    }
    mark("experts + residual norm");
  }
  // The argmax goes straight into the next step's input and into the token history at this
  // position (decode_greedy reads the history once, after its last step).
  if (fused_ends) {
    if (on(DecodeOp::LmHead))
      lm_head_greedy(logits, x, D, embed, M, V, D, lm_keys, ids, tok_hist, len, st, true, true,
                     pol);
    else
      advance_lengths(len, 1, M, st, pol);
    mark("lm head, argmax, lengths");
    return;
  }
  if (on(DecodeOp::LmHead))
    gemv_bf16(logits, nullptr, V, x, D, embed, D, nullptr, M, V, D, st, false, false, pol);
  mark("lm head");
  argmax_rows(ids, logits, M, V, argmax_ws, st, tok_hist, len, pol);
  advance_lengths(len, 1, M, st, pol);
  mark("argmax, lengths");
}

// Runs `steps` decode steps (1, or kGraphSteps as one graph): eagerly the first time (module
// loading, kernel attributes), then from a graph captured for the current batch size.
void CudaInference::Impl::decode_launch(int64_t steps) {
  ZAYA_CHECK(steps == 1 || steps == kGraphSteps, "cuda decode: {} steps in one launch", steps);
  if (!opt.graphs || decode_steps_run == 0) {
    for (int64_t i = 0; i < steps; i++) {
      run_decode_step();
      decode_steps_run++;
    }
    return;
  }
  ZAYA_CUDA_CHECK(cudaGraphLaunch(step_graph(steps).exec, st));
  decode_steps_run += int(steps);
}

CudaInference::Impl::StepGraph& CudaInference::Impl::step_graph(int64_t steps) {
  StepGraph& g = steps == 1 ? one_step : k_steps;
  if (g.exec && g.batch == B) return g;
  g.drop();
  // Captured from an idle stream (once per graph): the steps enqueued before it finish first.
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  ZAYA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    for (int64_t i = 0; i < steps; i++) run_decode_step();
  } catch (...) {  // leave the stream usable: end the capture, drop what it holds
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(st, &partial);
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    throw;
  }
  ZAYA_CUDA_CHECK(cudaStreamEndCapture(st, &g.graph));
  ZAYA_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  g.batch = B;
  return g;
}

void CudaInference::prepare_decode_graphs() {
  Impl& s = *impl_;
  if (!s.opt.graphs || s.decode_steps_run == 0) return;
  s.step_graph(1);
  s.step_graph(Impl::kGraphSteps);
}

CudaInference::CudaInference(const ZayaModel& m, const CudaInferOptions& opt)
    : impl_(std::make_unique<Impl>(m, opt)) {}
CudaInference::~CudaInference() = default;

const ZayaConfig& CudaInference::cfg() const {
  return impl_->c;
}
int64_t CudaInference::batch() const {
  return impl_->B;
}
int64_t CudaInference::length() const {
  return impl_->length;
}
int64_t CudaInference::max_context() const {
  return impl_->opt.max_context;
}
int64_t CudaInference::max_logits_rows() const {
  return impl_->logits_rows;
}
const char* decode_op_name(DecodeOp op) {
  switch (op) {
    case DecodeOp::Qkv: return "qkv";
    case DecodeOp::CcaConv: return "cca_conv";
    case DecodeOp::CcaFinish: return "cca_finish";
    case DecodeOp::Attention: return "attention";
    case DecodeOp::OProj: return "o_proj";
    case DecodeOp::Router: return "router";
    case DecodeOp::Experts: return "experts";
    case DecodeOp::LmHead: return "lm_head";
    case DecodeOp::Count: break;
  }
  return "?";
}

void CudaInference::set_decode_skip(unsigned ops) {
  impl_->set_skip(ops);
}
size_t CudaInference::device_bytes() const {
  return impl_->arena_bytes;
}

void CudaInference::reset(int64_t batch) {
  ZAYA_CHECK(batch >= 1 && batch <= impl_->opt.max_batch,
             "cuda inference: batch {} outside 1..{} (max_batch)", batch, impl_->opt.max_batch);
  impl_->B = batch;
  impl_->zero_cache();
}

namespace {

void check_ids(const std::vector<int32_t>& ids, int64_t V) {
  for (size_t i = 0; i < ids.size(); i++)
    ZAYA_CHECK(ids[i] >= 0 && ids[i] < V,
               "token id {} at position {} is outside the vocabulary (0..{})", ids[i], i, V - 1);
}

Tensor download_logits(const float* src, int64_t rows, int64_t B, int64_t V, cudaStream_t st) {
  Tensor out = Tensor::empty({B, rows / B, V}, DType::F32);
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(out.raw(), src, size_t(rows * V) * 4, cudaMemcpyDeviceToHost, st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

}  // namespace

Tensor CudaInference::prefill(const std::vector<int32_t>& ids, int64_t S, bool all_logits) {
  Impl& s = *impl_;
  ZAYA_CHECK(S >= 1 && int64_t(ids.size()) == s.B * S,
             "cuda prefill: {} ids for batch {} x sequence {}", ids.size(), s.B, S);
  ZAYA_CHECK(s.length + S <= s.opt.max_context,
             "cuda prefill: {} + {} tokens exceed the cache capacity of {} (max_context)", s.length,
             S, s.opt.max_context);
  check_ids(ids, s.V);
  if (all_logits)
    ZAYA_CHECK(s.B * S <= s.logits_rows,
               "cuda prefill: all-position logits for {} rows exceed the {}-row logits buffer",
               s.B * S, s.logits_rows);
  // Chunk long prompts so each pass fits the prefill budget; each chunk continues the cache.
  const int64_t chunk = all_logits ? S : std::max<int64_t>(1, s.NP / s.B);
  Tensor all;
  if (all_logits) all = Tensor::empty({s.B, S, s.V}, DType::F32);
  for (int64_t t0 = 0; t0 < S; t0 += chunk) {
    const int64_t n = std::min(chunk, S - t0);
    std::vector<int32_t> part(size_t(s.B * n));
    for (int64_t b = 0; b < s.B; b++)
      std::copy_n(ids.begin() + b * S + t0, n, part.begin() + b * n);
    ZAYA_CUDA_CHECK(
        cudaMemcpyAsync(s.ids, part.data(), part.size() * 4, cudaMemcpyHostToDevice, s.st));
    s.run_prefill(n, all_logits);
    s.length += n;
    if (all_logits) return download_logits(s.logits, s.B * S, s.B, s.V, s.st);
  }
  return download_logits(s.logits, s.B, s.B, s.V, s.st);
}

Tensor CudaInference::decode(const std::vector<int32_t>& ids) {
  Impl& s = *impl_;
  ZAYA_CHECK(int64_t(ids.size()) == s.B, "cuda decode: {} ids for batch {}", ids.size(), s.B);
  ZAYA_CHECK(s.length >= 1, "cuda decode: prefill a prompt first");
  ZAYA_CHECK(s.length + 1 <= s.opt.max_context, "cuda decode: the cache of {} tokens is full",
             s.opt.max_context);
  check_ids(ids, s.V);
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(s.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, s.st));
  s.decode_launch();
  s.length += 1;
  return download_logits(s.logits, s.B, s.B, s.V, s.st);
}

std::vector<int32_t> CudaInference::decode_greedy(const std::vector<int32_t>& first, int64_t n) {
  Impl& s = *impl_;
  ZAYA_CHECK(int64_t(first.size()) == s.B, "cuda decode: {} ids for batch {}", first.size(), s.B);
  ZAYA_CHECK(s.length >= 1, "cuda decode: prefill a prompt first");
  ZAYA_CHECK(s.length + n <= s.opt.max_context,
             "cuda decode: {} + {} tokens exceed the cache capacity of {}", s.length, n,
             s.opt.max_context);
  check_ids(first, s.V);
  std::vector<int32_t> out(size_t(n * s.B));
  if (n == 0) return out;
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(s.ids, first.data(), first.size() * 4, cudaMemcpyHostToDevice, s.st));
  // The steps are enqueued back to back: each step's argmax becomes the next step's input on the
  // device and lands in tok_hist at its position (run_decode_step), and the host waits once, at the
  // end — not after every step, which left the GPU idle for a host round trip and the next graph
  // launch per token.
  // Whole groups of Impl::kGraphSteps run as one graph once the first step has run eagerly.
  const int64_t first_pos = s.length;  // every sequence of the batch is at the same length
  for (int64_t i = 0; i < n;) {
    const int64_t k = s.opt.graphs && s.decode_steps_run > 0 && n - i >= Impl::kGraphSteps
                          ? Impl::kGraphSteps
                          : 1;
    s.decode_launch(k);
    s.length += k;
    i += k;
  }
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(out.data(), s.tok_hist + first_pos * s.B, out.size() * 4,
                                  cudaMemcpyDeviceToHost, s.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(s.st));
  return out;
}

std::vector<std::pair<unsigned, uint64_t>> CudaInference::trace_decode(
    const std::vector<int32_t>& first, int64_t n, std::vector<int32_t>* tokens) {
  Impl& s = *impl_;
  ZAYA_CHECK(decode_trace_built(),
             "decode trace: this build has no decode tracing (configure with "
             "-DZAYA_DECODE_TRACE=ON)");
  // At most ~16 stamps per layer and a few per step; room for twice that.
  const size_t cap = size_t(std::max<int64_t>(n, 1)) * size_t(32 * s.NL + 64);
  unsigned long long* buf = nullptr;
  ZAYA_CUDA_CHECK(cudaMalloc(&buf, (cap + 1) * sizeof(unsigned long long)));
  std::vector<unsigned long long> host(cap + 1);
  std::vector<int32_t> out;
  try {
    ZAYA_CUDA_CHECK(cudaMemset(buf, 0, (cap + 1) * sizeof(unsigned long long)));
    ZAYA_CUDA_CHECK(cudaDeviceSynchronize());  // the constant changes under no running kernel
    set_decode_trace(buf, cap);
    out = decode_greedy(first, n);
    set_decode_trace(nullptr, 0);
    ZAYA_CUDA_CHECK(cudaMemcpy(host.data(), buf, host.size() * sizeof(unsigned long long),
                               cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaDeviceSynchronize();
    set_decode_trace(nullptr, 0);
    cudaFree(buf);
    throw;
  }
  ZAYA_CUDA_CHECK(cudaFree(buf));
  ZAYA_CHECK(host[0] <= cap, "decode trace: {} stamps overflowed the buffer of {}", host[0], cap);
  std::vector<std::pair<unsigned, uint64_t>> stamps(static_cast<size_t>(host[0]));
  for (size_t i = 0; i < stamps.size(); i++)
    stamps[i] = {unsigned(host[1 + i] & 0xffu), uint64_t(host[1 + i] >> 8)};
  if (tokens) *tokens = std::move(out);
  return stamps;
}

std::vector<std::pair<std::string, double>> CudaInference::profile_decode(
    const std::vector<int32_t>& ids) {
  Impl& s = *impl_;
  ZAYA_CHECK(int64_t(ids.size()) == s.B, "cuda decode: {} ids for batch {}", ids.size(), s.B);
  ZAYA_CHECK(s.length >= 1 && s.length + 1 <= s.opt.max_context,
             "cuda decode profile: needs a prefilled cache with room for one more token");
  check_ids(ids, s.V);
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(s.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, s.st));
  s.profiling = true;
  s.run_decode_step();
  s.profiling = false;
  s.length += 1;
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(s.st));
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 1; i < s.marks.size(); i++) {
    float ms = 0;
    ZAYA_CUDA_CHECK(cudaEventElapsedTime(&ms, s.marks[i - 1].second, s.marks[i].second));
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto& p) { return p.first == s.marks[i].first; });
    if (it == out.end())
      out.emplace_back(s.marks[i].first, double(ms));
    else
      it->second += double(ms);
  }
  for (auto& [name, e] : s.marks) cudaEventDestroy(e);
  s.marks.clear();
  return out;
}

double CudaInference::decode_bytes_per_step() const {
  const Impl& s = *impl_;
  const double bf = 2.0, f4 = 4.0;
  // Per layer: packed q/k/v projection, output projection, router (down bf16, MLP fp32), one
  // expert's gate/up and down (top-1), the conv filters, and the K/V cache read so far.
  const double layer = bf * double(s.LD * s.D + s.D * s.QD + s.R * s.D + 3 * s.I * s.D) +
                       f4 * double(2 * s.R * s.R + s.E1 * s.R) +
                       f4 * double(s.C * (s.c.cca_time0 + s.d * s.c.cca_time1)) +
                       bf * double(2 * s.KD) * double(s.length);
  return double(s.NL) * layer + bf * double(s.V * s.D) + bf * double(s.D);
}

}  // namespace zaya::cuda
