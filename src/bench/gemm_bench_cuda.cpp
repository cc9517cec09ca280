// The measurement half of `zaya bench gemm` (see gemm_bench.h), on cuBLASLt.
//
// Harness: inputs filled once per shape with bf16 / fp8 e4m3 values in [-1, 1); several input and
// output sets rotated so the sets together exceed 3x L2 (a GEMM does not find its operands in L2
// left by the previous run); timing per TimingPolicy (gemm_bench.h: warm-up by GPU time, the
// stream held by a spin kernel while the timed launches are enqueued, per-launch CUDA events,
// median), the same protocol tools/bench_peer.py applies to PyTorch. A sample of output elements is
// compared with an fp64 reference computed on the CPU from the same (copied back) operands.
//
// Autotuning of the single-call rows: cuBLASLt's heuristic is asked for up to --autotune
// candidates with the same 32 MiB workspace PyTorch gives cuBLAS on Hopper; each candidate is
// launched once (one that fails to launch is dropped), the GPU is warmed with the heuristic's first
// choice (so the first candidates timed do not run at the clocks left by the host-side work between
// shapes, which used to favour whichever candidate came later), every candidate is timed over a
// few launches, and the best three and the heuristic's first choice are timed again in
// interleaved rounds; the lowest median wins, but the heuristic's first choice (the algorithm
// cuBLAS's own heuristic starts from) is kept unless another beats it by more than 1%: a tuning
// round's winner is reused by every compared round (--algos-from), and short kernels picked on a
// noise-level lead came out slower than cuBLAS's default in the same process (wave 1024^2 x 4096,
// z/cb 0.94-0.95 in docs/bench/h200-2026-12-03f and -03g).
// The first H200 run (docs/bench/h200-2026-12-02) timed only 4 candidates, 3 launches each, right
// after the host-side work of the previous shape, and fell 4-14% behind PyTorch on sub-wave shapes
// (1280..2048 x 4096), 8192^3 and lm_head dgrad, where the choice of tile and split matters most.
//
// Expert GEMMs (groups > 1, equal problems) run three ways: "lt-batched" (one strided-batched
// cuBLASLt call, exact for balanced routing), "loop" (one cuBLASLt call per expert on one stream,
// what a naive MoE does) and "grouped" (cublasGemmGroupedBatchedEx, cuBLAS's grouped GEMM; CUDA 13
// has no cuBLASLt grouped matmul; bf16 only, cuBLAS has no fp8 grouped form). With cublas_rows,
// bf16 shapes also get a "cublas" row: cublasGemmEx / cublasGemmStridedBatchedEx with the default
// algorithm, i.e. exactly what torch.matmul / torch.bmm call, timed in-process with our harness;
// it separates "different algorithm" from "different harness" when zaya and the peer disagree.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/gemm/lt_search.h"
#include "bench/bench_common.h"
#include "bench/bench_kernels.h"
#include "bench/gemm_bench.h"
#include "bench/launch_timing_cuda.h"
#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zaya::bench {

namespace {

// The configuration of a cuBLASLt algorithm, attribute by attribute (each read at its own width;
// an attribute the library cannot report is left out).
std::vector<std::pair<std::string, int64_t>> algo_fields(const cublasLtMatmulAlgo_t& algo) {
  std::vector<std::pair<std::string, int64_t>> f;
  auto get = [&](const char* name, cublasLtMatmulAlgoConfigAttributes_t attr, auto zero) {
    auto v = zero;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) ==
            CUBLAS_STATUS_SUCCESS &&
        written == sizeof(v))
      f.emplace_back(name, int64_t(v));
  };
  get("id", CUBLASLT_ALGO_CONFIG_ID, int32_t(0));
  get("tile", CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t(0));
  get("stages", CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t(0));
  get("splitk", CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t(0));
  get("reduction", CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t(0));
  get("swizzle", CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t(0));
  get("custom", CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, uint32_t(0));
  get("inner_shape", CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, uint16_t(0));
  get("cluster_shape", CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t(0));
  return f;
}

float fp8_e4m3_to_f32(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
  float r;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0)
    r = std::ldexp(float(m) / 8.0f, -6);
  else
    r = std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return s ? -r : r;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* c() const { return static_cast<char*>(p); }
};

// The timed stream and its events (launch_timing_cuda.h), the cuBLAS handles and their workspace.
struct Context : TimedStream {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  size_t ws_bytes;
  DeviceBuffer ws;
  explicit Context(size_t workspace) : ws_bytes(workspace), ws(workspace) {
    ZAYA_CUBLAS_CHECK(cublasLtCreate(&lt));
    ZAYA_CUBLAS_CHECK(cublasCreate(&blas));
    ZAYA_CUBLAS_CHECK(cublasSetStream(blas, st));
    ZAYA_CUBLAS_CHECK(cublasSetWorkspace(blas, ws.p, ws_bytes));
  }
  ~Context() {
    cublasDestroy(blas);
    cublasLtDestroy(lt);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

// One cuBLASLt problem description (optionally strided-batched), with its candidate algorithms.
struct LtProblem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  size_t ws_bytes = 0;
  cudaDataType_t in;  // A and B

  LtProblem(cublasLtHandle_t h, const GemmShape& s, bool fp8, int64_t batch, int candidates,
            size_t workspace)
      : ws_bytes(workspace), in(fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF) {
    ZAYA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    ZAYA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    ZAYA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major view of row-major Y[m,n] = X[m,k] W[n,k]^T: D(n x m) = W^T(op) * X.
    ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, in, uint64_t(s.k), uint64_t(s.n), s.k));
    ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, in, uint64_t(s.k), uint64_t(s.m), s.k));
    ZAYA_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, uint64_t(s.n), uint64_t(s.m), s.n));
    if (batch > 1) {
      const int32_t bc = int32_t(batch);
      const int64_t sa = s.n * s.k, sb = s.m * s.k, sc = s.m * s.n;
      for (auto [l, stride] : {std::pair{a, sa}, {b, sb}, {c, sc}}) {
        ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                           &bc, sizeof(bc)));
        ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
      }
    }
    cublasLtMatmulPreference_t pref;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ws_bytes;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    algos.resize(size_t(std::max(1, candidates)));
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        h, desc, a, b, c, c, pref, int(algos.size()), algos.data(), &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
      release();
      fail("cuBLASLt has no algorithm for {} GEMM m={} n={} k={} (batch {}) on this device",
           fp8 ? "fp8" : "bf16", s.m, s.n, s.k, batch);
    }
    algos.resize(size_t(returned));
  }
  // The wider search (backend/cuda/gemm/lt_search.h): every algorithm id's `per_id` best
  // configurations join the candidates (only worth its cost when they are then autotuned).
  void widen(cublasLtHandle_t h, int per_id) {
    if (per_id <= 0) return;
    cublasLtMatmulPreference_t pref;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ws_bytes;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cuda::add_per_algo_id_candidates(h, desc, a, b, c, pref, in, CUDA_R_16BF, per_id, ws_bytes,
                                     algos);
    cublasLtMatmulPreferenceDestroy(pref);
  }
  // Makes `algo` the only candidate when cuBLASLt accepts it for this problem within the
  // workspace (cublasLtMatmulAlgoCheck); false leaves the candidates as they were.
  bool use_fixed(cublasLtHandle_t h, const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(h, desc, a, b, c, c, &algo, &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > ws_bytes)
      return false;
    r.algo = algo;  // AlgoCheck reports on the algorithm but does not copy it
    r.state = CUBLAS_STATUS_SUCCESS;
    algos.assign(1, r);
    return true;
  }
  ~LtProblem() { release(); }
  LtProblem(const LtProblem&) = delete;
  LtProblem& operator=(const LtProblem&) = delete;
  void release() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
    a = b = c = nullptr;
    desc = nullptr;
  }
  void run(cublasLtHandle_t h, const void* W, const void* X, void* Y, void* ws, cudaStream_t st,
           int algo) const {
    const float alpha = 1.0f, beta = 0.0f;
    ZAYA_CUBLAS_CHECK(cublasLtMatmul(h, desc, &alpha, W, a, X, b, &beta, Y, c, Y, c,
                                     &algos[size_t(algo)].algo, ws, ws_bytes, st));
  }
};

// Picks the fastest of p.algos on the real operands (see the file comment). Returns its index.
int autotune(Context& ctx, const LtProblem& p, const TimingPolicy& pol, int sets,
             const std::function<void(int, int)>& run_algo) {
  const int nc = int(p.algos.size());
  // A candidate that fails to launch (a configuration the heuristic offered but this problem
  // rejects) is not a candidate. Launch failures surface synchronously as a cuBLAS status.
  std::vector<int> ok;
  for (int a = 0; a < nc; ++a) {
    try {
      run_algo(a, a % sets);
      ok.push_back(a);
    } catch (const Error&) {
    }
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(ctx.st));
  ZAYA_CHECK(!ok.empty(), "cuBLASLt: none of the {} heuristic candidates launches", nc);
  if (ok.size() == 1) return ok[0];
  // Warm the GPU with the heuristic's first choice, by GPU time as the measurement does.
  int next = 0;
  const Launch first = [&](int i) { run_algo(ok[0], i); };
  const double est = estimate_us(ctx, pol, sets, next, first);
  for (int i = 0, w = warm_launches(pol, est); i < w; ++i) first(next++ % sets);
  // Short holds suffice for C++ launches (a few microseconds each). Launches over a millisecond
  // are timed fewer times: their times vary little, and 32 candidates of a 12 ms GEMM would
  // otherwise cost seconds.
  auto hold = [](int n) { return 200.0 + 20.0 * n; };
  const bool long_launch = est > 1000;
  const int n1 = long_launch ? 1 : 3, n2 = long_launch ? 2 : 8;
  // Pass 1: every candidate, one untimed launch (short ones) and n1 timed ones.
  std::vector<std::pair<double, int>> pass1;
  for (int a : ok) {
    const Launch l = [&](int i) { run_algo(a, i); };
    if (!long_launch) l(next++ % sets);
    pass1.push_back({median(sample_launches(ctx, n1, hold(n1), sets, next, l)), a});
  }
  std::sort(pass1.begin(), pass1.end());
  // Pass 2: the best three and the heuristic's first choice, interleaved rounds (so a clock drift
  // hits them alike), n2 launches per round; the lowest median of each one's samples wins, the
  // heuristic's first choice unless beaten by more than kKeepFirstMargin.
  std::vector<int> finalists;
  for (size_t f = 0; f < std::min<size_t>(3, pass1.size()); ++f)
    finalists.push_back(pass1[f].second);
  if (std::find(finalists.begin(), finalists.end(), ok[0]) == finalists.end())
    finalists.push_back(ok[0]);
  std::vector<std::vector<double>> samples(finalists.size());
  for (int round = 0; round < 4; ++round)
    for (size_t f = 0; f < finalists.size(); ++f) {
      const int a = finalists[f];
      const Launch l = [&](int i) { run_algo(a, i); };
      const auto t = sample_launches(ctx, n2, hold(n2), sets, next, l);
      samples[f].insert(samples[f].end(), t.begin(), t.end());
    }
  return pick_finalist(finalists, samples, ok[0]);
}

// Sampled correctness check of output set 0 against an fp64 CPU reference.
void check_sample(const GemmShape& s, bool fp8, const char* W, const char* X, const char* Y,
                  GemmResult& r) {
  const size_t es = fp8 ? 1 : 2;
  std::mt19937_64 rng(uint64_t(s.m * 31 + s.n * 17 + s.k));
  const int samples = 48;
  std::vector<uint8_t> xrow(size_t(s.k) * es), wrow(size_t(s.k) * es);
  auto val = [&](const std::vector<uint8_t>& row, int64_t i) -> double {
    if (fp8) return fp8_e4m3_to_f32(row[size_t(i)]);
    uint16_t h;
    std::memcpy(&h, row.data() + size_t(i) * 2, 2);
    return bf16_to_f32(h);
  };
  for (int t = 0; t < samples; ++t) {
    const int64_t g = int64_t(rng() % uint64_t(s.groups));
    const int64_t i = int64_t(rng() % uint64_t(s.m)), j = int64_t(rng() % uint64_t(s.n));
    const char* Xg = X + size_t(g * s.m * s.k) * es;
    const char* Wg = W + size_t(g * s.n * s.k) * es;
    ZAYA_CUDA_CHECK(
        cudaMemcpy(xrow.data(), Xg + size_t(i * s.k) * es, xrow.size(), cudaMemcpyDeviceToHost));
    ZAYA_CUDA_CHECK(
        cudaMemcpy(wrow.data(), Wg + size_t(j * s.k) * es, wrow.size(), cudaMemcpyDeviceToHost));
    uint16_t yh = 0;
    ZAYA_CUDA_CHECK(
        cudaMemcpy(&yh, Y + size_t(g * s.m * s.n + i * s.n + j) * 2, 2, cudaMemcpyDeviceToHost));
    double ref = 0, mag = 0;
    for (int64_t q = 0; q < s.k; ++q) {
      const double p = val(xrow, q) * val(wrow, q);
      ref += p;
      mag += std::fabs(p);
    }
    const double got = bf16_to_f32(yh);
    const double err = std::fabs(got - ref);
    // bf16 output rounding (2^-8 relative) plus fp32 accumulation; FP8 tensor cores accumulate
    // with fewer bits, hence the looser term.
    const double tol = std::ldexp(std::fabs(ref), -7) + (fp8 ? 2e-3 : 1e-5) * mag + 1e-6;
    r.max_rel_err = std::max(r.max_rel_err, err / std::max(mag, 1e-30));
    ++r.checked;
    if (!(err <= tol)) ++r.wrong;
  }
}

struct ShapeBuffers {
  int sets = 1;
  size_t wbytes = 0, xbytes = 0, ybytes = 0;
  std::unique_ptr<DeviceBuffer> w, x, y;
  const char* W(int i) const { return w->c() + size_t(i) * wbytes; }
  const char* X(int i) const { return x->c() + size_t(i) * xbytes; }
  char* Y(int i) const { return y->c() + size_t(i) * ybytes; }
};

ShapeBuffers make_buffers(const GemmShape& s, bool fp8, int64_t l2_bytes, cudaStream_t st) {
  ShapeBuffers b;
  const size_t es = fp8 ? 1 : 2;
  b.wbytes = size_t(s.groups * s.n * s.k) * es;
  b.xbytes = size_t(s.groups * s.m * s.k) * es;
  b.ybytes = size_t(s.groups * s.m * s.n) * 2;
  // Round each set up to 256 bytes so every set keeps cuBLASLt's preferred alignment.
  auto up = [](size_t v) { return (v + 255) / 256 * 256; };
  b.wbytes = up(b.wbytes);
  b.xbytes = up(b.xbytes);
  b.ybytes = up(b.ybytes);
  const size_t set = b.wbytes + b.xbytes + b.ybytes;
  size_t free_b = 0, total_b = 0;
  ZAYA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  b.sets = int(std::clamp<size_t>((3 * size_t(l2_bytes) + set - 1) / set, 1, 32));
  while (b.sets > 1 && size_t(b.sets) * set > free_b / 2) --b.sets;
  ZAYA_CHECK(set < free_b, "GEMM m={} n={} k={} groups={} needs {} MiB, only {} MiB free", s.m, s.n,
             s.k, s.groups, set >> 20, free_b >> 20);
  b.w = std::make_unique<DeviceBuffer>(b.wbytes * size_t(b.sets));
  b.x = std::make_unique<DeviceBuffer>(b.xbytes * size_t(b.sets));
  b.y = std::make_unique<DeviceBuffer>(b.ybytes * size_t(b.sets));
  auto fill = fp8 ? kernels::fill_random_fp8_e4m3 : kernels::fill_random_bf16;
  fill(b.w->p, b.wbytes * size_t(b.sets) / es, 1, st);
  fill(b.x->p, b.xbytes * size_t(b.sets) / es, 2, st);
  ZAYA_CUDA_CHECK(cudaMemsetAsync(b.y->p, 0, b.ybytes * size_t(b.sets), st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  return b;
}

}  // namespace

DeviceInfo query_device(int dev) {
  DeviceInfo d;
  int count = 0;
  ZAYA_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZAYA_CHECK(dev >= 0 && dev < count, "--device {}: this machine has {} CUDA device(s)", dev,
             count);
  cudaDeviceProp p;
  ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.l2_bytes = p.l2CacheSize;
  d.global_bytes = int64_t(p.totalGlobalMem);
  int mem_khz = 0, bus_bits = 0, sm_khz = 0;
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev);
  d.peak_hbm_gbs = 2.0 * double(mem_khz) * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
  const std::string name = d.name;
  // Dense tensor-core peaks. Hopper SXM parts (H100/H200, 132 SMs) are listed at the spec clock
  // NVIDIA quotes (989.4 / 1978.9 TFLOP/s); others fall back to SMs x boost clock x FLOP/clk/SM.
  if ((name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) &&
      d.sm_count == 132) {
    d.peak_bf16_tflops = 989.4;
    d.peak_fp8_tflops = 1978.9;
    d.peak_source = "spec table";
  } else {
    double per_clk = 0;  // bf16 dense FLOP per clock per SM
    if (d.cc_major == 8 && d.cc_minor == 0) per_clk = 2048;
    if (d.cc_major == 9) per_clk = 4096;
    if (d.cc_major == 10) per_clk = 8192;
    if (per_clk > 0) {
      d.peak_bf16_tflops = per_clk * d.sm_count * sm_khz * 1e3 / 1e12;
      d.peak_fp8_tflops = d.cc_major >= 9 ? 2 * d.peak_bf16_tflops : 0;
      d.peak_source = "clock x SMs";
    } else {
      d.peak_source = "unknown";
    }
  }
  return d;
}

std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& opt) {
  const DeviceInfo dev = query_device(opt.device);
  ZAYA_CUDA_CHECK(cudaSetDevice(opt.device));
  const bool has_fp8 = dev.cc_major * 10 + dev.cc_minor >= 89;
  const TimingPolicy& pol = opt.timing;
  Context ctx(opt.workspace_bytes);
  const Nvml nvml(opt.device);
  if (!nvml.ok())
    std::fprintf(stderr,
                 "zaya bench gemm: NVML (libnvidia-ml.so.1) unavailable; rows carry no "
                 "clock samples\n");
  std::vector<GemmResult> out;
  for (const auto& dt : opt.dtypes) {
    const bool fp8 = dt == "fp8";
    if (fp8 && !has_fp8) {
      std::fprintf(stderr, "zaya bench gemm: %s (sm_%d%d) has no FP8 tensor cores; fp8 skipped\n",
                   dev.name.c_str(), dev.cc_major, dev.cc_minor);
      continue;
    }
    const size_t es = fp8 ? 1 : 2;
    for (const auto& s : opt.shapes) {
      // FP8 cuBLASLt needs k and n multiples of 16 (16-byte rows); skip shapes it cannot run.
      if (fp8 && (s.k % 16 != 0 || s.n % 16 != 0 || s.m % 16 != 0)) {
        std::fprintf(
            stderr,
            "zaya bench gemm: fp8 %s m=%lld n=%lld k=%lld skipped (needs multiples of 16)\n",
            s.name.c_str(), (long long)s.m, (long long)s.n, (long long)s.k);
        continue;
      }
      ShapeBuffers buf = make_buffers(s, fp8, dev.l2_bytes, ctx.st);
      auto result = [&](const std::string& method, const Timed& t) {
        GemmResult r;
        r.shape = s;
        r.dtype = dt;
        r.method = method;
        r.time_us = t.us;
        r.tflops = t.us > 0 ? s.gflop() / (t.us * 1e-6) / 1e3 : 0;
        r.tiles = tile_count(s.m, s.n, 128, 128) * s.groups;
        r.waves = wave_count(r.tiles, dev.sm_count);
        r.sets = buf.sets;
        r.iters = t.iters;
        r.warm = t.warm;
        r.gpu = t.gpu;
        return r;
      };
      // Runs `launch` once on set 0 (zeroed first) and checks a sample of its output.
      auto check = [&](const Launch& launch, GemmResult& r) {
        if (!opt.check) return;
        ZAYA_CUDA_CHECK(cudaMemsetAsync(buf.Y(0), 0, buf.ybytes, ctx.st));
        launch(0);
        ZAYA_CUDA_CHECK(cudaStreamSynchronize(ctx.st));
        check_sample(s, fp8, buf.W(0), buf.X(0), buf.Y(0), r);
      };
      // Single (or strided-batched) cuBLASLt call: the algorithm an earlier run kept
      // (--algos-from), else autotuned over the heuristic's candidates and the wider search.
      {
        LtProblem p(ctx.lt, s, fp8, s.groups, opt.autotune, ctx.ws_bytes);
        const auto run_algo = [&](int a, int i) {
          p.run(ctx.lt, buf.W(i), buf.X(i), buf.Y(i), ctx.ws.p, ctx.st, a);
        };
        bool reused = false;
        const std::string key = gemm_algo_key(dt, s);
        if (const auto it = opt.fixed_algos.find(key); it != opt.fixed_algos.end()) {
          std::vector<uint8_t> bytes;
          cublasLtMatmulAlgo_t algo{};
          if (hex_decode(it->second, bytes) && bytes.size() == sizeof(algo)) {
            std::memcpy(&algo, bytes.data(), sizeof(algo));
            reused = p.use_fixed(ctx.lt, algo);
          }
          if (!reused)
            std::fprintf(stderr,
                         "zaya bench gemm: the stored algorithm for %s is not one this "
                         "cuBLASLt accepts; autotuning it\n",
                         key.c_str());
        }
        if (!reused) p.widen(ctx.lt, opt.search_per_algo);
        const int chosen = reused ? 0 : autotune(ctx, p, pol, buf.sets, run_algo);
        Launch launch = [&](int i) { run_algo(chosen, i); };
        std::optional<GraphLaunches> graphs;
        if (std::find(opt.graph_dtypes.begin(), opt.graph_dtypes.end(), dt) !=
            opt.graph_dtypes.end()) {
          graphs.emplace(ctx, buf.sets, launch);
          if (graphs->ok())
            launch = graphs->replay();
          else
            std::fprintf(stderr,
                         "zaya bench gemm: %s: CUDA graph capture failed (%s); timing direct "
                         "launches\n",
                         key.c_str(), graphs->error().c_str());
        }
        GemmResult r = result(s.groups > 1 ? "lt-batched" : "lt",
                              time_policy(ctx, pol, buf.sets, launch, &nvml));
        r.launch = graphs && graphs->ok() ? "cuda-graph" : "direct";
        r.algo = chosen;
        r.candidates = int(p.algos.size());
        r.algo_config = hex_encode(&p.algos[size_t(chosen)].algo, sizeof(cublasLtMatmulAlgo_t));
        r.algo_fields = algo_fields(p.algos[size_t(chosen)].algo);
        r.algo_reused = reused;
        check(launch, r);
        out.push_back(r);
      }
      // cuBLAS's default algorithm: the calls torch.matmul (2-D) and torch.bmm make for bf16.
      if (!fp8 && opt.cublas_rows) {
        const float alpha = 1.0f, beta = 0.0f;
        const Launch launch = [&](int i) {
          if (s.groups == 1)
            ZAYA_CUBLAS_CHECK(cublasGemmEx(
                ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, buf.W(i),
                CUDA_R_16BF, int(s.k), buf.X(i), CUDA_R_16BF, int(s.k), &beta, buf.Y(i),
                CUDA_R_16BF, int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          else
            ZAYA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, buf.W(i),
                CUDA_R_16BF, int(s.k), s.n * s.k, buf.X(i), CUDA_R_16BF, int(s.k), s.m * s.k, &beta,
                buf.Y(i), CUDA_R_16BF, int(s.n), s.m * s.n, int(s.groups), CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT));
        };
        GemmResult r = result("cublas", time_policy(ctx, pol, buf.sets, launch, &nvml));
        check(launch, r);
        out.push_back(r);
      }
      if (s.groups > 1 && opt.grouped_methods) {
        GemmShape one = s;
        one.groups = 1;
        LtProblem p(ctx.lt, one, fp8, 1, 1, ctx.ws_bytes);
        const Launch loop = [&](int i) {
          for (int64_t g = 0; g < s.groups; ++g)
            p.run(ctx.lt, buf.W(i) + size_t(g * s.n * s.k) * es,
                  buf.X(i) + size_t(g * s.m * s.k) * es, buf.Y(i) + size_t(g * s.m * s.n) * 2,
                  ctx.ws.p, ctx.st, 0);
        };
        GemmResult r = result("loop", time_policy(ctx, pol, buf.sets, loop, &nvml));
        r.algo = 0;
        r.candidates = 1;
        check(loop, r);
        out.push_back(r);
        if (!fp8) {
          // cublasGemmGroupedBatchedEx: E groups of one problem each (the variable-size form a
          // router with unequal token counts needs). Pointer arrays live on the device.
          const int E = int(s.groups);
          std::vector<cublasOperation_t> ta(size_t(E), CUBLAS_OP_T), tb(size_t(E), CUBLAS_OP_N);
          std::vector<int> mm(size_t(E), int(s.n)), nn(size_t(E), int(s.m)),
              kk(size_t(E), int(s.k)), lda(size_t(E), int(s.k)), ldb(size_t(E), int(s.k)),
              ldc(size_t(E), int(s.n)), gsize(size_t(E), 1);
          std::vector<float> alpha(size_t(E), 1.0f), beta(size_t(E), 0.0f);
          std::vector<const void*> hA(size_t(E * buf.sets)), hB(size_t(E * buf.sets));
          std::vector<void*> hC(size_t(E * buf.sets));
          for (int i = 0; i < buf.sets; ++i)
            for (int g = 0; g < E; ++g) {
              hA[size_t(i * E + g)] = buf.W(i) + size_t(g * s.n * s.k) * es;
              hB[size_t(i * E + g)] = buf.X(i) + size_t(g * s.m * s.k) * es;
              hC[size_t(i * E + g)] = buf.Y(i) + size_t(g * s.m * s.n) * 2;
            }
          DeviceBuffer dA(hA.size() * sizeof(void*)), dB(hB.size() * sizeof(void*)),
              dC(hC.size() * sizeof(void*));
          ZAYA_CUDA_CHECK(
              cudaMemcpy(dA.p, hA.data(), hA.size() * sizeof(void*), cudaMemcpyHostToDevice));
          ZAYA_CUDA_CHECK(
              cudaMemcpy(dB.p, hB.data(), hB.size() * sizeof(void*), cudaMemcpyHostToDevice));
          ZAYA_CUDA_CHECK(
              cudaMemcpy(dC.p, hC.data(), hC.size() * sizeof(void*), cudaMemcpyHostToDevice));
          const Launch grouped = [&](int i) {
            ZAYA_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
                ctx.blas, ta.data(), tb.data(), mm.data(), nn.data(), kk.data(), alpha.data(),
                static_cast<const void* const*>(dA.p) + size_t(i * E), CUDA_R_16BF, lda.data(),
                static_cast<const void* const*>(dB.p) + size_t(i * E), CUDA_R_16BF, ldb.data(),
                beta.data(), static_cast<void* const*>(dC.p) + size_t(i * E), CUDA_R_16BF,
                ldc.data(), E, gsize.data(), CUBLAS_COMPUTE_32F));
          };
          GemmResult rg;
          bool ok = true;
          try {
            rg = result("grouped", time_policy(ctx, pol, buf.sets, grouped, &nvml));
          } catch (const Error& e) {
            std::fprintf(stderr, "zaya bench gemm: cuBLAS grouped GEMM unavailable: %s\n",
                         e.what());
            ok = false;
          }
          if (ok) {
            check(grouped, rg);
            out.push_back(rg);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace zaya::bench
