// The measurement half of `zaya bench kernels` (kernel_bench.h): the model's own non-GEMM kernels
// from backend/cuda/ops.h, launched exactly as CudaModel launches them for one layer of one
// micro-batch (B x S tokens), each timed with gemm_bench.h's TimingPolicy: warm-up launches, an
// estimate of one launch's GPU time (3 launches behind a spin kernel), time-based warm-up, then
// the timed launches enqueued behind a spin kernel that holds the stream, one CUDA event between
// consecutive launches, median (launch_timing_cuda.h). Backward kernels read saved tensors produced
// by running their forward once (attention's lse, CCA's conv/mid/norms, the norms' rstd). Parameter
// gradients that the kernels accumulate (+=) keep growing over the repetitions; the values never
// reach overflow at these repetition counts and the kernels' speed does not depend on them.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/ops.h"
#include "bench/bench_common.h"
#include "bench/bench_kernels.h"
#include "bench/kernel_bench.h"
#include "bench/launch_timing_cuda.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "sizing/model_shape.h"

namespace zaya::bench {

namespace {

namespace zc = zaya::cuda;
using sizing::KernelClass;
using zc::bf16;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// The TimingPolicy protocol (launch_timing_cuda.h) on one stream, for one launch (or a fixed group
// of launches) at a time.
struct Timer : TimedStream {
  TimingPolicy p;
  int64_t l2_bytes = 0;
  Timer(const TimingPolicy& policy, int64_t l2) : p(policy), l2_bytes(l2) {}
  std::pair<double, int> time(const std::function<void()>& launch) {
    const Timed r = time_policy(*this, p, 1, [&](int) { launch(); });
    ZAYA_CUDA_CHECK(cudaGetLastError());  // a launch error of the timed kernel
    return {r.us, r.iters};
  }
};

// Uniform values in [-1, 1): bf16 directly, fp32 through a bf16 scratch in chunks.
void fill_bf16(bf16* p, int64_t n, uint64_t seed, cudaStream_t st) {
  kernels::fill_random_bf16(p, uint64_t(n), seed, st);
}
void fill_f32(float* p, int64_t n, uint64_t seed, cudaStream_t st) {
  const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 24);
  Buf tmp(size_t(chunk) * sizeof(bf16));
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    fill_bf16(tmp.as<bf16>(), m, seed + uint64_t(i), st);
    zc::bf16_to_f32(p + i, tmp.as<bf16>(), m, st);
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));  // tmp is freed on return
}
void upload(void* dst, const void* src, size_t bytes, cudaStream_t st) {
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
}

struct Bench {
  const KernelBenchOptions& o;
  Timer& tm;
  std::vector<KernelTiming> rows;

  void add(const std::string& name, KernelClass cls, const std::string& shape, double flops,
           double bytes, double per_instance, const std::function<void()>& launch,
           int64_t window = 0) {
    KernelTiming r;
    r.name = name;
    r.cls = cls;
    r.shape = shape;
    r.window = window;
    r.flops = flops;
    r.bytes = bytes;
    r.per_instance = per_instance;
    std::tie(r.us, r.iters) = tm.time(launch);
    r.below_l2 = flops == 0 && bytes < 3.0 * double(tm.l2_bytes);
    fmt::print(stderr, "# {:<30} {:10.4f} ms\n", name, r.us * 1e-3);
    rows.push_back(r);
  }
};

void bench_attention(Bench& b, int64_t window) {
  const ZayaConfig& c = b.o.cfg;
  const int64_t B = b.o.batch, S = b.o.seq, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads,
                d = c.head_dim, N = B * S;
  cudaStream_t st = b.tm.st;
  Buf q(size_t(N * Hq * d) * 2), k(size_t(N * Hkv * d) * 2), v(size_t(N * Hkv * d) * 2),
      o(size_t(N * Hq * d) * 2), lse(size_t(B * Hq * S) * 4), dout(size_t(N * Hq * d) * 2),
      dq(size_t(N * Hq * d) * 2), dk(size_t(N * Hkv * d) * 2), dv(size_t(N * Hkv * d) * 2);
  fill_bf16(q.as<bf16>(), N * Hq * d, 11, st);
  fill_bf16(k.as<bf16>(), N * Hkv * d, 12, st);
  fill_bf16(v.as<bf16>(), N * Hkv * d, 13, st);
  fill_bf16(dout.as<bf16>(), N * Hq * d, 14, st);
  const size_t wsb = zc::attention_bwd_workspace_bytes(B, S, Hq, Hkv, d);
  Buf wsbuf(wsb);
  zc::Workspace ws{wsbuf.as<char>(), std::max<size_t>(wsb, 256), 0};
  // The cost model's count: 4·T·keys·Hq·d forward, 2.5x that backward.
  const double fwd = 4.0 * double(N) * sizing::mean_keys(S, window) * double(Hq * d);
  const std::string shape =
      fmt::format("B{} S{} Hq{} Hkv{} d{} {}", B, S, Hq, Hkv, d,
                  window > 0 ? fmt::format("window {}", window) : std::string("causal"));
  auto f = [&] {
    zc::attention_fwd(o.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), B, S,
                      S, 0, Hq, Hkv, d, window, st);
  };
  const double io = 2.0 * double(N) * double(2 * Hq * d + 2 * Hkv * d);
  b.add("attention_fwd", KernelClass::AttentionFwd, shape, fwd, io, 1, f, window);
  f();  // o and lse for the backward
  b.add(
      "attention_bwd", KernelClass::AttentionBwd, shape, sizing::kAttentionBwdFlopFactor * fwd,
      2 * io, 1,
      [&] {
        ws.reset();
        zc::attention_bwd(dq.as<bf16>(), dk.as<bf16>(), dv.as<bf16>(), dout.as<bf16>(),
                          o.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(),
                          B, S, Hq, Hkv, d, window, ws, st);
      },
      window);
}

void bench_cca(Bench& b) {
  const ZayaConfig& c = b.o.cfg;
  const int64_t B = b.o.batch, S = b.o.seq, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads,
                d = c.head_dim, N = B * S, C = (Hq + Hkv) * d, LD = C + Hkv * d, t0 = c.cca_time0,
                t1 = c.cca_time1;
  const RopeSettings& rope = c.rope_for_layer(0);
  const int64_t rdim = int64_t(double(d) * rope.partial_rotary_factor);
  cudaStream_t st = b.tm.st;
  Buf qkv(size_t(N * LD) * 2), conv(size_t(N * C) * 4), mid(size_t(B * (S + t1 - 1) * C) * 4),
      wdw(size_t(C * t0) * 4), bdw(size_t(C) * 4), wg(size_t(C * d * t1) * 4), bg(size_t(C) * 4),
      temp(size_t(Hkv) * 4), q(size_t(N * Hq * d) * 2), k(size_t(N * Hkv * d) * 2),
      v(size_t(N * Hkv * d) * 2), norms(size_t(N * (Hq + Hkv)) * 4), dq(size_t(N * Hq * d) * 2),
      dk(size_t(N * Hkv * d) * 2), dv(size_t(N * Hkv * d) * 2), dconv(size_t(N * C) * 4),
      dqkv(size_t(N * LD) * 2), dwdw(size_t(C * t0) * 4), dbdw(size_t(C) * 4),
      dwg(size_t(C * d * t1) * 4), dbg(size_t(C) * 4), dtemp(size_t(Hkv) * 4);
  fill_bf16(qkv.as<bf16>(), N * LD, 21, st);
  fill_f32(wdw.as<float>(), C * t0, 22, st);
  fill_f32(bdw.as<float>(), C, 23, st);
  fill_f32(wg.as<float>(), C * d * t1, 24, st);
  fill_f32(bg.as<float>(), C, 25, st);
  const std::vector<float> ones(size_t(Hkv), 1.0f);
  upload(temp.p, ones.data(), ones.size() * 4, st);
  fill_bf16(dq.as<bf16>(), N * Hq * d, 26, st);
  fill_bf16(dk.as<bf16>(), N * Hkv * d, 27, st);
  fill_bf16(dv.as<bf16>(), N * Hkv * d, 28, st);
  for (auto [g, bytes] : {std::pair{&dwdw, C * t0 * 4},
                          {&dbdw, C * 4},
                          {&dwg, C * d * t1 * 4},
                          {&dbg, C * 4},
                          {&dtemp, Hkv * 4}})
    ZAYA_CUDA_CHECK(cudaMemsetAsync(g->p, 0, size_t(bytes), st));
  const size_t wsb = std::max(zc::cca_qkv_finish_bwd_workspace_bytes(N, Hq, Hkv),
                              zc::cca_conv_bwd_workspace_bytes(B, S, C, d, t0, t1));
  Buf wsbuf(wsb);
  zc::Workspace ws{wsbuf.as<char>(), std::max<size_t>(wsb, 256), 0};
  const std::string shape = fmt::format("T{} C{} d{} t{},{}", N, C, d, t0, t1);
  const double n = double(N), Cd = double(C), hv = double(Hkv * d), ld = double(LD);
  auto conv_fwd = [&] {
    zc::cca_conv_fwd(conv.as<float>(), mid.as<float>(), qkv.as<bf16>(), LD, nullptr, false,
                     wdw.as<float>(), bdw.as<float>(), wg.as<float>(), bg.as<float>(), B, S, C, d,
                     t0, t1, st);
  };
  auto finish_fwd = [&] {
    zc::cca_qkv_finish_fwd(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), norms.as<float>(),
                           conv.as<float>(), qkv.as<bf16>(), LD, temp.as<float>(), nullptr, false,
                           0, rope.theta, rdim, B, S, Hq, Hkv, d, st);
  };
  // Own traffic: the projection's C channels in (bf16), conv out and mid (fp32).
  b.add("cca_conv_fwd", KernelClass::Cca, shape, 0, n * 10 * Cd, 1, conv_fwd);
  conv_fwd();
  // conv in (fp32), the projection row (bf16), q, k, v out (bf16).
  b.add("cca_qkv_finish_fwd", KernelClass::Cca, shape, 0, n * (4 * Cd + 2 * ld + 2 * Cd + 2 * hv),
        1, finish_fwd);
  finish_fwd();
  // dq, dk, dv, conv, q0/k0, dconv out, dqkv row out.
  b.add("cca_qkv_finish_bwd", KernelClass::Cca, shape, 0,
        n * (2 * Cd + 2 * hv + 4 * Cd + 2 * Cd + 4 * Cd + 2 * ld), 1, [&] {
          ws.reset();
          zc::cca_qkv_finish_bwd(dconv.as<float>(), dqkv.as<bf16>(), LD, dtemp.as<float>(),
                                 dq.as<bf16>(), dk.as<bf16>(), dv.as<bf16>(), conv.as<float>(),
                                 qkv.as<bf16>(), norms.as<float>(), temp.as<float>(), rope.theta,
                                 rdim, B, S, Hq, Hkv, d, ws, st);
        });
  // dqkv's C channels read and written, dy, the projection's C channels, mid.
  b.add("cca_conv_bwd", KernelClass::Cca, shape, 0, n * 14 * Cd, 1, [&] {
    ws.reset();
    zc::cca_conv_bwd(dqkv.as<bf16>(), LD, dwdw.as<float>(), dbdw.as<float>(), dwg.as<float>(),
                     dbg.as<float>(), dconv.as<float>(), qkv.as<bf16>(), mid.as<float>(),
                     wdw.as<float>(), wg.as<float>(), B, S, C, d, t0, t1, ws, st);
  });
}

void bench_norms(Bench& b) {
  const ZayaConfig& c = b.o.cfg;
  const int64_t N = b.o.batch * b.o.seq, D = c.hidden_size;
  cudaStream_t st = b.tm.st;
  const size_t nd = size_t(N * D);
  Buf a(nd * 2), h(nd * 4), hout(nd * 4), y(nd * 2), rstd(size_t(N) * 4), hs(size_t(D) * 4),
      hb(size_t(D) * 4), rs(size_t(D) * 4), rb(size_t(D) * 4), w(size_t(D) * 4), dout(nd * 4),
      da(nd * 2), dh(nd * 4), dx(nd * 4), dvec(size_t(5 * D) * 4);
  fill_bf16(a.as<bf16>(), N * D, 31, st);
  fill_f32(h.as<float>(), N * D, 32, st);
  for (auto [buf, seed] : {std::pair{&hs, 33}, {&hb, 34}, {&rs, 35}, {&rb, 36}, {&w, 37}})
    fill_f32(buf->as<float>(), D, uint64_t(seed), st);
  fill_f32(dout.as<float>(), N * D, 38, st);
  ZAYA_CUDA_CHECK(cudaMemsetAsync(dx.p, 0, nd * 4, st));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(dvec.p, 0, size_t(5 * D) * 4, st));
  float* dv = dvec.as<float>();
  const size_t wsb =
      std::max(zc::residual_scale_bwd_workspace_bytes(N, D), zc::rmsnorm_bwd_workspace_bytes(N, D));
  Buf wsbuf(wsb);
  zc::Workspace ws{wsbuf.as<char>(), std::max<size_t>(wsb, 256), 0};
  const float eps = float(c.rms_norm_eps);
  const std::string shape = fmt::format("T{} D{}", N, D);
  const double n = double(N), Dd = double(D);
  auto fwd = [&] {
    zc::residual_scale_rmsnorm_fwd(hout.as<float>(), y.as<bf16>(), rstd.as<float>(), a.as<bf16>(),
                                   h.as<float>(), hs.as<float>(), hb.as<float>(), rs.as<float>(),
                                   rb.as<float>(), w.as<float>(), eps, N, D, st);
  };
  // Each layer runs two of each: after attention and after the MoE (CudaModel).
  b.add("residual_scale_rmsnorm_fwd", KernelClass::NormResidual, shape, 0, n * 12 * Dd, 2, fwd);
  fwd();
  b.add("residual_scale_bwd", KernelClass::NormResidual, shape, 0, n * 16 * Dd, 2, [&] {
    ws.reset();
    zc::residual_scale_bwd(da.as<bf16>(), dh.as<float>(), dv, dv + D, dv + 2 * D, dv + 3 * D,
                           dout.as<float>(), a.as<bf16>(), h.as<float>(), hs.as<float>(),
                           hb.as<float>(), rs.as<float>(), rb.as<float>(), N, D, ws, st);
  });
  b.add("rmsnorm_bwd_f32", KernelClass::NormResidual, shape, 0, n * 16 * Dd, 2, [&] {
    ws.reset();
    zc::rmsnorm_bwd_f32(dx.as<float>(), dv + 4 * D, dout.as<float>(), hout.as<float>(),
                        w.as<float>(), rstd.as<float>(), true, N, D, ws, st);
  });
}

void bench_elementwise(Bench& b) {
  const ZayaConfig& c = b.o.cfg;
  const int64_t N = b.o.batch * b.o.seq, D = c.hidden_size, I = c.moe_intermediate_size,
                E = c.num_experts, M = N;
  // One routed copy per token is timed; top-k routes k copies (k launches' worth per layer).
  const double k = double(c.num_experts_per_tok);
  cudaStream_t st = b.tm.st;
  Buf gu(size_t(M * 2 * I) * 2), act(size_t(M * I) * 2), dact(size_t(M * I) * 2),
      dgu(size_t(M * 2 * I) * 2);
  fill_bf16(gu.as<bf16>(), M * 2 * I, 41, st);
  fill_bf16(dact.as<bf16>(), M * I, 42, st);
  const std::string sshape = fmt::format("M{} I{}", M, I);
  const double m = double(M), Id = double(I), Dd = double(D);
  b.add("swiglu_fwd", KernelClass::Elementwise, sshape, 0, m * 6 * Id, k,
        [&] { zc::swiglu_fwd(act.as<bf16>(), gu.as<bf16>(), M, I, st); });
  b.add("swiglu_bwd", KernelClass::Elementwise, sshape, 0, m * 10 * Id, k,
        [&] { zc::swiglu_bwd(dgu.as<bf16>(), dact.as<bf16>(), gu.as<bf16>(), M, I, st); });

  // Dispatch and combine with balanced routing: token n goes to expert n mod E; perm lists the
  // tokens expert by expert, in token order (what sort_by_expert produces).
  std::vector<int32_t> choice(static_cast<size_t>(N)), perm;
  perm.reserve(size_t(N));
  for (int64_t n = 0; n < N; ++n) choice[size_t(n)] = int32_t(n % E);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = e; n < N; n += E) perm.push_back(int32_t(n));
  Buf dchoice(size_t(N) * 4), dperm(size_t(N) * 4), gate(size_t(N) * 4), x(size_t(N * D) * 2),
      xs(size_t(M * D) * 2), ys(size_t(M * D) * 2), out(size_t(N * D) * 2), dout(size_t(N * D) * 2),
      dys(size_t(M * D) * 2), dgate(size_t(N) * 4), dx(size_t(N * D) * 4);
  upload(dchoice.p, choice.data(), choice.size() * 4, st);
  upload(dperm.p, perm.data(), perm.size() * 4, st);
  fill_f32(gate.as<float>(), N, 43, st);
  fill_bf16(x.as<bf16>(), N * D, 44, st);
  fill_bf16(ys.as<bf16>(), M * D, 45, st);
  fill_bf16(dout.as<bf16>(), N * D, 46, st);
  ZAYA_CUDA_CHECK(cudaMemsetAsync(dx.p, 0, size_t(N * D) * 4, st));
  const std::string dshape = fmt::format("T{} D{} E{}", N, D, E);
  const int32_t* pp = dperm.as<int32_t>();
  const int32_t* cp = dchoice.as<int32_t>();
  // The forward gathers, and the backward gathers again (CudaModel regathers the expert inputs).
  b.add("gather_rows", KernelClass::Elementwise, dshape, 0, m * 4 * Dd, 2 * k,
        [&] { zc::gather_rows(xs.as<bf16>(), x.as<bf16>(), pp, M, D, st); });
  b.add("scatter_gate_rows", KernelClass::Elementwise, dshape, 0, m * 4 * Dd, k, [&] {
    zc::scatter_gate_rows(out.as<bf16>(), ys.as<bf16>(), x.as<bf16>(), gate.as<float>(), pp, cp, E,
                          false, N, M, D, st);
  });
  b.add("scatter_gate_rows_bwd", KernelClass::Elementwise, dshape, 0, m * 6 * Dd, k, [&] {
    zc::scatter_gate_rows_bwd(dys.as<bf16>(), dgate.as<float>(), nullptr, dout.as<bf16>(),
                              ys.as<bf16>(), x.as<bf16>(), gate.as<float>(), pp, cp, E, false, N, M,
                              D, st);
  });
  b.add("scatter_add_rows", KernelClass::Elementwise, dshape, 0, m * 10 * Dd, k,
        [&] { zc::scatter_add_rows(dx.as<float>(), dys.as<bf16>(), pp, M, D, st); });
}

void bench_loss(Bench& b) {
  const ZayaConfig& c = b.o.cfg;
  const int64_t N = b.o.batch * b.o.seq, V = c.vocab_size;
  // CudaModel's chunk: as many tokens as fit 4 GiB of fp32 logits, a multiple of 128 rows.
  int64_t Nc = int64_t((size_t(4) << 30) / (size_t(V) * sizeof(float)));
  if (Nc >= 128) Nc = Nc / 128 * 128;
  Nc = std::clamp<int64_t>(Nc, 1, N);
  cudaStream_t st = b.tm.st;
  Buf logits(size_t(Nc * V) * 4), dlogits(size_t(Nc * V) * 2), tg(size_t(Nc) * 4),
      mx(size_t(Nc) * 4), se(size_t(Nc) * 4), tl(size_t(Nc) * 4), loss(size_t(Nc) * 4),
      lse(size_t(Nc) * 4);
  fill_f32(logits.as<float>(), Nc * V, 51, st);
  std::vector<int32_t> targets(static_cast<size_t>(Nc));
  std::mt19937 rng(52);
  for (auto& t : targets) t = int32_t(rng() % uint32_t(V));
  upload(tg.p, targets.data(), targets.size() * 4, st);
  const std::string shape = fmt::format("chunk {} of T{} V{}", Nc, N, V);
  const double per = double(N) / double(Nc), nv = double(Nc) * double(V);
  auto stats = [&] {
    zc::ce_init(mx.as<float>(), se.as<float>(), tl.as<float>(), Nc, st);
    zc::ce_chunk_stats(mx.as<float>(), se.as<float>(), tl.as<float>(), logits.as<float>(),
                       tg.as<int32_t>(), 0, Nc, V, st);
    zc::ce_finalize(loss.as<float>(), lse.as<float>(), mx.as<float>(), se.as<float>(),
                    tl.as<float>(), tg.as<int32_t>(), Nc, st);
  };
  b.add("ce_init+chunk_stats+finalize", KernelClass::Loss, shape, 0, nv * 4, per, stats);
  stats();
  b.add("ce_chunk_grad", KernelClass::Loss, shape, 0, nv * 6, per, [&] {
    zc::ce_chunk_grad(dlogits.as<bf16>(), logits.as<float>(), lse.as<float>(), tg.as<int32_t>(),
                      1.0f / float(N), 0, Nc, V, st);
  });
}

void bench_optimizer(Bench& b) {
  const int64_t n = b.o.optimizer_elems;
  cudaStream_t st = b.tm.st;
  Buf p(size_t(n) * 4), pb(size_t(n) * 2), m(size_t(n) * 4), v(size_t(n) * 4), g(size_t(n) * 4),
      out(sizeof(double));
  fill_f32(p.as<float>(), n, 61, st);
  fill_f32(g.as<float>(), n, 62, st);
  ZAYA_CUDA_CHECK(cudaMemsetAsync(m.p, 0, size_t(n) * 4, st));
  ZAYA_CUDA_CHECK(cudaMemsetAsync(v.p, 0, size_t(n) * 4, st));
  const size_t wsb = zc::sumsq_workspace_bytes(n);
  Buf wsbuf(wsb);
  zc::Workspace ws{wsbuf.as<char>(), std::max<size_t>(wsb, 256), 0};
  const std::string shape = fmt::format("n{}", n);
  const double nd = double(n);
  b.add("sumsq (gradient norm)", KernelClass::Optimizer, shape, 0, nd * 4, 1, [&] {
    ws.reset();
    zc::sumsq(out.as<double>(), g.as<float>(), n, ws, st);
  });
  // p, m, v, g read; p, m, v written; the bf16 copy written.
  b.add("adamw_step", KernelClass::Optimizer, shape, 0, nd * 30, 1, [&] {
    zc::adamw_step(p.as<float>(), pb.as<bf16>(), m.as<float>(), v.as<float>(), g.as<float>(), 1.0f,
                   1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, n, st);
  });
}

}  // namespace

std::vector<KernelTiming> run_kernel_bench(const KernelBenchOptions& opt, const DeviceInfo& dev) {
  const ZayaConfig& c = opt.cfg;
  ZAYA_CHECK(c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128,
             "zaya bench kernels: head_dim {} is not supported by the attention kernels (32, 64 "
             "or 128)",
             c.head_dim);
  ZAYA_CHECK(opt.batch > 0 && opt.seq > 1,
             "zaya bench kernels: --batch must be positive and --seq "
             "above 1");
  ZAYA_CHECK(opt.optimizer_elems > 0, "zaya bench kernels: --optimizer-elems must be positive");
  ZAYA_CUDA_CHECK(cudaSetDevice(opt.device));
  Timer tm(opt.timing, dev.l2_bytes);
  Bench b{opt, tm, {}};
  // One attention row per distinct window among the layers (sliding layers attend less).
  std::vector<int64_t> windows;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t w = c.layer_is_sliding(l) ? c.sliding_window : 0;
    if (std::find(windows.begin(), windows.end(), w) == windows.end()) windows.push_back(w);
  }
  for (int64_t w : windows) bench_attention(b, w);
  bench_cca(b);
  bench_norms(b);
  bench_elementwise(b);
  bench_loss(b);
  bench_optimizer(b);
  ZAYA_CUDA_CHECK(cudaDeviceSynchronize());
  return b.rows;
}

}  // namespace zaya::bench
