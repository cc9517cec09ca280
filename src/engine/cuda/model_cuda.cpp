// CudaModel (model_cuda.h): the ZAYA1 training step and forward pass on one CUDA device, composed
// from the kernels of backend/cuda/ops.h and the cuBLASLt GEMMs of backend/cuda/gemm/gemm.h. The
// CPU model is the specification: ZayaModel::forward (model/zaya.cpp) for the forward and
// zaya::forward_backward (model/backward.cpp) for the gradients, op for op in the same order, with
// bf16 GEMM operands and fp32 everywhere ops.h says so (residual stream, norm and softmax
// statistics, the router MLP, all parameter gradients).
//
// Memory. Parameters live in three device buffers (fp32 masters, fp32 grads, bf16 copies of the
// GEMM weights) laid out in named_tensors() order; within a layer wq, wk, wv_cur and wv_del follow
// each other without padding in all three, so they form one [Hq·d + 2·Hkv·d, D] matrix whose rows
// are the packed qkv projection [q0 | k0 | vc | vd]: one GEMM computes it and one wgrad GEMM writes
// the four gradients. Activations and scratch come from one arena allocated at construction for
// max_tokens (two passes over the same carving code: measure, then hand out pointers), so a step
// allocates nothing. Op workspaces share one Workspace that is reset before every op: all work is
// ordered on one stream, so an op's scratch is dead once the next op is enqueued.
//
// What the backward keeps per layer (recompute off): the layer input h and its norm x (bf16) with
// rstd, the packed qkv rows, the conv output and the depthwise intermediate, the q/k norms, q, k,
// v, the attention output and lse, the o_proj output, h after attention with its norm and rstd, the
// router pre-activations, probabilities, choice, gate and the sort by expert, and the experts'
// gate|up rows, SwiGLU output and output rows. With recompute on it keeps per layer only h, x,
// rstd and the router state r (x is kept so the recomputed layer is bit-identical to the forward
// one, routing included), and reruns the layer's forward into one shared set before its backward.
//
// Not here: the optimizer (optim_cuda.h), gradient all-reduce and sharding (dist/), cached decoding
// (backend/cuda/decode/decode_kernels.h), and multi-token-choice routing (top-1 only, as the config
// validates).
#include "engine/cuda/model_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "backend/cuda/carver.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/heartbeat.h"
#include "engine/train_step.h"

namespace zaya::cuda {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

enum OpClass : int { kGemm, kAttention, kMoeDispatch, kNorms, kLoss, kCca, kOther, kNumClasses };

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Parameters that are GEMM operands in bf16 and therefore carry a bf16 copy. The router's fc1,
// fc2 and out_proj stay fp32 (fp32 GEMMs); its down_proj takes the bf16 norm output as input, so
// its weight is bf16 too.
bool has_bf16_copy(const std::string& n) {
  return ends_with(n, "embed_tokens.weight") || ends_with(n, "q_proj.weight") ||
         ends_with(n, "k_proj.weight") || ends_with(n, "v_proj_current.weight") ||
         ends_with(n, "v_proj_delayed.weight") || ends_with(n, "o_proj.weight") ||
         ends_with(n, "mlp.gate.down_proj.weight") || ends_with(n, "experts.gate_up_proj") ||
         ends_with(n, "experts.down_proj");
}

// Every tensor of the model as a mutable slot, in named_tensors() order (checked by the caller
// against named_tensors(), so this list cannot silently drift from the model's own visitor).
std::vector<Tensor*> tensor_slots(ZayaModel& m) {
  std::vector<Tensor*> s = {&m.embed, &m.input_scale, &m.input_bias, &m.final_norm};
  for (size_t i = 0; i < m.layers.size(); i++) {
    LayerWeights& L = m.layers[i];
    for (Tensor* t :
         {&L.ln_in,        &L.ln_post,     &L.wq,           &L.wk,           &L.wv_cur,
          &L.wv_del,       &L.conv_dw_w,   &L.conv_dw_b,    &L.conv_g_w,     &L.conv_g_b,
          &L.temp,         &L.wo,          &L.post_attn.hs, &L.post_attn.hb, &L.post_attn.rs,
          &L.post_attn.rb, &L.post_mlp.hs, &L.post_mlp.hb,  &L.post_mlp.rs,  &L.post_mlp.rb,
          &L.r_down_w,     &L.r_down_b})
      s.push_back(t);
    if (i > 0) s.push_back(&L.r_states_scale);
    for (Tensor* t : {&L.r_norm, &L.r_fc1_w, &L.r_fc1_b, &L.r_fc2_w, &L.r_fc2_b, &L.r_out_w,
                      &L.balancing_bias, &L.experts_gate_up, &L.experts_down})
      s.push_back(t);
  }
  return s;
}

// Device parameters of one layer.
struct LayerParams {
  DeviceParam *ln_in, *ln_post, *wq, *wk, *wv_cur, *wv_del, *wo;
  DeviceParam *conv_dw_w, *conv_dw_b, *conv_g_w, *conv_g_b, *temp;
  DeviceParam *pa_hs, *pa_hb, *pa_rs, *pa_rb, *pm_hs, *pm_hb, *pm_rs, *pm_rb;
  DeviceParam *r_down_w, *r_down_b, *r_states_scale, *r_norm;
  DeviceParam *r_fc1_w, *r_fc1_b, *r_fc2_w, *r_fc2_b, *r_out_w, *balancing_bias;
  DeviceParam *experts_gate_up, *experts_down;
};

// Activations of one layer (legend of ops.h; M = routed tokens, sorted by expert, M <= N).
struct LayerActs {
  float* hin = nullptr;  // [N,D] layer input (residual stream)
  bf16* xin = nullptr;   // [N,D] rmsnorm(hin)
  float* rstd_in = nullptr;
  bf16* qkv = nullptr;     // [N, LD] packed [q0 | k0 | vc | vd]
  float* conv = nullptr;   // [N,C]
  float* mid = nullptr;    // [B, S+t1-1, C] depthwise output
  float* norms = nullptr;  // [N, Hq+Hkv]
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;   // [B,Hq,S]
  bf16* a = nullptr;      // [N,D] o_proj output
  float* hmid = nullptr;  // [N,D] h after the attention residual
  bf16* xpost = nullptr;  // [N,D] rmsnorm(hmid)
  float* rstd_post = nullptr;
  float* r = nullptr;  // [N,R] router state after the EDA add (before its norm)
  float *rn = nullptr, *rstd_r = nullptr, *h1pre = nullptr, *h1 = nullptr, *h2pre = nullptr,
        *h2 = nullptr;
  float *probs = nullptr, *gate = nullptr;  // [N,E1], [N]
  int32_t *choice = nullptr, *perm = nullptr, *counts = nullptr, *offsets = nullptr;
  bf16 *gu = nullptr, *act = nullptr, *ys = nullptr;  // [M,2I] [M,I] [M,D]
  bf16* m = nullptr;                                  // [N,D] MoE block output
};

}  // namespace

struct CudaModel::Impl {
  ZayaConfig cfg;
  CudaModelOptions opt;
  cudaStream_t st = nullptr;
  std::unique_ptr<GemmContext> gemm;

  // Sizes.
  int64_t D, d, Hq, Hkv, C, QD, KD, VH, LD, R, E, E1, I, V, t0, t1, L;
  float eps;
  int64_t chunk_tokens = 0;  // tokens per LM-head chunk
  size_t ws_capacity = 0;

  // Parameters.
  std::vector<DeviceParam> params;
  std::vector<LayerParams> lp;
  DeviceParam *embed, *in_scale, *in_bias, *final_norm;
  float* master_buf = nullptr;
  float* grad_buf = nullptr;
  bf16* copy_buf = nullptr;
  size_t master_elems = 0, copy_elems = 0;

  // Arena and its carve-outs.
  char* arena = nullptr;
  size_t arena_size = 0;
  Workspace ws;
  int32_t *d_ids, *d_targets, *d_bad, *d_count;
  double* d_loss_sum;
  float* ones;               // [max(N,R)] of 1.0f
  std::vector<float*> hbuf;  // [L+1] residual stream entering each layer; hbuf[L] = final h
  std::vector<LayerActs> acts;
  bf16* hn;  // [N,D] final norm output
  float* rstd_f;
  // Forward scratch.
  float* rlogits;  // [N,E1]
  bf16* xs;        // [N,D] tokens gathered by expert
  // Backward scratch.
  float *dh, *dh2, *dx, *dhn;  // [N,D]
  bf16* dbf;                   // [N,D] gradient of a block output (da / dm)
  bf16* datt;                  // [N,QD]
  bf16 *dq, *dk, *dv;          // [N,QD] [N,KD] [N,KD]
  float* dconv;                // [N,C]
  bf16* dqkv;                  // [N,LD]
  bf16 *dys, *dact, *dgu, *dxs;
  float *dgate, *dlog_r, *da_r, *db_r, *dr, *dr_next;
  bf16* dr_bf;
  // Loss.
  float *logits, *ce_max, *ce_sum, *ce_t, *loss_n, *lse_n;  // logits [chunk,V]; others [N]
  bf16* dlogits;                                            // [chunk,V]

  // Pinned host staging.
  int32_t* h_ids = nullptr;
  int32_t* h_targets = nullptr;
  int32_t* h_counts = nullptr;  // [L, E1] routed tokens per layer and class
  double* h_loss = nullptr;
  int32_t* h_count = nullptr;
  std::vector<int64_t> routed_rows;  // M per layer

  // Context parallelism of the step in flight (cp == null: whole rows). The model then runs on
  // this rank's two chunks of every row as 2·cpB rows of Lc tokens (slot-major), and layer_forward
  // and attention_backward exchange halos, keys and values with the group (model/backward.h).
  Communicator* cp = nullptr;
  bool cp_send_halo_grads = true;
  int64_t cpC = 1, cpR = 0, cpB = 0, cpS = 0, Lc = 0, Ph = 0, gch[2] = {0, 0};
  struct CpLayer {
    float *hist = nullptr, *vdl = nullptr;    // [2B, P, C] conv history, [2B, VH] delayed values
    bf16 *kfull = nullptr, *vfull = nullptr;  // [B, S, KD] the whole sequences' keys and values
  };
  std::vector<CpLayer> cpl;  // per layer, or one shared set when recomputing
  // Device buffers of context parallelism, allocated on the first step that needs them and grown
  // (never shrunk) when a later one needs more; pinned host mirrors for a host communicator.
  struct Grown {
    void* p = nullptr;
    size_t bytes = 0;
    bool host = false;
  };
  std::vector<Grown*> grown;
  Grown g_tails, g_halos, g_dhalos, g_dtails, g_dhist, g_kvsend, g_gather, g_dkv, g_gsend, g_grecv,
      g_layers, h_send, h_recv;
  template <typename T>
  T* grow(Grown& g, size_t n, bool host = false);
  void cp_setup(const ContextParallel* c, int64_t B, int64_t S);
  // Sets up the step's context parallelism (cp_setup), checks the batch and uploads the rows the
  // model runs on: ids/targets [B,S] themselves, or this rank's two chunks of every row
  // (slot-major, model/backward.h). Returns their shape and the count of scored tokens in them.
  struct Rows {
    int64_t B = 0, S = 0, scored = 0;
  };
  // The step's context-parallel group is that step's only, even when it throws.
  struct CpScope {
    Impl& im;
    ~CpScope() { im.cp = nullptr; }
  };
  Rows stage_rows(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S,
                  const ContextParallel* c, const char* what);
  // Runs op(send, recv) on buffers in the communicator's memory: the device buffers themselves for
  // a device communicator (NCCL), else pinned host mirrors that `send` is copied into first and
  // `recv` back out of (MPI, also for GPU ranks: host-staged). Waits for the stream first; recv is
  // zeroed first when `zero`. On return recv's contents are ordered before the stream's later work.
  void cp_comm(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, bool zero,
               const std::function<void(const void*, void*)>& op);
  void cp_halo_forward(int64_t li);
  void cp_gather_kv(int64_t li);
  void cp_scatter_dkv(bf16* const dks[2], bf16* const dvs[2]);
  void cp_return_halo_grads(const float* dhist);

  // Profiling.
  OpClassTimes times;
  std::vector<cudaEvent_t> events;  // pairs (start, stop)
  std::vector<int> event_class;
  size_t events_used = 0;

  Impl(const ZayaModel& m, const CudaModelOptions& o);
  ~Impl();

  void build_params(const ZayaModel& m);
  void carve(Carver& cv);
  size_t workspace_need(int64_t B, int64_t S) const;
  void check_batch(int64_t B, int64_t S, const char* what) const;
  void stage_ids(const int32_t* ids, const int32_t* targets, int64_t N);
  int64_t check_tokens(const int32_t* ids, const int32_t* targets, int64_t N) const;

  // Profiling regions: a start event now, the stop event when the scope closes.
  int prof_start(OpClass c);
  void prof_stop(int i);
  void prof_begin_step();
  void prof_collect();
  struct Scope {
    Impl* im;
    int i;
    Scope(Impl* m, OpClass c) : im(m), i(m->prof_start(c)) {}
    ~Scope() { im->prof_stop(i); }
  };

  Workspace& wsr() {
    ws.reset();
    return ws;
  }

  // nn.Linear in row-major terms: y[N,O] = x[N,K] · w[O,K]^T (+ bias).
  void linear(void* y, GemmType yt, const void* x, int64_t ldx, const void* w, int64_t N, int64_t K,
              int64_t O, GemmType abt, const float* bias) {
    Scope s(this, kGemm);
    gemm->gemm(false, true, N, O, K, 1.0f, x, ldx, w, K, 0.0f, y, O, abt, yt, bias, st);
  }
  // dx[N,K] (= or += by beta) dy[N,O] · w[O,K].
  void dgrad(void* dx_, GemmType dxt, float beta, const void* dy, int64_t N, int64_t K, int64_t O,
             const void* w, GemmType abt) {
    Scope s(this, kGemm);
    gemm->gemm(false, false, N, K, O, 1.0f, dy, O, w, K, beta, dx_, K, abt, dxt, nullptr, st);
  }
  // dw[O,K] += dy[N,O]^T · x[N,K].
  void wgrad(float* dw, const void* dy, const void* x, int64_t N, int64_t K, int64_t O,
             GemmType abt) {
    Scope s(this, kGemm);
    gemm->gemm(true, false, O, K, N, 1.0f, dy, O, x, K, 1.0f, dw, K, abt, GemmType::F32, nullptr,
               st);
  }

  void forward(int64_t B, int64_t S, const LayerWeightsNeeded* needed = nullptr);
  void layer_forward(int64_t li, int64_t B, int64_t S, bool finish);
  // LM head + cross-entropy over chunks of tokens; with `grad_scale` > 0 also dlogits, d(hn) and
  // the tied embedding's head gradient. Leaves the loss sum and count in d_loss_sum / d_count.
  void head_loss(int64_t N, bool backward, float grad_scale);
  void backward(int64_t B, int64_t S, const LayerGradsReady* ready);
  void layer_backward(int64_t li, int64_t B, int64_t S);
  void moe_backward(int64_t li, int64_t N);
  void attention_backward(int64_t li, int64_t B, int64_t S);
};

CudaModel::Impl::Impl(const ZayaModel& m, const CudaModelOptions& o) : cfg(m.cfg), opt(o) {
  cfg.validate("CudaModel config");
  ZAYA_CHECK(int64_t(m.layers.size()) == cfg.num_hidden_layers,
             "CudaModel: the model holds {} layers, its config {}", m.layers.size(),
             cfg.num_hidden_layers);
  ZAYA_CHECK(opt.max_tokens > 0 && opt.max_seq > 0,
             "CudaModel: max_tokens {} and max_seq {} must be positive", opt.max_tokens,
             opt.max_seq);
  ZAYA_CHECK(cfg.num_experts_per_tok == 1, "CudaModel: only top-1 routing is supported (got {})",
             cfg.num_experts_per_tok);
  D = cfg.hidden_size;
  d = cfg.head_dim;
  Hq = cfg.num_attention_heads;
  Hkv = cfg.num_key_value_heads;
  C = cfg.conv_channels();
  QD = Hq * d;
  KD = Hkv * d;
  VH = KD / 2;
  LD = C + KD;
  R = cfg.router_hidden_size;
  E = cfg.num_experts;
  E1 = E + 1;
  I = cfg.moe_intermediate_size;
  V = cfg.vocab_size;
  t0 = cfg.cca_time0;
  t1 = cfg.cca_time1;
  L = cfg.num_hidden_layers;
  eps = float(cfg.rms_norm_eps);
  ZAYA_CHECK(d == 32 || d == 64 || d == 128,
             "CudaModel: head_dim {} is not supported by the attention kernels (32, 64 or 128)", d);

  // Chunk of tokens whose fp32 logits fit the budget; a multiple of 128 rows when it can be.
  int64_t ct = int64_t(opt.logits_chunk_bytes / (size_t(V) * sizeof(float)));
  if (ct >= 128) ct = ct / 128 * 128;
  chunk_tokens = std::clamp<int64_t>(ct, 1, opt.max_tokens);

  ZAYA_CUDA_CHECK(cudaSetDevice(opt.device));
  ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  gemm = std::make_unique<GemmContext>();
  build_params(m);

  // The workspace covers the largest need of one op over the batch shapes max_tokens allows; each
  // step checks its own shape against it (workspace_need).
  const int64_t Smax = std::min(opt.max_seq, opt.max_tokens);
  ws_capacity = std::max(workspace_need(std::max<int64_t>(1, opt.max_tokens / Smax), Smax),
                         workspace_need(opt.max_tokens, 1));
  Carver measure(nullptr);
  carve(measure);
  arena_size = measure.used();
  void* p = nullptr;
  ZAYA_CUDA_CHECK(cudaMalloc(&p, arena_size));
  arena = static_cast<char*>(p);
  Carver real(arena);
  carve(real);
  ZAYA_ASSERT(real.used() == arena_size);

  std::vector<float> one(size_t(std::max(opt.max_tokens, R)), 1.0f);
  ZAYA_CUDA_CHECK(cudaMemcpy(ones, one.data(), one.size() * sizeof(float), cudaMemcpyHostToDevice));

  ZAYA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_ids), size_t(opt.max_tokens) * 4));
  ZAYA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_targets), size_t(opt.max_tokens) * 4));
  ZAYA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_counts), size_t(L * E1) * 4));
  ZAYA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_loss), sizeof(double)));
  ZAYA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_count), sizeof(int32_t)));
  std::memset(h_counts, 0, size_t(L * E1) * 4);
  routed_rows.assign(size_t(L), 0);
  // The set-up copies and memsets above ran on the legacy default stream, which the model's
  // non-blocking stream does not wait for.
  ZAYA_CUDA_CHECK(cudaDeviceSynchronize());
}

CudaModel::Impl::~Impl() {
  // Errors are ignored here: a destructor must not throw, and a failed free leaks at worst.
  cudaSetDevice(opt.device);
  if (st) cudaStreamSynchronize(st);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  gemm.reset();
  cudaFree(arena);
  cudaFree(master_buf);
  cudaFree(grad_buf);
  cudaFree(copy_buf);
  cudaFreeHost(h_ids);
  cudaFreeHost(h_targets);
  cudaFreeHost(h_counts);
  cudaFreeHost(h_loss);
  cudaFreeHost(h_count);
  for (Grown* g : grown) g->host ? cudaFreeHost(g->p) : cudaFree(g->p);
  if (st) cudaStreamDestroy(st);
}

void CudaModel::Impl::build_params(const ZayaModel& m) {
  const auto named = m.named_tensors();
  // Offsets: each tensor starts 256-byte aligned, except the continuations of the packed qkv
  // matrix, which follow their predecessor directly.
  std::vector<size_t> moff(named.size()), coff(named.size(), SIZE_MAX);
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [name, t] : named) sizes.emplace_back(name, t.numel());
  check_flat_layout(sizes, opt.flat_offsets, opt.flat_numel);
  size_t mo = 0, co = 0;
  for (size_t i = 0; i < named.size(); i++) {
    const auto& [name, t] = named[i];
    const bool cont = continues_packed_qkv(name);
    if (!cont) mo = align_up(mo, kAlign / sizeof(float));
    moff[i] = opt.flat_offsets.empty() ? mo : size_t(opt.flat_offsets[i]);
    mo += size_t(t.numel());
    if (has_bf16_copy(name)) {
      if (!cont) co = align_up(co, kAlign / sizeof(bf16));
      coff[i] = co;
      co += size_t(t.numel());
    }
  }
  if (!opt.flat_offsets.empty()) mo = size_t(opt.flat_numel);
  master_elems = mo;
  copy_elems = co;
  void* p = nullptr;
  ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(mo, 1) * sizeof(float)));
  master_buf = static_cast<float*>(p);
  ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(mo, 1) * sizeof(float)));
  grad_buf = static_cast<float*>(p);
  ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(co, 1) * sizeof(bf16)));
  copy_buf = static_cast<bf16*>(p);
  ZAYA_CUDA_CHECK(cudaMemset(grad_buf, 0, std::max<size_t>(mo, 1) * sizeof(float)));
  ZAYA_CUDA_CHECK(cudaMemset(master_buf, 0, std::max<size_t>(mo, 1) * sizeof(float)));  // gaps

  params.reserve(named.size());  // pointers into it are handed out below: no reallocation
  std::map<std::string, DeviceParam*> by_name;
  for (size_t i = 0; i < named.size(); i++) {
    const auto& [name, t] = named[i];
    DeviceParam dp;
    dp.name = name;
    dp.shape = t.shape();
    dp.numel = t.numel();
    dp.master = master_buf + moff[i];
    dp.copy = coff[i] == SIZE_MAX ? nullptr : copy_buf + coff[i];
    // Balancing biases are updated from routing counts, not by gradient (backward.h).
    dp.grad = ends_with(name, "balancing_biases") ? nullptr : grad_buf + moff[i];
    params.push_back(dp);
    by_name[name] = &params.back();
  }
  auto get = [&](const std::string& n) {
    auto it = by_name.find(n);
    ZAYA_CHECK(it != by_name.end(), "CudaModel: the model has no tensor '{}'", n);
    return it->second;
  };
  embed = get("model.embed_tokens.weight");
  in_scale = get("model.input_hidden_states_scale");
  in_bias = get("model.input_hidden_states_bias");
  final_norm = get("model.norm.weight");
  lp.resize(size_t(L));
  for (int64_t li = 0; li < L; li++) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    LayerParams& P = lp[size_t(li)];
    P.ln_in = get(p + "input_layernorm.weight");
    P.ln_post = get(p + "post_attention_layernorm.weight");
    P.wq = get(p + "self_attn.qkv_proj.q_proj.weight");
    P.wk = get(p + "self_attn.qkv_proj.k_proj.weight");
    P.wv_cur = get(p + "self_attn.qkv_proj.v_proj_current.weight");
    P.wv_del = get(p + "self_attn.qkv_proj.v_proj_delayed.weight");
    P.conv_dw_w = get(p + "self_attn.qkv_proj.conv_qk_depthwise.weight");
    P.conv_dw_b = get(p + "self_attn.qkv_proj.conv_qk_depthwise.bias");
    P.conv_g_w = get(p + "self_attn.qkv_proj.conv_qk_grouped.weight");
    P.conv_g_b = get(p + "self_attn.qkv_proj.conv_qk_grouped.bias");
    P.temp = get(p + "self_attn.qk_norm.temp");
    P.wo = get(p + "self_attn.o_proj.weight");
    P.pa_hs = get(p + "post_attention_residual_scale.hidden_states_scale");
    P.pa_hb = get(p + "post_attention_residual_scale.hidden_states_bias");
    P.pa_rs = get(p + "post_attention_residual_scale.residual_scale");
    P.pa_rb = get(p + "post_attention_residual_scale.residual_bias");
    P.pm_hs = get(p + "post_mlp_residual_scale.hidden_states_scale");
    P.pm_hb = get(p + "post_mlp_residual_scale.hidden_states_bias");
    P.pm_rs = get(p + "post_mlp_residual_scale.residual_scale");
    P.pm_rb = get(p + "post_mlp_residual_scale.residual_bias");
    P.r_down_w = get(p + "mlp.gate.down_proj.weight");
    P.r_down_b = get(p + "mlp.gate.down_proj.bias");
    P.r_states_scale = li > 0 ? get(p + "mlp.gate.router_states_scale") : nullptr;
    P.r_norm = get(p + "mlp.gate.router_mlp.norm.weight");
    P.r_fc1_w = get(p + "mlp.gate.router_mlp.fc1.weight");
    P.r_fc1_b = get(p + "mlp.gate.router_mlp.fc1.bias");
    P.r_fc2_w = get(p + "mlp.gate.router_mlp.fc2.weight");
    P.r_fc2_b = get(p + "mlp.gate.router_mlp.fc2.bias");
    P.r_out_w = get(p + "mlp.gate.router_mlp.out_proj.weight");
    P.balancing_bias = get(p + "mlp.gate.balancing_biases");
    P.experts_gate_up = get(p + "mlp.experts.gate_up_proj");
    P.experts_down = get(p + "mlp.experts.down_proj");
    // The packed projection relies on this adjacency (masters, grads and copies alike).
    ZAYA_ASSERT(P.wk->master == P.wq->master + P.wq->numel &&
                P.wv_cur->master == P.wk->master + P.wk->numel &&
                P.wv_del->master == P.wv_cur->master + P.wv_cur->numel);
    ZAYA_ASSERT(P.wk->copy == P.wq->copy + P.wq->numel &&
                P.wv_cur->copy == P.wk->copy + P.wk->numel &&
                P.wv_del->copy == P.wv_cur->copy + P.wv_cur->numel);
    ZAYA_ASSERT(P.wq->numel + P.wk->numel + P.wv_cur->numel + P.wv_del->numel == LD * D);
  }
}

void CudaModel::Impl::carve(Carver& cv) {
  const int64_t N = opt.max_tokens;
  d_ids = cv.take<int32_t>(N);
  d_targets = cv.take<int32_t>(N);
  d_bad = cv.take<int32_t>(1);
  d_count = cv.take<int32_t>(1);
  d_loss_sum = cv.take<double>(1);
  ones = cv.take<float>(std::max(N, R));

  hbuf.assign(size_t(L + 1), nullptr);
  for (auto& h : hbuf) h = cv.take<float>(N * D);
  acts.assign(size_t(L), LayerActs{});
  // Kept per layer in both modes: the layer input's norm and the router state.
  for (auto& A : acts) {
    A.xin = cv.take<bf16>(N * D);
    A.rstd_in = cv.take<float>(N);
    A.r = cv.take<float>(N * R);
  }
  // Everything else: per layer, or one set shared by all layers when recomputing.
  auto carve_rest = [&](LayerActs& A) {
    A.qkv = cv.take<bf16>(N * LD);
    A.conv = cv.take<float>(N * C);
    A.mid = cv.take<float>(N * t1 * C);  // B·(S+t1−1) <= N·t1 rows
    A.norms = cv.take<float>(N * (Hq + Hkv));
    A.q = cv.take<bf16>(N * QD);
    A.k = cv.take<bf16>(N * KD);
    A.v = cv.take<bf16>(N * KD);
    A.o = cv.take<bf16>(N * QD);
    A.lse = cv.take<float>(N * Hq);
    A.a = cv.take<bf16>(N * D);
    A.hmid = cv.take<float>(N * D);
    A.xpost = cv.take<bf16>(N * D);
    A.rstd_post = cv.take<float>(N);
    A.rn = cv.take<float>(N * R);
    A.rstd_r = cv.take<float>(N);
    A.h1pre = cv.take<float>(N * R);
    A.h1 = cv.take<float>(N * R);
    A.h2pre = cv.take<float>(N * R);
    A.h2 = cv.take<float>(N * R);
    A.probs = cv.take<float>(N * E1);
    A.gate = cv.take<float>(N);
    A.choice = cv.take<int32_t>(N);
    A.perm = cv.take<int32_t>(N);
    A.counts = cv.take<int32_t>(E1);
    A.offsets = cv.take<int32_t>(E1 + 1);
    A.gu = cv.take<bf16>(N * 2 * I);
    A.act = cv.take<bf16>(N * I);
    A.ys = cv.take<bf16>(N * D);
    A.m = cv.take<bf16>(N * D);
  };
  if (!opt.recompute) {
    for (auto& A : acts) carve_rest(A);
  } else {
    LayerActs shared;
    carve_rest(shared);
    for (auto& A : acts) {
      LayerActs keep = A;
      A = shared;
      A.xin = keep.xin;
      A.rstd_in = keep.rstd_in;
      A.r = keep.r;
    }
  }
  for (int64_t li = 0; li < L; li++) acts[size_t(li)].hin = hbuf[size_t(li)];
  hn = cv.take<bf16>(N * D);
  rstd_f = cv.take<float>(N);

  rlogits = cv.take<float>(N * E1);
  xs = cv.take<bf16>(N * D);

  dh = cv.take<float>(N * D);
  dh2 = cv.take<float>(N * D);
  dx = cv.take<float>(N * D);
  dhn = cv.take<float>(N * D);
  dbf = cv.take<bf16>(N * D);
  datt = cv.take<bf16>(N * QD);
  dq = cv.take<bf16>(N * QD);
  dk = cv.take<bf16>(N * KD);
  dv = cv.take<bf16>(N * KD);
  dconv = cv.take<float>(N * C);
  dqkv = cv.take<bf16>(N * LD);
  dys = cv.take<bf16>(N * D);
  dact = cv.take<bf16>(N * I);
  dgu = cv.take<bf16>(N * 2 * I);
  dxs = cv.take<bf16>(N * D);
  dgate = cv.take<float>(N);
  dlog_r = cv.take<float>(N * E1);
  da_r = cv.take<float>(N * R);
  db_r = cv.take<float>(N * R);
  dr = cv.take<float>(N * R);
  dr_next = cv.take<float>(N * R);
  dr_bf = cv.take<bf16>(N * R);

  logits = cv.take<float>(chunk_tokens * V);
  dlogits = cv.take<bf16>(chunk_tokens * V);
  ce_max = cv.take<float>(N);
  ce_sum = cv.take<float>(N);
  ce_t = cv.take<float>(N);
  loss_n = cv.take<float>(N);
  lse_n = cv.take<float>(N);

  char* wsb = cv.take<char>(int64_t(ws_capacity));
  ws.base = wsb;
  ws.capacity = ws_capacity;
  ws.used = 0;
}

size_t CudaModel::Impl::workspace_need(int64_t B, int64_t S) const {
  const int64_t N = B * S;
  // Slack for the 256-byte alignment of each take() inside an op.
  constexpr size_t kSlack = 4096;
  size_t need = 0;
  auto at_least = [&](size_t b) { need = std::max(need, b + kSlack); };
  at_least(embed_affine_bwd_workspace_bytes(N, D, V));
  at_least(rmsnorm_bwd_workspace_bytes(N, D));
  at_least(rmsnorm_bwd_workspace_bytes(N, R));
  at_least(residual_scale_bwd_workspace_bytes(N, D));
  at_least(rmsnorm_residual_bwd_workspace_bytes(N, D));
  at_least(bias_gelu_bwd_workspace_bytes(N, R));
  at_least(column_sum_workspace_bytes(N, R));
  at_least(cca_conv_bwd_workspace_bytes(B, S, C, d, t0, t1));
  at_least(cca_qkv_finish_bwd_workspace_bytes(N, Hq, Hkv));
  at_least(attention_bwd_workspace_bytes(B, S, Hq, Hkv, d));
  at_least(sort_by_expert_workspace_bytes(N, E1));
  // sum_loss has no sizing function; per-block partial sums (fp64 + int32) are a few bytes per
  // token at most, so this bound is generous.
  at_least(size_t(N) * 16 + (size_t(1) << 20));
  return need;
}

void CudaModel::Impl::check_batch(int64_t B, int64_t S, const char* what) const {
  ZAYA_CHECK(B > 0 && S > 0, "CudaModel::{}: batch {} x sequence {} is empty", what, B, S);
  ZAYA_CHECK(B * S <= opt.max_tokens,
             "CudaModel::{}: batch {} x sequence {} = {} tokens exceeds max_tokens {}", what, B, S,
             B * S, opt.max_tokens);
  ZAYA_CHECK(S <= opt.max_seq, "CudaModel::{}: sequence {} exceeds max_seq {}", what, S,
             opt.max_seq);
  const size_t need = workspace_need(B, S);
  ZAYA_CHECK(need <= ws_capacity,
             "CudaModel::{}: batch {} x sequence {} needs {} bytes of op workspace, the arena "
             "holds {}",
             what, B, S, need, ws_capacity);
}

int64_t CudaModel::Impl::check_tokens(const int32_t* ids, const int32_t* targets, int64_t N) const {
  // Checked on the host, where the ids are anyway: an error can name the position, and the
  // kernels never see an id outside the table.
  for (int64_t n = 0; n < N; n++)
    ZAYA_CHECK(ids[n] >= 0 && ids[n] < V,
               "CudaModel: token id {} at position {} is outside the vocabulary of {}", ids[n], n,
               V);
  int64_t count = 0;
  if (targets)
    for (int64_t n = 0; n < N; n++) {
      if (targets[n] < 0) continue;
      ZAYA_CHECK(targets[n] < V, "target id {} at position {} is outside the vocabulary of {}",
                 targets[n], n, V);
      count++;
    }
  return count;
}

void CudaModel::Impl::stage_ids(const int32_t* ids, const int32_t* targets, int64_t N) {
  // The pinned staging buffers may still feed a previous step's copies: wait for the stream.
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  std::memcpy(h_ids, ids, size_t(N) * sizeof(int32_t));
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(d_ids, h_ids, size_t(N) * sizeof(int32_t), cudaMemcpyHostToDevice, st));
  if (targets) {
    std::memcpy(h_targets, targets, size_t(N) * sizeof(int32_t));
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(d_targets, h_targets, size_t(N) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st));
  }
}

// ---- profiling ----------------------------------------------------------------------------------

int CudaModel::Impl::prof_start(OpClass c) {
  if (!opt.profile) return -1;
  // Events are created on first use and reused by later steps (profiling only).
  while (events.size() < 2 * (events_used + 1)) {
    cudaEvent_t e;
    ZAYA_CUDA_CHECK(cudaEventCreate(&e));
    events.push_back(e);
  }
  ZAYA_CUDA_CHECK(cudaEventRecord(events[2 * events_used], st));
  if (event_class.size() <= events_used) event_class.resize(events_used + 1);
  event_class[events_used] = c;
  return int(events_used++);
}

void CudaModel::Impl::prof_stop(int i) {
  if (i < 0) return;
  cudaEventRecord(events[2 * size_t(i) + 1], st);  // in a destructor: no throw
}

void CudaModel::Impl::prof_begin_step() {
  times = OpClassTimes{};
  events_used = 0;
}

void CudaModel::Impl::prof_collect() {
  if (!opt.profile) return;
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  double* slot[kNumClasses] = {&times.gemm, &times.attention, &times.moe_dispatch, &times.norms,
                               &times.loss, &times.cca,       &times.other};
  for (size_t i = 0; i < events_used; i++) {
    float ms = 0;
    ZAYA_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    *slot[event_class[i]] += double(ms);
  }
}

// ---- forward ------------------------------------------------------------------------------------

void CudaModel::Impl::forward(int64_t B, int64_t S, const LayerWeightsNeeded* needed) {
  const int64_t N = B * S;
  const bool tell = needed && *needed;
  if (tell) {
    (*needed)(-1);
    (*needed)(0);
  }
  {
    Scope s(this, kOther);
    ZAYA_CUDA_CHECK(cudaMemsetAsync(d_bad, 0, sizeof(int32_t), st));
    embed_affine_fwd(hbuf[0], d_ids, embed->copy, in_scale->master, in_bias->master, d_bad, N, D, V,
                     st);
  }
  {
    Scope s(this, kNorms);
    rmsnorm_fwd(acts[0].xin, acts[0].rstd_in, hbuf[0], lp[0].ln_in->master, eps, N, D, st);
  }
  for (int64_t li = 0; li < L; li++) {
    if (tell && li + 1 < L) (*needed)(li + 1);  // layer li's last kernels read the next input norm
    layer_forward(li, B, S, true);
  }
}

void CudaModel::Impl::layer_forward(int64_t li, int64_t B, int64_t S, bool finish) {
  const LayerParams& P = lp[size_t(li)];
  LayerActs& A = acts[size_t(li)];
  const int64_t N = B * S;
  const RopeSettings& rope = cfg.rope_for_layer(li);
  const int64_t rdim = int64_t(double(d) * rope.partial_rotary_factor);
  const int64_t window = cfg.layer_is_sliding(li) ? cfg.sliding_window : 0;

  // ---- CCA attention ----
  linear(A.qkv, GemmType::BF16, A.xin, D, P.wq->copy, N, D, LD, GemmType::BF16, nullptr);
  if (!cp) {
    {
      Scope s(this, kCca);
      cca_conv_fwd(A.conv, A.mid, A.qkv, LD, nullptr, false, P.conv_dw_w->master,
                   P.conv_dw_b->master, P.conv_g_w->master, P.conv_g_b->master, B, S, C, d, t0, t1,
                   st);
      cca_qkv_finish_fwd(A.q, A.k, A.v, A.norms, A.conv, A.qkv, LD, P.temp->master, nullptr, false,
                         0, rope.theta, rdim, B, S, Hq, Hkv, d, st);
    }
    Scope s(this, kAttention);
    attention_fwd(A.o, A.lse, A.q, A.k, A.v, B, S, S, 0, Hq, Hkv, d, window, st);
  } else {
    // B = 2·cpB chunk rows of S = Lc tokens. The convolutions start from the previous chunk's
    // columns and each slot's RoPE positions and delayed values continue the whole sequence; each
    // slot's queries attend to the gathered keys at their global offsets.
    cp_halo_forward(li);
    const CpLayer& X = cpl[opt.recompute ? 0 : size_t(li)];
    {
      Scope s(this, kCca);
      cca_conv_fwd(A.conv, A.mid, A.qkv, LD, X.hist, false, P.conv_dw_w->master,
                   P.conv_dw_b->master, P.conv_g_w->master, P.conv_g_b->master, B, S, C, d, t0, t1,
                   st);
      for (int64_t sl = 0; sl < 2; sl++) {
        const int64_t n0 = sl * cpB * Lc;
        cca_qkv_finish_fwd(A.q + n0 * QD, A.k + n0 * KD, A.v + n0 * KD, A.norms + n0 * (Hq + Hkv),
                           A.conv + n0 * C, A.qkv + n0 * LD, LD, P.temp->master,
                           X.vdl + sl * cpB * VH, false, gch[sl] * Lc, rope.theta, rdim, cpB, Lc,
                           Hq, Hkv, d, st);
      }
    }
    cp_gather_kv(li);
    Scope s(this, kAttention);
    for (int64_t sl = 0; sl < 2; sl++) {
      const int64_t n0 = sl * cpB * Lc;
      attention_fwd(A.o + n0 * QD, A.lse + sl * cpB * Hq * Lc, A.q + n0 * QD, X.kfull, X.vfull, cpB,
                    Lc, cpS, gch[sl] * Lc, Hq, Hkv, d, window, st);
    }
  }
  linear(A.a, GemmType::BF16, A.o, QD, P.wo->copy, N, QD, D, GemmType::BF16, nullptr);
  {
    Scope s(this, kNorms);
    residual_scale_rmsnorm_fwd(A.hmid, A.xpost, A.rstd_post, A.a, A.hin, P.pa_hs->master,
                               P.pa_hb->master, P.pa_rs->master, P.pa_rb->master, P.ln_post->master,
                               eps, N, D, st);
  }

  // ---- router (fp32 after the down projection) ----
  linear(A.r, GemmType::F32, A.xpost, D, P.r_down_w->copy, N, D, R, GemmType::BF16,
         P.r_down_b->master);
  {
    Scope s(this, kOther);
    // EDA: add the previous layer's state, taken before its norm (as the CPU model does).
    if (li > 0) router_eda_fwd(A.r, acts[size_t(li - 1)].r, P.r_states_scale->master, N, R, st);
  }
  {
    Scope s(this, kNorms);
    rmsnorm_fwd_f32(A.rn, A.rstd_r, A.r, P.r_norm->master, eps, N, R, st);
  }
  linear(A.h1pre, GemmType::F32, A.rn, R, P.r_fc1_w->master, N, R, R, GemmType::F32, nullptr);
  {
    Scope s(this, kOther);
    bias_gelu_fwd(A.h1, A.h1pre, P.r_fc1_b->master, N, R, st);
  }
  linear(A.h2pre, GemmType::F32, A.h1, R, P.r_fc2_w->master, N, R, R, GemmType::F32, nullptr);
  {
    Scope s(this, kOther);
    bias_gelu_fwd(A.h2, A.h2pre, P.r_fc2_b->master, N, R, st);
  }
  linear(rlogits, GemmType::F32, A.h2, R, P.r_out_w->master, N, R, E1, GemmType::F32, nullptr);

  // ---- experts ----
  int32_t* counts_host = h_counts + li * E1;
  {
    Scope s(this, kMoeDispatch);
    router_select(A.probs, A.choice, A.gate, rlogits, P.balancing_bias->master, N, E1, st);
    // Synchronises: the grouped GEMMs take the per-expert row counts on the host.
    sort_by_expert(A.perm, A.counts, A.offsets, counts_host, A.choice, N, E1, wsr(), st);
  }
  int64_t M = 0;
  for (int64_t e = 0; e < E; e++) M += counts_host[e];
  routed_rows[size_t(li)] = M;
  if (M > 0) {
    {
      Scope s(this, kMoeDispatch);
      gather_rows(xs, A.xpost, A.perm, M, D, st);
    }
    {
      Scope s(this, kGemm);
      gemm->grouped_gemm(true, counts_host, E, 2 * I, D, 1.0f, xs, D, P.experts_gate_up->copy, D,
                         2 * I * D, 0.0f, A.gu, 2 * I, GemmType::BF16, st);
    }
    {
      Scope s(this, kOther);
      swiglu_fwd(A.act, A.gu, M, I, st);
    }
    {
      Scope s(this, kGemm);
      gemm->grouped_gemm(true, counts_host, E, D, I, 1.0f, A.act, I, P.experts_down->copy, I, D * I,
                         0.0f, A.ys, D, GemmType::BF16, st);
    }
  }
  const bool scaled = cfg.skip_output == SkipOutput::ScaledInput;
  {
    Scope s(this, kMoeDispatch);
    scatter_gate_rows(A.m, A.ys, A.xpost, A.gate, A.perm, A.choice, E, scaled, N, M, D, st);
  }
  if (!finish) return;
  // Residual, fused with the next norm: the next layer's input norm, or the final norm.
  const bool last = li + 1 == L;
  Scope s(this, kNorms);
  residual_scale_rmsnorm_fwd(hbuf[size_t(li + 1)], last ? hn : acts[size_t(li + 1)].xin,
                             last ? rstd_f : acts[size_t(li + 1)].rstd_in, A.m, A.hmid,
                             P.pm_hs->master, P.pm_hb->master, P.pm_rs->master, P.pm_rb->master,
                             last ? final_norm->master : lp[size_t(li + 1)].ln_in->master, eps, N,
                             D, st);
}

void CudaModel::Impl::head_loss(int64_t N, bool backward, float grad_scale) {
  for (int64_t n0 = 0; n0 < N; n0 += chunk_tokens) {
    const int64_t Nc = std::min(chunk_tokens, N - n0);
    linear(logits, GemmType::F32, hn + n0 * D, D, embed->copy, Nc, D, V, GemmType::BF16, nullptr);
    {
      Scope s(this, kLoss);
      ce_init(ce_max + n0, ce_sum + n0, ce_t + n0, Nc, st);
      ce_chunk_stats(ce_max + n0, ce_sum + n0, ce_t + n0, logits, d_targets + n0, 0, Nc, V, st);
      ce_finalize(loss_n + n0, lse_n + n0, ce_max + n0, ce_sum + n0, ce_t + n0, d_targets + n0, Nc,
                  st);
      if (backward)
        ce_chunk_grad(dlogits, logits, lse_n + n0, d_targets + n0, grad_scale, 0, Nc, V, st);
    }
    if (backward) {
      // Tied head: d(hn) rows of this chunk, and the head's part of the embedding gradient.
      dgrad(dhn + n0 * D, GemmType::F32, 0.0f, dlogits, Nc, D, V, embed->copy, GemmType::BF16);
      wgrad(embed->grad, dlogits, hn + n0 * D, Nc, D, V, GemmType::BF16);
    }
  }
  Scope s(this, kLoss);
  sum_loss(d_loss_sum, d_count, loss_n, d_targets, N, wsr(), st);
}

// ---- backward -----------------------------------------------------------------------------------

void CudaModel::Impl::backward(int64_t B, int64_t S, const LayerGradsReady* ready) {
  const int64_t N = B * S;
  {
    Scope s(this, kNorms);
    if (!opt.recompute) {
      // The final norm's backward fused with layer L-1's post-MLP residual backward (d h_out never
      // goes to memory): dbf = d m, dh2 = d hmid of layer L-1; layer_backward skips that step.
      const LayerParams& P = lp[size_t(L - 1)];
      const LayerActs& A = acts[size_t(L - 1)];
      rmsnorm_residual_bwd(dbf, dh2, final_norm->grad, P.pm_hs->grad, P.pm_hb->grad, P.pm_rs->grad,
                           P.pm_rb->grad, dhn, hbuf[size_t(L)], final_norm->master, rstd_f, nullptr,
                           A.m, A.hmid, P.pm_hs->master, P.pm_hb->master, P.pm_rs->master,
                           P.pm_rb->master, N, D, wsr(), st);
    } else {
      rmsnorm_bwd_f32(dh, final_norm->grad, dhn, hbuf[size_t(L)], final_norm->master, rstd_f, false,
                      N, D, wsr(), st);
    }
  }
  for (int64_t li = L - 1; li >= 0; li--) {
    if (opt.recompute) layer_forward(li, B, S, false);
    layer_backward(li, B, S);
    // Layer li's gradients are all enqueued (its post-MLP residual's came with layer li+1's
    // input norm, or first for the last layer); nothing later writes them.
    if (ready && *ready) (*ready)(li);
  }
  // Input affine h0 = (table[id] + b) ⊙ s, then the embedding rows.
  Scope s(this, kOther);
  embed_affine_bwd(embed->grad, in_scale->grad, in_bias->grad, dh, d_ids, embed->copy,
                   in_scale->master, in_bias->master, N, D, V, wsr(), st);
  if (ready && *ready) (*ready)(-1);
}

// On entry dh holds d loss / d h_out of layer li; on exit d loss / d h_in. Without recompute the
// norm backwards are fused with the residual backward that consumes them, across layers too: then
// on entry dbf and dh2 already hold the post-MLP residual's outputs, and on exit (li > 0) they hold
// those of layer li-1 instead of d h_in in dh. rmsnorm_residual_bwd gives the same bits as the
// separate calls, so recompute on and off still agree exactly.
void CudaModel::Impl::layer_backward(int64_t li, int64_t B, int64_t S) {
  const LayerParams& P = lp[size_t(li)];
  LayerActs& A = acts[size_t(li)];
  const int64_t N = B * S;
  const bool fused = !opt.recompute;
  if (!fused) {
    Scope s(this, kNorms);
    // Post-MLP residual: dbf = d m (bf16), dh2 = d hmid through the residual path (=).
    residual_scale_bwd(dbf, dh2, P.pm_hs->grad, P.pm_hb->grad, P.pm_rs->grad, P.pm_rb->grad, dh,
                       A.m, A.hmid, P.pm_hs->master, P.pm_hb->master, P.pm_rs->master,
                       P.pm_rb->master, N, D, wsr(), st);
  }
  moe_backward(li, N);  // dx = d xpost
  {
    Scope s(this, kNorms);
    // Post-attention norm (dh2 += its dx) and residual: dbf = d a, dh = d hin through the residual
    // path (=).
    rmsnorm_residual_bwd(dbf, dh, P.ln_post->grad, P.pa_hs->grad, P.pa_hb->grad, P.pa_rs->grad,
                         P.pa_rb->grad, dx, A.hmid, P.ln_post->master, A.rstd_post, dh2, A.a, A.hin,
                         P.pa_hs->master, P.pa_hb->master, P.pa_rs->master, P.pa_rb->master, N, D,
                         wsr(), st);
  }
  attention_backward(li, B, S);  // dx = d xin
  Scope s(this, kNorms);
  if (fused && li > 0) {
    // Input norm (dh += its dx = d h_out of layer li-1) with layer li-1's post-MLP residual.
    const LayerParams& Q = lp[size_t(li - 1)];
    const LayerActs& Z = acts[size_t(li - 1)];
    rmsnorm_residual_bwd(dbf, dh2, P.ln_in->grad, Q.pm_hs->grad, Q.pm_hb->grad, Q.pm_rs->grad,
                         Q.pm_rb->grad, dx, A.hin, P.ln_in->master, A.rstd_in, dh, Z.m, Z.hmid,
                         Q.pm_hs->master, Q.pm_hb->master, Q.pm_rs->master, Q.pm_rb->master, N, D,
                         wsr(), st);
  } else {
    rmsnorm_bwd_f32(dh, P.ln_in->grad, dx, A.hin, P.ln_in->master, A.rstd_in, true, N, D, wsr(),
                    st);
  }
}

// From dbf = d m to dx = d xpost (fp32, =). dr_next holds d loss / d r of layer li+1 on entry and
// that of layer li on exit.
void CudaModel::Impl::moe_backward(int64_t li, int64_t N) {
  const LayerParams& P = lp[size_t(li)];
  LayerActs& A = acts[size_t(li)];
  const int32_t* counts_host = h_counts + li * E1;
  const int64_t M = routed_rows[size_t(li)];
  const bool scaled = cfg.skip_output == SkipOutput::ScaledInput;
  {
    Scope s(this, kMoeDispatch);
    // dx collects the experts' rows, the scaled-input skips and the router's down projection.
    ZAYA_CUDA_CHECK(cudaMemsetAsync(dx, 0, size_t(N * D) * sizeof(float), st));
    scatter_gate_rows_bwd(dys, dgate, scaled ? dx : nullptr, dbf, A.ys, A.xpost, A.gate, A.perm,
                          A.choice, E, scaled, N, M, D, st);
  }
  if (M > 0) {
    {
      Scope s(this, kGemm);
      gemm->grouped_wgrad(counts_host, E, D, I, 1.0f, dys, D, A.act, I, 1.0f, P.experts_down->grad,
                          D * I, GemmType::F32, st);
      gemm->grouped_gemm(false, counts_host, E, I, D, 1.0f, dys, D, P.experts_down->copy, I, D * I,
                         0.0f, dact, I, GemmType::BF16, st);
    }
    {
      Scope s(this, kOther);
      swiglu_bwd(dgu, dact, A.gu, M, I, st);
    }
    {
      Scope s(this, kMoeDispatch);
      gather_rows(xs, A.xpost, A.perm, M, D, st);  // regathered rather than kept per layer
    }
    {
      Scope s(this, kGemm);
      gemm->grouped_wgrad(counts_host, E, 2 * I, D, 1.0f, dgu, 2 * I, xs, D, 1.0f,
                          P.experts_gate_up->grad, 2 * I * D, GemmType::F32, st);
      gemm->grouped_gemm(false, counts_host, E, D, 2 * I, 1.0f, dgu, 2 * I, P.experts_gate_up->copy,
                         D, 2 * I * D, 0.0f, dxs, D, GemmType::BF16, st);
    }
    Scope s(this, kMoeDispatch);
    scatter_add_rows(dx, dxs, A.perm, M, D, st);
  }
  // Router, in reverse: gate -> logits -> out_proj -> fc2 -> fc1 -> norm -> state.
  {
    Scope s(this, kMoeDispatch);
    router_select_bwd(dlog_r, dgate, A.probs, A.choice, N, E1, st);
  }
  wgrad(P.r_out_w->grad, dlog_r, A.h2, N, R, E1, GemmType::F32);
  dgrad(da_r, GemmType::F32, 0.0f, dlog_r, N, R, E1, P.r_out_w->master, GemmType::F32);
  {
    Scope s(this, kOther);
    bias_gelu_bwd(db_r, P.r_fc2_b->grad, da_r, A.h2pre, P.r_fc2_b->master, N, R, wsr(), st);
  }
  wgrad(P.r_fc2_w->grad, db_r, A.h1, N, R, R, GemmType::F32);
  dgrad(da_r, GemmType::F32, 0.0f, db_r, N, R, R, P.r_fc2_w->master, GemmType::F32);
  {
    Scope s(this, kOther);
    bias_gelu_bwd(db_r, P.r_fc1_b->grad, da_r, A.h1pre, P.r_fc1_b->master, N, R, wsr(), st);
  }
  wgrad(P.r_fc1_w->grad, db_r, A.rn, N, R, R, GemmType::F32);
  dgrad(da_r, GemmType::F32, 0.0f, db_r, N, R, R, P.r_fc1_w->master, GemmType::F32);
  {
    Scope s(this, kNorms);
    rmsnorm_bwd_f32(dr, P.r_norm->grad, da_r, A.r, P.r_norm->master, A.rstd_r, false, N, R, wsr(),
                    st);
  }
  {
    Scope s(this, kOther);
    // EDA chain: layer li+1 added sc_{li+1} ⊙ r_li to its state, so dr += sc_{li+1} ⊙ dr_{li+1}
    // (the same elementwise form as the forward add).
    if (li + 1 < L)
      router_eda_fwd(dr, dr_next, lp[size_t(li + 1)].r_states_scale->master, N, R, st);
    // d states_scale = Σ_n dr ⊙ r_{li-1}: the weight gradient of an RMSNorm whose rstd and weight
    // are 1 (no dx), which keeps the sum deterministic without a dedicated kernel.
    if (li > 0)
      rmsnorm_bwd_f32(nullptr, P.r_states_scale->grad, dr, acts[size_t(li - 1)].r, ones, ones,
                      false, N, R, wsr(), st);
    f32_to_bf16(dr_bf, dr, N * R, st);
    column_sum(P.r_down_b->grad, dr, N, R, wsr(), st);
  }
  wgrad(P.r_down_w->grad, dr_bf, A.xpost, N, D, R, GemmType::BF16);
  dgrad(dx, GemmType::F32, 1.0f, dr_bf, N, D, R, P.r_down_w->copy, GemmType::BF16);
  std::swap(dr, dr_next);
}

// From dbf = d a (the o_proj output) to dx = d xin (fp32, =).
void CudaModel::Impl::attention_backward(int64_t li, int64_t B, int64_t S) {
  const LayerParams& P = lp[size_t(li)];
  LayerActs& A = acts[size_t(li)];
  const int64_t N = B * S;
  const RopeSettings& rope = cfg.rope_for_layer(li);
  const int64_t rdim = int64_t(double(d) * rope.partial_rotary_factor);
  const int64_t window = cfg.layer_is_sliding(li) ? cfg.sliding_window : 0;
  wgrad(P.wo->grad, dbf, A.o, N, QD, D, GemmType::BF16);
  dgrad(datt, GemmType::BF16, 0.0f, dbf, N, QD, D, P.wo->copy, GemmType::BF16);
  if (!cp) {
    {
      Scope s(this, kAttention);
      attention_bwd(dq, dk, dv, datt, A.o, A.lse, A.q, A.k, A.v, B, S, Hq, Hkv, d, window, wsr(),
                    st);
    }
    Scope s(this, kCca);
    // finish_bwd writes every channel of dqkv (q0/k0 with the mean-skip path); conv_bwd then adds
    // its input gradient into the q0/k0 channels (ops.h's ordering note).
    cca_qkv_finish_bwd(dconv, dqkv, LD, P.temp->grad, dq, dk, dv, A.conv, A.qkv, A.norms,
                       P.temp->master, rope.theta, rdim, B, S, Hq, Hkv, d, wsr(), st);
    cca_conv_bwd(dqkv, LD, P.conv_dw_w->grad, P.conv_dw_b->grad, P.conv_g_w->grad, P.conv_g_b->grad,
                 dconv, A.qkv, A.mid, P.conv_dw_w->master, P.conv_g_w->master, B, S, C, d, t0, t1,
                 wsr(), st);
  } else {
    // Each slot's queries give gradients for keys and values of the whole sequence; the group
    // sums them and each rank keeps its own tokens' (reduce-scatter into dk, dv).
    const CpLayer& X = cpl[opt.recompute ? 0 : size_t(li)];
    const int64_t nf = cpB * cpS * KD;
    bf16* const base = grow<bf16>(g_dkv, size_t(4 * nf));
    bf16* const dks[2] = {base, base + nf};
    bf16* const dvs[2] = {base + 2 * nf, base + 3 * nf};
    {
      Scope s(this, kAttention);
      for (int64_t sl = 0; sl < 2; sl++) {
        const int64_t n0 = sl * cpB * Lc;
        attention_bwd(dq + n0 * QD, dks[sl], dvs[sl], datt + n0 * QD, A.o + n0 * QD,
                      A.lse + sl * cpB * Hq * Lc, A.q + n0 * QD, X.kfull, X.vfull, cpB, Lc, cpS,
                      gch[sl] * Lc, Hq, Hkv, d, window, wsr(), st);
      }
    }
    cp_scatter_dkv(dks, dvs);
    Scope s(this, kCca);
    for (int64_t sl = 0; sl < 2; sl++) {
      const int64_t n0 = sl * cpB * Lc;
      cca_qkv_finish_bwd(dconv + n0 * C, dqkv + n0 * LD, LD, P.temp->grad, dq + n0 * QD,
                         dk + n0 * KD, dv + n0 * KD, A.conv + n0 * C, A.qkv + n0 * LD,
                         A.norms + n0 * (Hq + Hkv), P.temp->master, gch[sl] * Lc, rope.theta, rdim,
                         cpB, Lc, Hq, Hkv, d, wsr(), st);
    }
    float* dhist = grow<float>(g_dhist, size_t(B * Ph * C));
    cca_conv_bwd(dqkv, LD, P.conv_dw_w->grad, P.conv_dw_b->grad, P.conv_g_w->grad, P.conv_g_b->grad,
                 dconv, A.qkv, A.mid, P.conv_dw_w->master, P.conv_g_w->master, B, S, C, d, t0, t1,
                 X.hist, dhist, wsr(), st);
    // The halos' gradients go back to their producers; this rank's tails get theirs (q0|k0 of the
    // last P tokens and vd of the last token of each chunk row) before the projections' backward.
    cp_return_halo_grads(dhist);
  }
  // One wgrad for wq|wk|wv_cur|wv_del (adjacent grads) and one dgrad through the packed matrix.
  wgrad(P.wq->grad, dqkv, A.xin, N, D, LD, GemmType::BF16);
  dgrad(dx, GemmType::F32, 0.0f, dqkv, N, D, LD, P.wq->copy, GemmType::BF16);
}

// ---- context parallelism ------------------------------------------------------------------------

template <typename T>
T* CudaModel::Impl::grow(Grown& g, size_t n, bool host) {
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
  if (g.bytes < bytes) {
    // Only between steps' work: the stream may still read the old buffer.
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
    if (g.p) ZAYA_CUDA_CHECK(g.host ? cudaFreeHost(g.p) : cudaFree(g.p));
    g.p = nullptr;
    g.bytes = 0;
    ZAYA_CUDA_CHECK(host ? cudaMallocHost(&g.p, bytes) : cudaMalloc(&g.p, bytes));
    g.bytes = bytes;
    g.host = host;
    if (std::find(grown.begin(), grown.end(), &g) == grown.end()) grown.push_back(&g);
  }
  return static_cast<T*>(g.p);
}

void CudaModel::Impl::cp_setup(const ContextParallel* c, int64_t B, int64_t S) {
  cp = c && c->comm && c->comm->size() >= 2 ? c->comm : nullptr;
  if (!cp) return;
  cp_send_halo_grads = c->send_halo_grads;
  cpC = cp->size();
  cpR = cp->rank();
  check_context_split(cfg, S, cpC);
  cpB = B;
  cpS = S;
  Lc = S / (2 * cpC);
  Ph = (t0 - 1) + (t1 - 1);
  const std::array<int64_t, 2> g = context_chunks(int(cpR), int(cpC));
  gch[0] = g[0];
  gch[1] = g[1];
  // Per layer (or one shared set): the conv history and delayed values of the chunk rows, and the
  // gathered keys and values of the whole sequences.
  const size_t sets = opt.recompute ? 1 : size_t(L);
  const size_t hist = align_up(size_t(2 * B * Ph * C) * 4, kAlign),
               vdl = align_up(size_t(2 * B * VH) * 4, kAlign),
               kv = align_up(size_t(B * S * KD) * 2, kAlign), per = hist + vdl + 2 * kv;
  char* base = grow<char>(g_layers, sets * per);
  cpl.assign(sets, CpLayer{});
  for (size_t i = 0; i < sets; i++) {
    char* p = base + i * per;
    cpl[i].hist = reinterpret_cast<float*>(p);
    cpl[i].vdl = reinterpret_cast<float*>(p + hist);
    cpl[i].kfull = reinterpret_cast<bf16*>(p + hist + vdl);
    cpl[i].vfull = reinterpret_cast<bf16*>(p + hist + vdl + kv);
  }
}

CudaModel::Impl::Rows CudaModel::Impl::stage_rows(const int32_t* ids, const int32_t* targets,
                                                  int64_t B, int64_t S, const ContextParallel* c,
                                                  const char* what) {
  cp_setup(c, B, S);
  Rows r{B, S, 0};
  const int32_t *lids = ids, *ltargets = targets;
  std::vector<int32_t> chunk_ids, chunk_targets;
  if (cp) {
    r.B = 2 * B;
    r.S = Lc;
    context_take_chunks(ids, targets, B, S, int(cpR), int(cpC), chunk_ids, chunk_targets);
    lids = chunk_ids.data();
    ltargets = chunk_targets.data();
  }
  check_batch(r.B, r.S, what);
  r.scored = check_tokens(lids, ltargets, r.B * r.S);
  stage_ids(lids, ltargets, r.B * r.S);
  return r;
}

void CudaModel::Impl::cp_comm(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                              bool zero, const std::function<void(const void*, void*)>& op) {
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  if (cp->buffer_on_device()) {
    if (zero) ZAYA_CUDA_CHECK(cudaMemsetAsync(recv, 0, recv_bytes, st));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
    op(send, recv);
    cp->synchronize();
    return;
  }
  char* hs = grow<char>(h_send, send_bytes, true);
  char* hr = grow<char>(h_recv, recv_bytes, true);
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(hs, send, send_bytes, cudaMemcpyDeviceToHost, st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  if (zero) std::memset(hr, 0, recv_bytes);
  op(hs, hr);
  // The next cp_comm waits for the stream before it reuses the mirrors.
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(recv, hr, recv_bytes, cudaMemcpyHostToDevice, st));
}

// After the qkv projection of layer li: this rank's chunk rows' tails to the ranks of the next
// chunks, their halos from the previous ones, split into the conv history and delayed values.
void CudaModel::Impl::cp_halo_forward(int64_t li) {
  const CpLayer& X = cpl[opt.recompute ? 0 : size_t(li)];
  const int64_t Br = 2 * cpB, T = Ph * C + VH, row = cpB * T;
  float* tails = grow<float>(g_tails, size_t(Br * T));
  float* halos = grow<float>(g_halos, size_t(Br * T));
  Scope s(this, kOther);
  cp_pack_tails(tails, acts[size_t(li)].qkv, LD, Br, Lc, Ph, C, VH, st);
  cp_comm(tails, size_t(Br * T) * 4, halos, size_t(Br * T) * 4, true, [&](const void* a, void* b) {
    context_pass_tails(*cp, static_cast<const float*>(a), static_cast<float*>(b), size_t(row));
  });
  if (cpR == cpC - 1)  // chunk C−1 (slot 0) precedes chunk C (slot 1) on this rank
    ZAYA_CUDA_CHECK(
        cudaMemcpyAsync(halos + row, tails, size_t(row) * 4, cudaMemcpyDeviceToDevice, st));
  cp_split_halos(X.hist, X.vdl, halos, Br, Ph, C, VH, st);
}

// Keys and values of the whole sequences from the group (all-gather of every rank's k | v).
void CudaModel::Impl::cp_gather_kv(int64_t li) {
  const CpLayer& X = cpl[opt.recompute ? 0 : size_t(li)];
  const LayerActs& A = acts[size_t(li)];
  const int64_t nl = 2 * cpB * Lc * KD;
  bf16* send = grow<bf16>(g_kvsend, size_t(2 * nl));
  bf16* all = grow<bf16>(g_gather, size_t(cpC * 2 * nl));
  Scope s(this, kOther);
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(send, A.k, size_t(nl) * 2, cudaMemcpyDeviceToDevice, st));
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(send + nl, A.v, size_t(nl) * 2, cudaMemcpyDeviceToDevice, st));
  cp_comm(send, size_t(2 * nl) * 2, all, size_t(cpC * 2 * nl) * 2, false,
          [&](const void* a, void* b) { cp->all_gather(a, b, size_t(2 * nl), DType::BF16); });
  cp_ranks_to_sequence(X.kfull, all, 2 * nl, cpB, cpS, cpC, KD, st);
  cp_ranks_to_sequence(X.vfull, all + nl, 2 * nl, cpB, cpS, cpC, KD, st);
}

// The keys' and values' gradients of both slots, summed over the group (fp32 reduce-scatter);
// this rank's tokens' into dk, dv (bf16, as the single-device backward leaves them).
void CudaModel::Impl::cp_scatter_dkv(bf16* const dks[2], bf16* const dvs[2]) {
  const int64_t nl = 2 * cpB * Lc * KD;
  float* send = grow<float>(g_gsend, size_t(cpC * 2 * nl));
  float* mine = grow<float>(g_grecv, size_t(2 * nl));
  Scope s(this, kOther);
  cp_sequence_to_ranks(send, 2 * nl, dks[0], dks[1], cpB, cpS, cpC, KD, st);
  cp_sequence_to_ranks(send + nl, 2 * nl, dvs[0], dvs[1], cpB, cpS, cpC, KD, st);
  cp_comm(send, size_t(cpC * 2 * nl) * 4, mine, size_t(2 * nl) * 4, false,
          [&](const void* a, void* b) {
            cp->reduce_scatter(a, b, size_t(2 * nl), DType::F32, RedOp::Sum);
          });
  f32_to_bf16(dk, mine, nl, st);
  f32_to_bf16(dv, mine + nl, nl, st);
}

// The halos' gradients (conv history, and the delayed value of each chunk row's first token) back
// to the ranks that produced them, and this rank's tails' gradients added into dqkv.
void CudaModel::Impl::cp_return_halo_grads(const float* dhist) {
  const int64_t Br = 2 * cpB, T = Ph * C + VH, row = cpB * T;
  float* dhalos = grow<float>(g_dhalos, size_t(Br * T));
  float* dtails = grow<float>(g_dtails, size_t(Br * T));
  Scope s(this, kOther);
  if (cp_send_halo_grads)
    cp_pack_halo_grads(dhalos, dhist, dv, Br, Lc, Ph, C, KD, st);
  else  // a detached halo (tests): nothing goes back
    ZAYA_CUDA_CHECK(cudaMemsetAsync(dhalos, 0, size_t(Br * T) * 4, st));
  cp_comm(dhalos, size_t(Br * T) * 4, dtails, size_t(Br * T) * 4, true,
          [&](const void* a, void* b) {
            context_return_halos(*cp, static_cast<const float*>(a), static_cast<float*>(b),
                                 size_t(row));
          });
  if (cpR == cpC - 1)
    ZAYA_CUDA_CHECK(
        cudaMemcpyAsync(dtails, dhalos + row, size_t(row) * 4, cudaMemcpyDeviceToDevice, st));
  cp_add_tail_grads(dqkv, LD, dtails, Br, Lc, Ph, C, VH, st);
}

// ---- CudaModel ----------------------------------------------------------------------------------

CudaModel::CudaModel(const ZayaModel& m, const CudaModelOptions& opt)
    : impl_(std::make_unique<Impl>(m, opt)) {
  upload(m);
}

CudaModel::~CudaModel() = default;

const ZayaConfig& CudaModel::cfg() const {
  return impl_->cfg;
}
std::vector<DeviceParam>& CudaModel::params() {
  return impl_->params;
}
float* CudaModel::master_base() const {
  return impl_->master_buf;
}
float* CudaModel::grad_base() const {
  return impl_->grad_buf;
}
int64_t CudaModel::flat_elems() const {
  return int64_t(impl_->master_elems);
}
cudaStream_t CudaModel::stream() const {
  return impl_->st;
}
GemmContext& CudaModel::gemm() {
  return *impl_->gemm;
}
const OpClassTimes& CudaModel::last_profile() const {
  return impl_->times;
}
size_t CudaModel::arena_bytes() const {
  return impl_->arena_size;
}

void CudaModel::download(ZayaModel& m) const {
  Impl& im = *impl_;
  ZAYA_CHECK(int64_t(m.layers.size()) == im.L,
             "CudaModel::download: the host model holds {} layers, the device model {}",
             m.layers.size(), im.L);
  const auto named = m.named_tensors();
  auto slots = tensor_slots(m);
  ZAYA_CHECK(named.size() == im.params.size() && slots.size() == named.size(),
             "CudaModel::download: the host model has {} tensors, the device model {}",
             named.size(), im.params.size());
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  for (size_t i = 0; i < named.size(); i++) {
    const DeviceParam& p = im.params[i];
    ZAYA_CHECK(named[i].first == p.name && named[i].second.shape() == p.shape,
               "CudaModel::download: host tensor {} is '{}' {}, the device has '{}' {}", i,
               named[i].first, shape_str(named[i].second.shape()), p.name, shape_str(p.shape));
    ZAYA_ASSERT(slots[i]->raw() == named[i].second.raw());
    Tensor& t = *slots[i];
    // Memory-mapped or narrower tensors are replaced by fresh fp32 ones.
    if (t.dtype() != DType::F32 || !t.is_contiguous() || t.read_only())
      t = Tensor::empty(p.shape, DType::F32);
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(t.f32(), p.master, size_t(p.numel) * sizeof(float),
                                    cudaMemcpyDeviceToHost, im.st));
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
}

void CudaModel::upload(const ZayaModel& m) {
  Impl& im = *impl_;
  const auto named = m.named_tensors();
  ZAYA_CHECK(named.size() == im.params.size(),
             "CudaModel::upload: the host model has {} tensors, the device model {}", named.size(),
             im.params.size());
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  for (size_t i = 0; i < named.size(); i++) {
    const auto& [name, t] = named[i];
    const DeviceParam& p = im.params[i];
    ZAYA_CHECK(name == p.name && t.shape() == p.shape,
               "CudaModel::upload: host tensor {} is '{}' {}, the device has '{}' {}", i, name,
               shape_str(t.shape()), p.name, shape_str(p.shape));
    ZAYA_CHECK(dtype_is_float(t.dtype()), "CudaModel::upload: tensor '{}' has dtype {}", name,
               dtype_name(t.dtype()));
    const Tensor f = t.dtype() == DType::F32 && t.is_contiguous() ? t : t.to(DType::F32);
    // On the model's stream, so refresh_copies below is ordered after it. A converted temporary
    // must outlive its copy: wait for it before it goes (keeping them all would double the host
    // memory of a bf16 checkpoint).
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(p.master, f.f32(), size_t(p.numel) * sizeof(float),
                                    cudaMemcpyHostToDevice, im.st));
    if (f.raw() != t.raw()) ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  }
  refresh_copies();
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
}

void CudaModel::refresh_copies() {
  Impl& im = *impl_;
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  for (const DeviceParam& p : im.params)
    if (p.copy) f32_to_bf16(p.copy, p.master, p.numel, im.st);
}

void CudaModel::refresh_copies(int64_t layer, const std::vector<bool>* current) {
  Impl& im = *impl_;
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  ZAYA_CHECK(!current || current->size() == im.params.size(),
             "CudaModel::refresh_copies: a mask of {} tensors for {}",
             current ? current->size() : 0, im.params.size());
  for (size_t i = 0; i < im.params.size(); i++) {
    const DeviceParam& p = im.params[i];
    if (p.copy && layer_of_param(p.name) == layer && !(current && (*current)[i]))
      f32_to_bf16(p.copy, p.master, p.numel, im.st);
  }
}

void CudaModel::zero_grads() {
  Impl& im = *impl_;
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(im.grad_buf, 0, std::max<size_t>(im.master_elems, 1) * 4, im.st));
}

StepStats CudaModel::forward_backward(const int32_t* ids, const int32_t* targets, int64_t B,
                                      int64_t S, float loss_scale, const LayerGradsReady* ready,
                                      const ContextParallel* cp, const LayerWeightsNeeded* needed) {
  Impl& im = *impl_;
  const Impl::CpScope end_step{im};
  ZAYA_CHECK(B > 0 && S > 0, "CudaModel::forward_backward: batch {} x sequence {} is empty", B, S);
  // The mean is over the scored tokens of the whole rows (with context parallelism, of the group:
  // each rank's loss is its share, and its gradients its part of the sum).
  const int64_t count = im.check_tokens(ids, targets, B * S);
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  const Impl::Rows rows = im.stage_rows(ids, targets, B, S, cp, "forward_backward");
  const int64_t Br = rows.B, Sr = rows.S, N = Br * Sr, mine = rows.scored;
  im.prof_begin_step();
  im.forward(Br, Sr, needed);
  // Every gradient is linear in dlogits, so the loss scale and the 1/count of the mean enter once.
  im.head_loss(N, true, loss_scale / float(std::max<int64_t>(count, 1)));
  const auto in_backward = ft::section(ft::kBackward);  // the host waits for the GPU in it
  im.backward(Br, Sr, ready);
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(im.h_loss, im.d_loss_sum, sizeof(double), cudaMemcpyDeviceToHost, im.st));
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(im.h_count, im.d_count, sizeof(int32_t), cudaMemcpyDeviceToHost, im.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  im.prof_collect();
  StepStats stats;
  stats.tokens = *im.h_count;
  ZAYA_ASSERT(stats.tokens == mine);
  stats.loss = count > 0 ? *im.h_loss / double(count) : 0.0;
  for (int64_t li = 0; li < im.L; li++)
    stats.routed.emplace_back(im.h_counts + li * im.E1, im.h_counts + (li + 1) * im.E1);
  return stats;
}

Tensor CudaModel::forward_logits(const std::vector<int32_t>& ids, int64_t B, int64_t S) {
  Impl& im = *impl_;
  ZAYA_CHECK(int64_t(ids.size()) == B * S, "CudaModel::forward_logits: {} ids for batch {} x {}",
             ids.size(), B, S);
  im.check_batch(B, S, "forward_logits");
  const int64_t N = B * S;
  ZAYA_CHECK(N <= im.chunk_tokens,
             "CudaModel::forward_logits: {} positions x vocabulary {} exceed the logits buffer "
             "({} positions); use it for small models and batches only",
             N, im.V, im.chunk_tokens);
  im.check_tokens(ids.data(), nullptr, N);
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  im.prof_begin_step();
  im.stage_ids(ids.data(), nullptr, N);
  im.forward(B, S);
  im.linear(im.logits, GemmType::F32, im.hn, im.D, im.embed->copy, N, im.D, im.V, GemmType::BF16,
            nullptr);
  Tensor out = Tensor::empty({B, S, im.V}, DType::F32);
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(out.f32(), im.logits, size_t(N * im.V) * sizeof(float),
                                  cudaMemcpyDeviceToHost, im.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  im.prof_collect();
  return out;
}

double CudaModel::loss(const std::vector<int32_t>& ids, int64_t B, int64_t S) {
  ZAYA_CHECK(int64_t(ids.size()) == B * S, "CudaModel::loss: {} ids for batch {} x {}", ids.size(),
             B, S);
  // Next-token targets, as ZayaModel::loss builds them.
  std::vector<int32_t> targets(size_t(B * S), -1);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t + 1 < S; t++) targets[size_t(b * S + t)] = ids[size_t(b * S + t + 1)];
  const auto [sum, count] = loss_sum(ids.data(), targets.data(), B, S);
  return count > 0 ? sum / double(count) : 0.0;
}

std::pair<double, int64_t> CudaModel::loss_sum(const int32_t* ids, const int32_t* targets,
                                               int64_t B, int64_t S, const ContextParallel* cp) {
  Impl& im = *impl_;
  const Impl::CpScope end_step{im};
  ZAYA_CHECK(B > 0 && S > 0, "CudaModel::loss: batch {} x sequence {} is empty", B, S);
  ZAYA_CUDA_CHECK(cudaSetDevice(im.opt.device));
  const Impl::Rows rows = im.stage_rows(ids, targets, B, S, cp, "loss");
  im.prof_begin_step();
  im.forward(rows.B, rows.S);
  im.head_loss(rows.B * rows.S, false, 0.0f);
  ZAYA_CUDA_CHECK(
      cudaMemcpyAsync(im.h_loss, im.d_loss_sum, sizeof(double), cudaMemcpyDeviceToHost, im.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(im.st));
  im.prof_collect();
  return {*im.h_loss, rows.scored};
}

}  // namespace zaya::cuda
