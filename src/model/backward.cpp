// Training forward + backward of ZAYA1 on the CPU reference ops. See backward.h.
//
// The forward repeats ZayaModel::forward (zaya.cpp) op for op, without a cache, so its loss is the
// same number ZayaModel::loss computes; it keeps per layer what the backward needs (pre-norm
// inputs and their rstd, the conv input and depthwise output, pre-norm q/k and their norms, the
// post-RoPE q/k/v with the attention output and log-sum-exp, the router's pre-activations, the
// routing decisions and each expert's gate|up rows). The backward then walks the graph in reverse.
// Every reduction is either inside a deterministic op or a serial loop here, so gradients do not
// depend on the thread count.
#include "model/backward.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/parallel.h"
#include "dist/comm.h"
#include "dist/heartbeat.h"

namespace zaya {

void ModelGrads::zero() {
  for (auto& [name, t] : tensors) t.fill(0.0f);
}

Tensor& ModelGrads::get(const std::string& name) {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  fail("ModelGrads: no gradient named '{}'", name);
}

ModelGrads make_grads(const ZayaModel& m) {
  ModelGrads g;
  for (auto& [name, t] : m.named_tensors())
    g.tensors.emplace_back(name, Tensor::zeros(t.shape(), DType::F32));
  return g;
}

namespace {

// Scratch buffers are recycled through a per-thread free list: a training step needs the same
// buffers on every call, and fresh allocations would be zero-filled and page-faulted each time
// (a fifth of a tiny-preset step). The list keeps at most as many buffers as a step holds at
// once, each no larger than the largest request it served.
class BufferPool {
 public:
  std::vector<float> take(size_t n) {
    size_t best = free_.size(), largest = free_.size();
    for (size_t i = 0; i < free_.size(); i++) {
      const size_t sz = free_[i].size();
      if (sz >= n && (best == free_.size() || sz < free_[best].size())) best = i;
      if (largest == free_.size() || sz > free_[largest].size()) largest = i;
    }
    const size_t pick = best < free_.size() ? best : largest;
    if (pick == free_.size()) return std::vector<float>(n);
    std::vector<float> v = std::move(free_[pick]);
    free_[pick] = std::move(free_.back());
    free_.pop_back();
    if (v.size() < n) v.resize(n);
    return v;
  }
  void give(std::vector<float>&& v) { free_.push_back(std::move(v)); }

 private:
  std::vector<std::vector<float>> free_;
};

BufferPool& buffer_pool() {
  thread_local BufferPool pool;
  return pool;
}

// A float buffer of n elements from the pool. Contents are unspecified until written (every user
// either overwrites it fully or calls zero()).
class Vec {
 public:
  Vec() = default;
  explicit Vec(int64_t n) : buf_(buffer_pool().take(size_t(n))), n_(size_t(n)) {}
  Vec(Vec&& o) noexcept : buf_(std::move(o.buf_)), n_(o.n_) { o.n_ = 0; }
  Vec& operator=(Vec&& o) noexcept {
    if (this != &o) {
      release();
      buf_ = std::move(o.buf_);
      n_ = o.n_;
      o.n_ = 0;
    }
    return *this;
  }
  Vec(const Vec&) = delete;
  Vec& operator=(const Vec&) = delete;
  ~Vec() { release(); }

  float* data() { return buf_.data(); }
  const float* data() const { return buf_.data(); }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return buf_[i]; }
  const float& operator[](size_t i) const { return buf_[i]; }
  float* begin() { return buf_.data(); }
  float* end() { return buf_.data() + n_; }
  void zero() { std::fill_n(buf_.data(), n_, 0.0f); }
  void swap(Vec& o) {
    buf_.swap(o.buf_);
    std::swap(n_, o.n_);
  }

 private:
  void release() {
    if (!buf_.empty()) buffer_pool().give(std::move(buf_));
    buf_ = std::vector<float>();
    n_ = 0;
  }
  std::vector<float> buf_;
  size_t n_ = 0;
};

Vec vec(int64_t n) {
  return Vec(n);
}

// Gradient buffers of one layer, resolved once per call.
struct LayerGradPtrs {
  float *ln_in, *ln_post, *wq, *wk, *wv_cur, *wv_del, *wo;
  float *conv_dw_w, *conv_dw_b, *conv_g_w, *conv_g_b, *temp;
  float *pa_hs, *pa_hb, *pa_rs, *pa_rb, *pm_hs, *pm_hb, *pm_rs, *pm_rb;
  float *r_down_w, *r_down_b, *r_states_scale, *r_norm;
  float *r_fc1_w, *r_fc1_b, *r_fc2_w, *r_fc2_b, *r_out_w;
  float *experts_gate_up, *experts_down;
};

// What the backward of one layer needs from its forward.
struct LayerActs {
  Vec hin, xin, rstd_in;         // layer input h, rmsnorm(h), its rstd
  Vec qk0, mid;                  // conv input [q0 | k0] and depthwise output
  Vec qpre, kpre, qnorm, knorm;  // q/k before QK-norm and their clamped norms
  Vec q, k, v, att, lse, a;      // attention operands, output, lse; o_proj output
  Vec halo;                      // context parallelism: the chunks' halos [2][B][P·C+VH]
  Vec kfull, vfull;              // and the group's keys/values [B,S,Hkv,d]
  Vec hmid, xpost, rstd_post;    // h after attention, rmsnorm(h), its rstd
  Vec r, rn, rstd_r, h1pre, h1, h2pre, h2;  // router state and MLP
  Vec probs, gate;
  std::vector<int32_t> choice;
  std::vector<std::vector<int64_t>> rows;  // tokens per class
  std::vector<Vec> gu, act;                // per expert: gate|up rows and SwiGLU output
  Vec yu, m;                               // unscaled block output per token, and p[e]·yu
};

class Trainer {
 public:
  Trainer(const ZayaModel& m, ModelGrads& grads, int64_t B, int64_t S, const ContextParallel* cp)
      : m_(m), c_(m.cfg), B_(B), S_(S), N_(B * S), cp_(cp) {
    D_ = c_.hidden_size;
    d_ = c_.head_dim;
    Hq_ = c_.num_attention_heads;
    Hkv_ = c_.num_key_value_heads;
    C_ = c_.conv_channels();
    QD_ = Hq_ * d_;
    KD_ = Hkv_ * d_;
    VH_ = KD_ / 2;
    R_ = c_.router_hidden_size;
    E_ = c_.num_experts;
    I_ = c_.moe_intermediate_size;
    V_ = c_.vocab_size;
    t0_ = c_.cca_time0;
    t1_ = c_.cca_time1;
    eps_ = float(c_.rms_norm_eps);
    resolve_grads(grads);
    P_ = (t0_ - 1) + (t1_ - 1);
    Bv_ = B_;
    Sv_ = S_;
    if (cp_) {
      // This rank's two chunks of every row, slot-major: local token n is slot n / (B·L), row
      // (n / L) % B, offset n % L — to the convolutions and the value shift, 2B sequences of L.
      const int64_t C = cp_->comm->size(), r = cp_->comm->rank();
      L_ = S_ / (2 * C);
      const std::array<int64_t, 2> g = context_chunks(int(r), int(C));
      gc_[0] = g[0];
      gc_[1] = g[1];
      Bv_ = 2 * B_;
      Sv_ = L_;
      N_ = 2 * B_ * L_;
    }
    pos_.resize(size_t(N_));
    for (int64_t n = 0; n < N_; n++)
      pos_[size_t(n)] = cp_ ? gc_[n / (B_ * L_)] * L_ + n % L_ : n % S_;
  }

  StepStats run(const int32_t* ids, const int32_t* targets, float loss_scale,
                const LayerGradsReady* ready);
  int64_t local_tokens() const { return N_; }

 private:
  void resolve_grads(ModelGrads& grads);
  float* g(const Tensor& t) const {
    auto it = gmap_.find(t.raw());
    ZAYA_ASSERT(it != gmap_.end());
    return it->second;
  }
  void attention_fwd(int64_t li, LayerActs& A);
  void moe_fwd(int64_t li, LayerActs& A, const Vec* rprev);
  // dx (=) from da, the gradient of the o_proj output.
  void attention_bwd(int64_t li, LayerActs& A, const float* da, float* dx);
  // dx (=) from dm; dr_next holds d loss/d r of layer li+1 on entry (unused for the last layer)
  // and d loss/d r of layer li on exit.
  void moe_bwd(int64_t li, LayerActs& A, const LayerActs* prev, const float* dm, float* dx,
               Vec& dr_next);
  // Context parallelism. Halos: every local chunk's predecessor's last P pre-convolution columns
  // and last Wv_del x row, [2][B][P·C + VH]; tails are this rank's own, sent to the successors.
  void cp_send_tails(const float* tails, float* halos);
  // The reverse: the gradients of this rank's halos go back to their producers; returns in
  // dtails the gradients of this rank's tails that its successors computed.
  void cp_return_halo_grads(const float* dhalos, float* dtails);
  // Calls fn(group_token, sequence_token) for the first token of every chunk row of the group:
  // group_token indexes the group's [rank][k | v][slot][b][t] buffers (per k or v half: 2·B·L
  // tokens a rank), sequence_token the [b][S] layout of the whole sequences.
  template <typename Fn>
  void cp_chunk_rows(Fn&& fn) const {
    const int64_t C = cp_->comm->size();
    for (int64_t rk = 0; rk < C; rk++)
      for (int64_t sl = 0; sl < 2; sl++)
        for (int64_t b = 0; b < B_; b++)
          fn(rk * 2 * N_ + (sl * B_ + b) * L_, b * S_ + context_chunks(int(rk), int(C))[sl] * L_);
  }

  const ZayaModel& m_;
  const ZayaConfig& c_;
  int64_t B_, S_, N_, D_, d_, Hq_, Hkv_, C_, QD_, KD_, VH_, R_, E_, I_, V_, t0_, t1_;
  int64_t P_ = 0, Bv_ = 0, Sv_ = 0;  // conv history; sequences and length as the convs see them
  const ContextParallel* cp_;
  int64_t L_ = 0, gc_[2] = {0, 0};  // context parallelism: chunk length, global chunk of each slot
  float eps_;
  std::map<const void*, float*> gmap_;  // weight data pointer -> its gradient buffer
  std::vector<LayerGradPtrs> lg_;
  float *g_embed_, *g_in_scale_, *g_in_bias_, *g_final_;
  std::vector<int64_t> pos_;
};

void Trainer::resolve_grads(ModelGrads& grads) {
  const auto named = m_.named_tensors();
  ZAYA_CHECK(grads.tensors.size() == named.size(),
             "forward_backward: the gradients hold {} tensors, the model {} (use make_grads)",
             grads.tensors.size(), named.size());
  for (size_t i = 0; i < named.size(); i++) {
    const auto& [name, w] = named[i];
    const auto& [gname, gt] = grads.tensors[i];
    ZAYA_CHECK(w.dtype() == DType::F32,
               "forward_backward: tensor '{}' is {}; training needs fp32 master weights (convert "
               "the model to fp32 first)",
               name, dtype_name(w.dtype()));
    ZAYA_CHECK(w.is_contiguous(), "forward_backward: tensor '{}' is not contiguous", name);
    ZAYA_CHECK(gname == name && gt.shape() == w.shape() && gt.dtype() == DType::F32 &&
                   gt.is_contiguous() && !gt.read_only(),
               "forward_backward: gradient {} is '{}' {} {}, expected '{}' {} F32 (use make_grads)",
               i, gname, shape_str(gt.shape()), dtype_name(gt.dtype()), name, shape_str(w.shape()));
    gmap_[w.raw()] = gt.f32();
  }
  g_embed_ = g(m_.embed);
  g_in_scale_ = g(m_.input_scale);
  g_in_bias_ = g(m_.input_bias);
  g_final_ = g(m_.final_norm);
  for (size_t li = 0; li < m_.layers.size(); li++) {
    const LayerWeights& L = m_.layers[li];
    LayerGradPtrs p;
    p.ln_in = g(L.ln_in);
    p.ln_post = g(L.ln_post);
    p.wq = g(L.wq);
    p.wk = g(L.wk);
    p.wv_cur = g(L.wv_cur);
    p.wv_del = g(L.wv_del);
    p.wo = g(L.wo);
    p.conv_dw_w = g(L.conv_dw_w);
    p.conv_dw_b = g(L.conv_dw_b);
    p.conv_g_w = g(L.conv_g_w);
    p.conv_g_b = g(L.conv_g_b);
    p.temp = g(L.temp);
    p.pa_hs = g(L.post_attn.hs);
    p.pa_hb = g(L.post_attn.hb);
    p.pa_rs = g(L.post_attn.rs);
    p.pa_rb = g(L.post_attn.rb);
    p.pm_hs = g(L.post_mlp.hs);
    p.pm_hb = g(L.post_mlp.hb);
    p.pm_rs = g(L.post_mlp.rs);
    p.pm_rb = g(L.post_mlp.rb);
    p.r_down_w = g(L.r_down_w);
    p.r_down_b = g(L.r_down_b);
    p.r_states_scale = li > 0 ? g(L.r_states_scale) : nullptr;  // layer 0 has none
    p.r_norm = g(L.r_norm);
    p.r_fc1_w = g(L.r_fc1_w);
    p.r_fc1_b = g(L.r_fc1_b);
    p.r_fc2_w = g(L.r_fc2_w);
    p.r_fc2_b = g(L.r_fc2_b);
    p.r_out_w = g(L.r_out_w);
    p.experts_gate_up = g(L.experts_gate_up);
    p.experts_down = g(L.experts_down);
    lg_.push_back(p);
  }
}

void Trainer::attention_fwd(int64_t li, LayerActs& A) {
  const LayerWeights& L = m_.layers[size_t(li)];
  const int64_t N = N_, QD = QD_, KD = KD_, VH = VH_, C = C_;
  const float* x = A.xin.data();
  Vec q0 = vec(N * QD), k0 = vec(N * KD), mq = vec(N * QD), mk = vec(N * KD);
  cpu::linear(q0.data(), x, L.wq, nullptr, N, D_, QD);
  cpu::linear(k0.data(), x, L.wk, nullptr, N, D_, KD);
  cpu::cca_mean_skip(mq.data(), mk.data(), q0.data(), k0.data(), N, Hq_, Hkv_, d_);
  A.qk0 = vec(N * C);
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(q0.data() + n * QD, QD, A.qk0.data() + n * C);
    std::copy_n(k0.data() + n * KD, KD, A.qk0.data() + n * C + QD);
  }
  // Values: the current token's half and the previous token's half (zero at t = 0).
  Vec vc = vec(N * VH), vd = vec(N * VH);
  cpu::linear(vc.data(), x, L.wv_cur, nullptr, N, D_, VH);
  cpu::linear(vd.data(), x, L.wv_del, nullptr, N, D_, VH);
  const int64_t T = P_ * C + VH;  // one row's halo
  if (cp_) {
    Vec tails = vec(2 * B_ * T);
    for (int64_t r = 0; r < Bv_; r++) {
      const int64_t last = r * L_ + L_ - 1;  // the chunk row's last local token
      std::copy_n(A.qk0.data() + (last - P_ + 1) * C, P_ * C, tails.data() + r * T);
      std::copy_n(vd.data() + last * VH, VH, tails.data() + r * T + P_ * C);
    }
    A.halo = vec(2 * B_ * T);
    cp_send_tails(tails.data(), A.halo.data());
  }
  Vec conv = vec(N * C), hist;
  if (cp_) {
    hist = vec(Bv_ * P_ * C);
    for (int64_t r = 0; r < Bv_; r++)
      std::copy_n(A.halo.data() + r * T, P_ * C, hist.data() + r * P_ * C);
  }
  A.mid = vec(Bv_ * (Sv_ + t1_ - 1) * C);
  cpu::cca_conv(conv.data(), A.mid.data(), A.qk0.data(), cp_ ? hist.data() : nullptr,
                L.conv_dw_w.f32(), L.conv_dw_b.f32(), L.conv_g_w.f32(), L.conv_g_b.f32(), Bv_, Sv_,
                C, d_, t0_, t1_);
  A.qpre = vec(N * QD);
  A.kpre = vec(N * KD);
  for (int64_t n = 0; n < N; n++) {
    for (int64_t i = 0; i < QD; i++) A.qpre[n * QD + i] = conv[n * C + i] + mq[n * QD + i];
    for (int64_t i = 0; i < KD; i++) A.kpre[n * KD + i] = conv[n * C + QD + i] + mk[n * KD + i];
  }
  A.v = vec(N * KD);
  A.v.zero();  // v_del of the first token of each sequence
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(vc.data() + n * VH, VH, A.v.data() + n * KD);
    if (n % Sv_ > 0)
      std::copy_n(vd.data() + (n - 1) * VH, VH, A.v.data() + n * KD + VH);
    else if (cp_)  // a chunk's first token: the predecessor's last row (zeros before chunk 0)
      std::copy_n(A.halo.data() + (n / Sv_) * T + P_ * C, VH, A.v.data() + n * KD + VH);
  }
  A.q = vec(N * QD);
  A.k = vec(N * KD);
  A.qnorm = vec(N * Hq_);
  A.knorm = vec(N * Hkv_);
  cpu::qk_norm(A.q.data(), A.qnorm.data(), A.qpre.data(), nullptr, N, Hq_, d_);
  cpu::qk_norm(A.k.data(), A.knorm.data(), A.kpre.data(), L.temp.f32(), N, Hkv_, d_);
  const RopeSettings& rs = c_.rope_for_layer(li);
  const int64_t r = int64_t(double(d_) * rs.partial_rotary_factor);
  cpu::rope(A.q.data(), pos_.data(), rs.theta, N, Hq_, d_, r);
  cpu::rope(A.k.data(), pos_.data(), rs.theta, N, Hkv_, d_, r);
  const int64_t window = c_.layer_is_sliding(li) ? c_.sliding_window : 0;
  A.att = vec(N * QD);
  A.lse = vec(N * Hq_);
  if (!cp_) {
    cpu::attention(A.att.data(), A.lse.data(), A.q.data(), A.k.data(), A.v.data(), B_, S_, S_, 0,
                   Hq_, Hkv_, d_, window);
  } else {
    // Keys and values of the whole sequence from the group (all-gather), then each chunk's
    // queries at their global positions against them.
    const int64_t Ccp = cp_->comm->size(), nl = N * KD;
    Vec mine = vec(2 * nl), all = vec(Ccp * 2 * nl);
    std::copy_n(A.k.data(), nl, mine.data());
    std::copy_n(A.v.data(), nl, mine.data() + nl);
    cp_->comm->all_gather(mine.data(), all.data(), size_t(2 * nl), DType::F32);
    A.kfull = vec(B_ * S_ * KD);
    A.vfull = vec(B_ * S_ * KD);
    cp_chunk_rows([&](int64_t grp, int64_t seq) {
      std::copy_n(all.data() + grp * KD, L_ * KD, A.kfull.data() + seq * KD);
      std::copy_n(all.data() + grp * KD + nl, L_ * KD, A.vfull.data() + seq * KD);
    });
    for (int64_t sl = 0; sl < 2; sl++)
      cpu::attention(A.att.data() + sl * B_ * L_ * QD, A.lse.data() + sl * B_ * Hq_ * L_,
                     A.q.data() + sl * B_ * L_ * QD, A.kfull.data(), A.vfull.data(), B_, L_, S_,
                     gc_[sl] * L_, Hq_, Hkv_, d_, window);
  }
  A.a = vec(N * D_);
  cpu::linear(A.a.data(), A.att.data(), L.wo, nullptr, N, QD, D_);
}

void Trainer::attention_bwd(int64_t li, LayerActs& A, const float* da, float* dx) {
  const LayerWeights& L = m_.layers[size_t(li)];
  const LayerGradPtrs& G = lg_[size_t(li)];
  const int64_t N = N_, QD = QD_, KD = KD_, VH = VH_, C = C_, Gq = Hq_ / Hkv_;
  const float* x = A.xin.data();
  // o_proj
  Vec datt = vec(N * QD);
  cpu::linear_backward_weight(G.wo, nullptr, da, A.att.data(), N, QD, D_);
  cpu::linear_backward_input(datt.data(), da, L.wo, N, QD, D_, false);
  // attention, RoPE, QK-norm
  Vec dq = vec(N * QD), dk = vec(N * KD), dv = vec(N * KD);
  const int64_t window = c_.layer_is_sliding(li) ? c_.sliding_window : 0;
  if (!cp_) {
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), A.att.data(),
                            A.lse.data(), A.q.data(), A.k.data(), A.v.data(), B_, S_, Hq_, Hkv_, d_,
                            window);
  } else {
    // Each chunk's queries give gradients for every key and value of the sequence; the group sums
    // them and each rank keeps its own tokens' (reduce-scatter).
    const int64_t Ccp = cp_->comm->size(), nf = B_ * S_ * KD, nl = N * KD;
    Vec dkf = vec(nf), dvf = vec(nf), dkc = vec(nf), dvc = vec(nf);
    for (int64_t sl = 0; sl < 2; sl++) {
      cpu::attention_backward(dq.data() + sl * B_ * L_ * QD, sl ? dkc.data() : dkf.data(),
                              sl ? dvc.data() : dvf.data(), datt.data() + sl * B_ * L_ * QD,
                              A.att.data() + sl * B_ * L_ * QD, A.lse.data() + sl * B_ * Hq_ * L_,
                              A.q.data() + sl * B_ * L_ * QD, A.kfull.data(), A.vfull.data(), B_,
                              L_, S_, gc_[sl] * L_, Hq_, Hkv_, d_, window);
    }
    for (int64_t i = 0; i < nf; i++) {
      dkf[i] += dkc[i];
      dvf[i] += dvc[i];
    }
    Vec send = vec(Ccp * 2 * nl), mine = vec(2 * nl);
    cp_chunk_rows([&](int64_t grp, int64_t seq) {
      std::copy_n(dkf.data() + seq * KD, L_ * KD, send.data() + grp * KD);
      std::copy_n(dvf.data() + seq * KD, L_ * KD, send.data() + grp * KD + nl);
    });
    cp_->comm->reduce_scatter(send.data(), mine.data(), size_t(2 * nl), DType::F32, RedOp::Sum);
    std::copy_n(mine.data(), nl, dk.data());
    std::copy_n(mine.data() + nl, nl, dv.data());
    A.kfull = Vec();
    A.vfull = Vec();
  }
  const RopeSettings& rs = c_.rope_for_layer(li);
  const int64_t r = int64_t(double(d_) * rs.partial_rotary_factor);
  cpu::rope_backward(dq.data(), pos_.data(), rs.theta, N, Hq_, d_, r);
  cpu::rope_backward(dk.data(), pos_.data(), rs.theta, N, Hkv_, d_, r);
  Vec dqpre = vec(N * QD), dkpre = vec(N * KD);
  cpu::qk_norm_backward(dqpre.data(), nullptr, dq.data(), A.qpre.data(), A.qnorm.data(), nullptr, N,
                        Hq_, d_);
  cpu::qk_norm_backward(dkpre.data(), G.temp, dk.data(), A.kpre.data(), A.knorm.data(),
                        L.temp.f32(), N, Hkv_, d_);
  // q = conv_q + mq, k = conv_k + mk: the conv outputs get dqpre|dkpre as they are.
  Vec dconv = vec(N * C), dqk0 = vec(N * C);
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(dqpre.data() + n * QD, QD, dconv.data() + n * C);
    std::copy_n(dkpre.data() + n * KD, KD, dconv.data() + n * C + QD);
  }
  const int64_t T = P_ * C + VH;
  Vec hist, dhist, dtails;
  if (cp_) {
    hist = vec(Bv_ * P_ * C);
    dhist = vec(Bv_ * P_ * C);
    for (int64_t r = 0; r < Bv_; r++)
      std::copy_n(A.halo.data() + r * T, P_ * C, hist.data() + r * P_ * C);
  }
  cpu::cca_conv_backward(dqk0.data(), G.conv_dw_w, G.conv_dw_b, G.conv_g_w, G.conv_g_b,
                         dconv.data(), A.qk0.data(), A.mid.data(), L.conv_dw_w.f32(),
                         L.conv_g_w.f32(), Bv_, Sv_, C, d_, t0_, t1_, cp_ ? hist.data() : nullptr,
                         cp_ ? dhist.data() : nullptr);
  if (cp_) {
    // The halo's gradients (history columns, and the delayed value of each chunk's first token)
    // go back to the ranks that produced them; this rank's tails get its successors'.
    Vec dhalos = vec(2 * B_ * T);
    for (int64_t r = 0; r < Bv_; r++) {
      std::copy_n(dhist.data() + r * P_ * C, P_ * C, dhalos.data() + r * T);
      std::copy_n(dv.data() + (r * L_) * KD + VH, VH, dhalos.data() + r * T + P_ * C);
    }
    dtails = vec(2 * B_ * T);
    cp_return_halo_grads(dhalos.data(), dtails.data());
    for (int64_t r = 0; r < Bv_; r++) {
      const int64_t last = r * L_ + L_ - 1;
      float* dst = dqk0.data() + (last - P_ + 1) * C;
      for (int64_t i = 0; i < P_ * C; i++) dst[i] += dtails[r * T + i];
    }
    A.halo = Vec();
  }
  // Mean skip: mq[h] = (q0[h] + k0[g]) / 2 and mk[g] = mean_h∈g mq[h], so mq[h] receives
  // dqpre[h] + dkpre[g] / G, which splits in halves onto q0[h] and k0[g].
  Vec dq0 = vec(N * QD), dk0 = vec(N * KD);
  parallel_for(N, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; n++) {
      for (int64_t i = 0; i < KD; i++) dk0[n * KD + i] = dqk0[n * C + QD + i];
      for (int64_t h = 0; h < Hq_; h++) {
        const int64_t gk = h / Gq;
        for (int64_t i = 0; i < d_; i++) {
          const float t =
              0.5f * (dqpre[(n * Hq_ + h) * d_ + i] + dkpre[(n * Hkv_ + gk) * d_ + i] / float(Gq));
          dq0[n * QD + h * d_ + i] = dqk0[n * C + h * d_ + i] + t;
          dk0[n * KD + gk * d_ + i] += t;
        }
      }
    }
  });
  // Values: v_del of token t sits in token t+1's value row (same sequence).
  Vec dvc = vec(N * VH), dvd = vec(N * VH);
  dvd.zero();  // the last token's v_del feeds no value
  for (int64_t n = 0; n < N; n++) {
    std::copy_n(dv.data() + n * KD, VH, dvc.data() + n * VH);
    if (n % Sv_ + 1 < Sv_) {
      std::copy_n(dv.data() + (n + 1) * KD + VH, VH, dvd.data() + n * VH);
    } else if (cp_) {  // a chunk's last token: its successor's first value row, sent back
      const float* src = dtails.data() + (n / Sv_) * T + P_ * C;
      std::copy_n(src, VH, dvd.data() + n * VH);
    }
  }
  cpu::linear_backward_weight(G.wq, nullptr, dq0.data(), x, N, D_, QD);
  cpu::linear_backward_weight(G.wk, nullptr, dk0.data(), x, N, D_, KD);
  cpu::linear_backward_weight(G.wv_cur, nullptr, dvc.data(), x, N, D_, VH);
  cpu::linear_backward_weight(G.wv_del, nullptr, dvd.data(), x, N, D_, VH);
  cpu::linear_backward_input(dx, dq0.data(), L.wq, N, D_, QD, false);
  cpu::linear_backward_input(dx, dk0.data(), L.wk, N, D_, KD, true);
  cpu::linear_backward_input(dx, dvc.data(), L.wv_cur, N, D_, VH, true);
  cpu::linear_backward_input(dx, dvd.data(), L.wv_del, N, D_, VH, true);
}

void Trainer::moe_fwd(int64_t li, LayerActs& A, const Vec* rprev) {
  const LayerWeights& L = m_.layers[size_t(li)];
  const int64_t N = N_, D = D_, R = R_, E = E_, I = I_;
  const float* x = A.xpost.data();
  A.r = vec(N * R);
  cpu::linear(A.r.data(), x, L.r_down_w, L.r_down_b.f32(), N, D, R);
  if (rprev) {  // EDA: add the previous layer's router state (before its norm)
    const float* sc = L.r_states_scale.f32();
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < R; i++) A.r[n * R + i] += (*rprev)[n * R + i] * sc[i];
  }
  A.rn = vec(N * R);
  A.rstd_r = vec(N);
  A.h1pre = vec(N * R);
  A.h1 = vec(N * R);
  A.h2pre = vec(N * R);
  A.h2 = vec(N * R);
  Vec logits = vec(N * (E + 1));
  A.probs = vec(N * (E + 1));
  A.gate = vec(N);
  A.choice.assign(size_t(N), 0);
  cpu::rmsnorm(A.rn.data(), A.rstd_r.data(), A.r.data(), L.r_norm.f32(), eps_, N, R);
  cpu::linear(A.h1pre.data(), A.rn.data(), L.r_fc1_w, L.r_fc1_b.f32(), N, R, R);
  cpu::gelu(A.h1.data(), A.h1pre.data(), N * R);
  cpu::linear(A.h2pre.data(), A.h1.data(), L.r_fc2_w, L.r_fc2_b.f32(), N, R, R);
  cpu::gelu(A.h2.data(), A.h2pre.data(), N * R);
  cpu::linear(logits.data(), A.h2.data(), L.r_out_w, nullptr, N, R, E + 1);
  cpu::router_select(A.probs.data(), A.choice.data(), A.gate.data(), logits.data(),
                     L.balancing_bias.f32(), N, E + 1);
  A.rows.assign(size_t(E + 1), {});
  for (int64_t n = 0; n < N; n++) A.rows[size_t(A.choice[size_t(n)])].push_back(n);
  A.yu = vec(N * D);
  A.m = vec(N * D);
  A.yu.zero();  // skip tokens output zero unless scaled_input
  A.m.zero();
  A.gu.clear();
  A.gu.resize(size_t(E));
  A.act.clear();
  A.act.resize(size_t(E));
  Vec xe, ye;
  for (int64_t e = 0; e < E; e++) {
    const auto& idx = A.rows[size_t(e)];
    const int64_t ne = int64_t(idx.size());
    if (!ne) continue;
    xe = vec(ne * D);
    ye = vec(ne * D);
    A.gu[size_t(e)] = vec(ne * 2 * I);
    A.act[size_t(e)] = vec(ne * I);
    for (int64_t j = 0; j < ne; j++) std::copy_n(x + idx[size_t(j)] * D, D, xe.data() + j * D);
    cpu::linear(A.gu[size_t(e)].data(), xe.data(), L.experts_gate_up.select(0, e), nullptr, ne, D,
                2 * I);
    cpu::swiglu(A.act[size_t(e)].data(), A.gu[size_t(e)].data(), ne, I);
    cpu::linear(ye.data(), A.act[size_t(e)].data(), L.experts_down.select(0, e), nullptr, ne, I, D);
    for (int64_t j = 0; j < ne; j++) {
      const int64_t n = idx[size_t(j)];
      std::copy_n(ye.data() + j * D, D, A.yu.data() + n * D);
      for (int64_t i = 0; i < D; i++) A.m[n * D + i] = A.gate[size_t(n)] * ye[size_t(j * D + i)];
    }
  }
  if (c_.skip_output == SkipOutput::ScaledInput)
    for (int64_t n : A.rows[size_t(E)]) {
      std::copy_n(x + n * D, D, A.yu.data() + n * D);
      for (int64_t i = 0; i < D; i++) A.m[n * D + i] = A.gate[size_t(n)] * x[n * D + i];
    }
}

void Trainer::moe_bwd(int64_t li, LayerActs& A, const LayerActs* prev, const float* dm, float* dx,
                      Vec& dr_next) {
  const LayerWeights& L = m_.layers[size_t(li)];
  const LayerGradPtrs& G = lg_[size_t(li)];
  const int64_t N = N_, D = D_, R = R_, E = E_, I = I_, E1 = E + 1;
  const float* x = A.xpost.data();
  // Experts: y = p[e] · W2_e swiglu(W1_e x). dgate = <dm, yu>; the experts see p[e] · dm.
  Vec dgate = vec(N);
  parallel_for(N, [&](int64_t nb, int64_t ne) {
    for (int64_t n = nb; n < ne; n++) {
      float s = 0;
      for (int64_t i = 0; i < D; i++) s += dm[n * D + i] * A.yu[size_t(n * D + i)];
      dgate[size_t(n)] = s;
    }
  });
  Vec xe, dye, dact, dgu, dxe;
  for (int64_t e = 0; e < E; e++) {
    const auto& idx = A.rows[size_t(e)];
    const int64_t ne = int64_t(idx.size());
    if (!ne) continue;
    xe = vec(ne * D);
    dye = vec(ne * D);
    dact = vec(ne * I);
    dgu = vec(ne * 2 * I);
    dxe = vec(ne * D);
    for (int64_t j = 0; j < ne; j++) {
      const int64_t n = idx[size_t(j)];
      std::copy_n(x + n * D, D, xe.data() + j * D);
      const float p = A.gate[size_t(n)];
      for (int64_t i = 0; i < D; i++) dye[size_t(j * D + i)] = p * dm[n * D + i];
    }
    const Tensor wdown = L.experts_down.select(0, e), wgu = L.experts_gate_up.select(0, e);
    cpu::linear_backward_weight(G.experts_down + e * D * I, nullptr, dye.data(),
                                A.act[size_t(e)].data(), ne, I, D);
    cpu::linear_backward_input(dact.data(), dye.data(), wdown, ne, I, D, false);
    cpu::swiglu_backward(dgu.data(), dact.data(), A.gu[size_t(e)].data(), ne, I);
    cpu::linear_backward_weight(G.experts_gate_up + e * 2 * I * D, nullptr, dgu.data(), xe.data(),
                                ne, D, 2 * I);
    cpu::linear_backward_input(dxe.data(), dgu.data(), wgu, ne, D, 2 * I, false);
    for (int64_t j = 0; j < ne; j++) std::copy_n(dxe.data() + j * D, D, dx + idx[size_t(j)] * D);
  }
  for (int64_t n : A.rows[size_t(E)]) {  // skip: y = 0, or p·x under scaled_input
    const float p = c_.skip_output == SkipOutput::ScaledInput ? A.gate[size_t(n)] : 0.0f;
    for (int64_t i = 0; i < D; i++) dx[n * D + i] = p * dm[n * D + i];
  }
  // Gate p[e] = softmax(logits)[e] with e fixed: dlogit_j = dgate · p_e (δ_je − p_j).
  Vec dlogits = vec(N * E1);
  for (int64_t n = 0; n < N; n++) {
    const int64_t e = A.choice[size_t(n)];
    const float* p = A.probs.data() + n * E1;
    const float w = dgate[size_t(n)] * p[e];
    for (int64_t j = 0; j < E1; j++) dlogits[size_t(n * E1 + j)] = w * ((j == e) - p[j]);
  }
  // Router MLP, in reverse.
  Vec da = vec(N * R), db = vec(N * R);
  cpu::linear_backward_weight(G.r_out_w, nullptr, dlogits.data(), A.h2.data(), N, R, E1);
  cpu::linear_backward_input(da.data(), dlogits.data(), L.r_out_w, N, R, E1, false);
  cpu::gelu_backward(db.data(), da.data(), A.h2pre.data(), N * R);
  cpu::linear_backward_weight(G.r_fc2_w, G.r_fc2_b, db.data(), A.h1.data(), N, R, R);
  cpu::linear_backward_input(da.data(), db.data(), L.r_fc2_w, N, R, R, false);
  cpu::gelu_backward(db.data(), da.data(), A.h1pre.data(), N * R);
  cpu::linear_backward_weight(G.r_fc1_w, G.r_fc1_b, db.data(), A.rn.data(), N, R, R);
  cpu::linear_backward_input(da.data(), db.data(), L.r_fc1_w, N, R, R, false);
  Vec dr = vec(N * R);
  cpu::rmsnorm_backward(dr.data(), G.r_norm, da.data(), A.r.data(), L.r_norm.f32(), A.rstd_r.data(),
                        N, R);
  // EDA chain: layer li+1 added sc_{li+1} ⊙ r_li to its state.
  if (li + 1 < int64_t(m_.layers.size())) {
    const float* sc = m_.layers[size_t(li + 1)].r_states_scale.f32();
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < R; i++) dr[size_t(n * R + i)] += sc[i] * dr_next[size_t(n * R + i)];
  }
  cpu::linear_backward_weight(G.r_down_w, G.r_down_b, dr.data(), x, N, D, R);
  cpu::linear_backward_input(dx, dr.data(), L.r_down_w, N, D, R, true);
  if (prev) {
    const float* rp = prev->r.data();
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < R; i++) G.r_states_scale[i] += dr[size_t(n * R + i)] * rp[n * R + i];
  }
  dr_next.swap(dr);
}

StepStats Trainer::run(const int32_t* ids, const int32_t* targets, float loss_scale,
                       const LayerGradsReady* ready) {
  const int64_t N = N_, D = D_, V = V_, nl = int64_t(m_.layers.size());
  StepStats st;
  // ---- forward ----
  Vec emb = vec(N * D), h = vec(N * D);
  cpu::embedding(emb.data(), ids, m_.embed, N, D);
  cpu::affine(h.data(), emb.data(), m_.input_scale.f32(), m_.input_bias.f32(), N, D);
  std::vector<LayerActs> acts(static_cast<size_t>(nl));
  for (int64_t li = 0; li < nl; li++) {
    const LayerWeights& L = m_.layers[size_t(li)];
    LayerActs& A = acts[size_t(li)];
    A.hin = std::move(h);
    A.xin = vec(N * D);
    A.rstd_in = vec(N);
    cpu::rmsnorm(A.xin.data(), A.rstd_in.data(), A.hin.data(), L.ln_in.f32(), eps_, N, D);
    attention_fwd(li, A);
    A.hmid = vec(N * D);
    cpu::residual_scale(A.hmid.data(), A.a.data(), A.hin.data(), L.post_attn.hs.f32(),
                        L.post_attn.hb.f32(), L.post_attn.rs.f32(), L.post_attn.rb.f32(), N, D);
    A.xpost = vec(N * D);
    A.rstd_post = vec(N);
    cpu::rmsnorm(A.xpost.data(), A.rstd_post.data(), A.hmid.data(), L.ln_post.f32(), eps_, N, D);
    moe_fwd(li, A, li > 0 ? &acts[size_t(li - 1)].r : nullptr);
    h = vec(N * D);
    cpu::residual_scale(h.data(), A.m.data(), A.hmid.data(), L.post_mlp.hs.f32(),
                        L.post_mlp.hb.f32(), L.post_mlp.rs.f32(), L.post_mlp.rb.f32(), N, D);
    std::vector<int64_t> counts(size_t(E_ + 1));
    for (int64_t e = 0; e <= E_; e++) counts[size_t(e)] = int64_t(A.rows[size_t(e)].size());
    st.routed.push_back(std::move(counts));
  }
  Vec hn = vec(N * D), rstd_f = vec(N), logits = vec(N * V);
  cpu::rmsnorm(hn.data(), rstd_f.data(), h.data(), m_.final_norm.f32(), eps_, N, D);
  cpu::linear(logits.data(), hn.data(), m_.embed, nullptr, N, D, V);
  for (int64_t n = 0; n < N; n++) st.tokens += targets[n] >= 0;
  Vec dlogits = vec(N * V);
  st.loss = cpu::cross_entropy(dlogits.data(), logits.data(), targets, N, V);
  logits = Vec();
  if (cp_) {
    // The loss is the mean over the whole sequences: this rank's share is its tokens' mean
    // weighted by their fraction of the group's scored tokens.
    double total = double(st.tokens);
    cp_->comm->host_all_reduce(&total, 1, RedOp::Sum);
    const double f = total > 0 ? double(st.tokens) / total : 0.0;
    st.loss *= f;
    loss_scale *= float(f);
  }
  // Every gradient is linear in dlogits, so scaling it here scales them all.
  if (loss_scale != 1.0f)
    for (float& v : dlogits) v *= loss_scale;
  // ---- backward ----
  const auto in_backward = ft::section(ft::kBackward);  // where the rank is, for the supervisor
  // Tied head: the embedding gets the head's gradient here and the lookup's at the end.
  Vec dh = vec(N * D), dtmp = vec(N * D), dh2 = vec(N * D), dx = vec(N * D), dy = vec(N * D);
  cpu::linear_backward_weight(g_embed_, nullptr, dlogits.data(), hn.data(), N, D, V);
  cpu::linear_backward_input(dtmp.data(), dlogits.data(), m_.embed, N, D, V, false);
  dlogits = Vec();
  cpu::rmsnorm_backward(dh.data(), g_final_, dtmp.data(), h.data(), m_.final_norm.f32(),
                        rstd_f.data(), N, D);
  Vec dr_next = vec(N * R_);
  for (int64_t li = nl - 1; li >= 0; li--) {
    const LayerWeights& L = m_.layers[size_t(li)];
    const LayerGradPtrs& G = lg_[size_t(li)];
    LayerActs& A = acts[size_t(li)];
    // post-MLP residual scale: dy = d m, dh2 = d hmid (residual path)
    cpu::residual_scale_backward(dy.data(), dh2.data(), G.pm_hs, G.pm_hb, G.pm_rs, G.pm_rb,
                                 dh.data(), A.m.data(), A.hmid.data(), L.post_mlp.hs.f32(),
                                 L.post_mlp.hb.f32(), L.post_mlp.rs.f32(), L.post_mlp.rb.f32(), N,
                                 D);
    moe_bwd(li, A, li > 0 ? &acts[size_t(li - 1)] : nullptr, dy.data(), dx.data(), dr_next);
    cpu::rmsnorm_backward(dtmp.data(), G.ln_post, dx.data(), A.hmid.data(), L.ln_post.f32(),
                          A.rstd_post.data(), N, D);
    for (int64_t i = 0; i < N * D; i++) dh2[size_t(i)] += dtmp[size_t(i)];
    // post-attention residual scale: dy = d a, dh = d hin (residual path)
    cpu::residual_scale_backward(dy.data(), dh.data(), G.pa_hs, G.pa_hb, G.pa_rs, G.pa_rb,
                                 dh2.data(), A.a.data(), A.hin.data(), L.post_attn.hs.f32(),
                                 L.post_attn.hb.f32(), L.post_attn.rs.f32(), L.post_attn.rb.f32(),
                                 N, D);
    attention_bwd(li, A, dy.data(), dx.data());
    cpu::rmsnorm_backward(dtmp.data(), G.ln_in, dx.data(), A.hin.data(), L.ln_in.f32(),
                          A.rstd_in.data(), N, D);
    for (int64_t i = 0; i < N * D; i++) dh[size_t(i)] += dtmp[size_t(i)];
    acts[size_t(li)] = LayerActs();  // layer li+1, the last reader of this layer's r, is done
    if (ready && *ready) (*ready)(li);
  }
  // Input affine h0 = (emb + b) ⊙ s, then the embedding lookup.
  const float* s = m_.input_scale.f32();
  const float* b = m_.input_bias.f32();
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < D; i++) {
      const float gval = dh[size_t(n * D + i)];
      g_in_scale_[i] += gval * (emb[size_t(n * D + i)] + b[i]);
      g_in_bias_[i] += gval * s[i];
      dtmp[size_t(n * D + i)] = gval * s[i];
    }
  cpu::embedding_backward(g_embed_, dtmp.data(), ids, N, D, V);
  if (ready && *ready) (*ready)(-1);
  return st;
}

// Rank r holds chunks r (slot 0) and 2C−1−r (slot 1). Slot 0's predecessor is chunk r−1, rank
// r−1's slot 0; slot 1's is chunk 2C−2−r, rank r+1's slot 1, or for r = C−1 its own slot 0.
void Trainer::cp_send_tails(const float* tails, float* halos) {
  const int C = cp_->comm->size(), r = cp_->comm->rank();
  const int64_t row = B_ * (P_ * C_ + VH_);
  std::fill_n(halos, 2 * row, 0.0f);  // chunk 0 has no predecessor: zero history, zero v_del
  context_pass_tails(*cp_->comm, tails, halos, size_t(row));
  if (r == C - 1) std::copy_n(tails, row, halos + row);
}

void Trainer::cp_return_halo_grads(const float* dhalos, float* dtails) {
  const int C = cp_->comm->size(), r = cp_->comm->rank();
  const int64_t row = B_ * (P_ * C_ + VH_);
  std::vector<float> sent(dhalos, dhalos + 2 * row);
  if (!cp_->send_halo_grads) std::fill(sent.begin(), sent.end(), 0.0f);  // a detached halo
  std::fill_n(dtails, 2 * row, 0.0f);  // the last chunk feeds no successor
  context_return_halos(*cp_->comm, sent.data(), dtails, size_t(row));
  if (r == C - 1) std::copy_n(sent.data() + row, row, dtails);
}

}  // namespace

std::array<int64_t, 2> context_chunks(int rank, int size) {
  return {int64_t(rank), int64_t(2 * size - 1 - rank)};
}

void check_context_split(const ZayaConfig& cfg, int64_t S, int64_t C) {
  const int64_t P = (cfg.cca_time0 - 1) + (cfg.cca_time1 - 1);
  ZAYA_CHECK(S % (2 * C) == 0,
             "context parallelism: the sequence length {} is not divisible by 2·cp = {} (each of "
             "the {} ranks holds two chunks)",
             S, 2 * C, C);
  ZAYA_CHECK(S / (2 * C) >= std::max<int64_t>(1, P),
             "context parallelism: chunks of {} tokens (sequence {} over 2·{}) are shorter than "
             "the convolutions' history of {} tokens",
             S / (2 * C), S, C, P);
}

int64_t context_global_index(int64_t n, int64_t B, int64_t S, int rank, int size) {
  const int64_t L = S / (2 * size);
  return ((n / L) % B) * S + context_chunks(rank, size)[size_t(n / (B * L))] * L + n % L;
}

void context_take_chunks(const int32_t* ids, const int32_t* targets, int64_t B, int64_t S, int rank,
                         int size, std::vector<int32_t>& lids, std::vector<int32_t>& ltargets) {
  const int64_t n = B * S / size;
  lids.resize(size_t(n));
  ltargets.resize(size_t(n));
  for (int64_t i = 0; i < n; i++) {
    const int64_t g = context_global_index(i, B, S, rank, size);
    lids[size_t(i)] = ids[g];
    ltargets[size_t(i)] = targets[g];
  }
}

namespace {
// One step of a chain exchange: sends `send` to rank `to` (skipped when < 0), receives `recv`
// from rank `from` (skipped when < 0); even ranks send first, odd ranks receive first, so a chain
// of blocking messages cannot deadlock.
void chain(Communicator& c, const float* send, int to, float* recv, int from, size_t count) {
  auto do_send = [&] {
    if (to >= 0) c.send(send, count, DType::F32, to);
  };
  auto do_recv = [&] {
    if (from >= 0) c.recv(recv, count, DType::F32, from);
  };
  if (c.rank() % 2 == 0) {
    do_send();
    do_recv();
  } else {
    do_recv();
    do_send();
  }
}
}  // namespace

void context_pass_tails(Communicator& c, const float* tails, float* halos, size_t row) {
  const int C = c.size(), r = c.rank();
  chain(c, tails, r + 1 < C ? r + 1 : -1, halos, r >= 1 ? r - 1 : -1, row);
  chain(c, tails + row, r >= 1 ? r - 1 : -1, halos + row, r + 1 < C ? r + 1 : -1, row);
}

void context_return_halos(Communicator& c, const float* dhalos, float* dtails, size_t row) {
  const int C = c.size(), r = c.rank();
  chain(c, dhalos, r >= 1 ? r - 1 : -1, dtails, r + 1 < C ? r + 1 : -1, row);
  chain(c, dhalos + row, r + 1 < C ? r + 1 : -1, dtails + row, r >= 1 ? r - 1 : -1, row);
}

StepStats forward_backward(const ZayaModel& m, const int32_t* ids, const int32_t* targets,
                           int64_t B, int64_t S, ModelGrads& grads, float loss_scale,
                           const ContextParallel* cp, const LayerGradsReady* ready) {
  ZAYA_CHECK(B > 0 && S > 0, "forward_backward: batch {} x sequence {} is empty", B, S);
  ZAYA_CHECK(int64_t(m.layers.size()) == m.cfg.num_hidden_layers,
             "forward_backward: the model holds {} layers, its config {}", m.layers.size(),
             m.cfg.num_hidden_layers);
  if (cp && !cp->comm) cp = nullptr;
  if (cp && cp->comm->size() < 2) cp = nullptr;
  if (!cp) {
    Trainer t(m, grads, B, S, nullptr);
    return t.run(ids, targets, loss_scale, ready);
  }
  check_context_split(m.cfg, S, cp->comm->size());
  Trainer t(m, grads, B, S, cp);
  std::vector<int32_t> lid, ltg;
  context_take_chunks(ids, targets, B, S, cp->comm->rank(), cp->comm->size(), lid, ltg);
  ZAYA_ASSERT(int64_t(lid.size()) == t.local_tokens());
  return t.run(lid.data(), ltg.data(), loss_scale, ready);
}

}  // namespace zaya
