// GemmContext (backend/cuda/gemm/gemm.h): row-major GEMMs on cuBLASLt, with a plan cache (per exact
// problem, or per size bucket for the grouped expert GEMMs) and an opt-in autotune of cuBLASLt's
// heuristic candidates.
//
// Row-major on column-major: a row-major X[r,c] with row stride ld is, read column-major, X^T with
// leading dimension ld. So C[M,N] = op(A)·op(B) is computed as the column-major
//   C^T[N,M] = op(B)^T[N,K] · op(A)^T[K,M]
// i.e. cuBLASLt's "A" is our B and its "B" is our A, with the transposes carried over unchanged
// (B not transposed: B^T is exactly the column-major view of B, so OP_N; with trans_b, OP_T). The
// bias epilogue adds a vector along the rows of the column-major D, which are our columns N.
//
// Plans: the first call with a given key (M, N, K, leading dims, transposes, types, bias, beta = 0
// or not, and each pointer's alignment up to 256 bytes, which decides which kernels are legal)
// creates the matmul descriptor and layouts and asks the heuristic for up to kCandidates
// algorithms, excluding split-K schemes that reduce in the output buffer (INPLACE) or in the
// output type (OUTPUT_TYPE, which would round partial sums to bf16); only "no split" and split-K
// reduced in fp32 in the workspace remain, both deterministic. The plan is cached: later calls do
// one hash lookup and one cublasLtMatmul.
//
// Bucket plans (grouped_gemm: the rows per expert, M; grouped_wgrad: the tokens per expert, K):
// those counts change every step, and exact keys made every step create ~16 experts × 6 GEMMs of
// new plans per MoE layer (descriptor, layouts and a heuristic query on the host, tens of µs
// each; the likely cause of the ~13 ms of idle GPU in the H200 training step of 2026-12-03) and
// grow the cache without bound.
// So the varying dimension is keyed by its bucket (size_bucket: multiples of 128 up to 1024, then
// eight steps per power of two — 1152, 1280, ..., 2048, 2304, ... — so the bucket's upper bound is
// within one 128-row tile or 12.5% of every size in it, and sizes up to 2^20 need 88 buckets).
// The plan's layouts are made at the bucket's upper bound, where the heuristic is asked; its
// candidates are kept in order when cublasLtMatmulAlgoCheck also accepts them at the bucket's
// lower bound, and the first kept is the bucket's algorithm (an algorithm tuned for the larger end
// loses at most a partial tile or wave at the smaller sizes). Per call the exact M or K is written
// into the cached layouts (cublasLtMatrixLayoutSetAttribute, host-only) and the bucket's algorithm
// runs. If the bucket has no algorithm legal at both ends, or cublasLtMatmul refuses it for the
// exact size (its checks run on the host before any launch), the call runs an exact-shape plan
// instead: correctness first, at the old cost. The choice depends only on the bucket key (shape,
// types, transposes, alignments), the device and the library, never on which size came first,
// so resumed runs stay bit-identical. The varying dimension is always an outer (row) dimension of
// the operands that hold it, so changing it never makes a leading dimension too small.
//
// Bound: the cache is dropped (and refilled on demand; every choice is reproducible) when it
// reaches kMaxPlans. With buckets a model needs a few hundred plans at most.
//
// Autotune (off unless ZAYA_GEMM_AUTOTUNE=1): the first time a *tuning key* is seen — the plan key
// with M, N and K rounded up to powers of two — every candidate runs once as warm-up and
// kTimedRuns times between CUDA events on the caller's stream and operands, and the fastest is
// kept (the heuristic's first choice stays unless another is more than 3% faster, so noise does
// not flip the choice between runs). Calls with beta != 0 are timed into a scratch output so C is
// not modified. Later exact shapes in the same tuning bucket reuse the bucket's winner when
// cuBLASLt accepts it for them (cublasLtMatmulAlgoCheck) instead of timing again. Bucket plans
// (above) are their own tuning unit: the first call of a bucket times the candidates legal across
// the bucket on its exact operands, and the bucket keeps the winner. Within one
// context a key always runs the same algorithm, but across contexts and processes the timed choice
// can differ (timing noise), and then so do the last bits of every result: a resumed run, or a
// model rebuilt at a phase change, would no longer match a straight run bit for bit. So the default
// is the heuristic's first choice, a function of shape, device and library version only, and
// timing is an opt-in for benchmarks (ZAYA_GEMM_AUTOTUNE=1). No tuning happens while the
// stream is being captured into a CUDA graph. ZAYA_GEMM_SEARCH_ALGOS=N (with autotune) adds each
// cuBLASLt algorithm id's N best configurations to the timed candidates (lt_search.h), under the
// same workspace, reduction-scheme and alignment limits.
//
// Bias: an fp32 bias[N] through CUBLASLT_EPILOGUE_BIAS with CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE =
// CUDA_R_32F. cuBLASLt documents bias elements of the output type for non-fp8 GEMMs, so for bf16
// outputs the heuristic may find no fp32-bias kernel; the plan then runs without the epilogue and
// add_bias_rows (convert.cu) adds the bias afterwards, which rounds to bf16 twice (at most
// one more bf16 ulp than the epilogue would give).
//
// Grouped GEMMs: one cuBLASLt matmul per non-empty group, from the row counts on the host. A
// device-side grouped kernel (one launch for all experts, rows read on the device, as CUTLASS's
// grouped GEMM does) is future work; it would remove the host synchronisation of sort_by_expert
// and the per-group launch overhead, which matter for many small experts.
//
// Not thread-safe, and not for concurrent streams: a context has one workspace, and plans' bias
// pointers and bucket plans' layout sizes are set per call. Use one context per stream (or order
// the streams).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/gemm/lt_search.h"
#include "backend/cuda/ops.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"

namespace zaya::cuda {

namespace {

constexpr int kCandidates = 8;
constexpr int kTimedRuns = 5;
// A candidate replaces the heuristic's first choice only when it takes less than this fraction of
// the first choice's time.
constexpr double kSwitchFraction = 0.97;
// The plan cache is dropped (and refilled on demand: every choice is reproducible) when it
// reaches this many plans. Bucketed expert GEMMs need a few hundred at most; this only bounds
// callers with unbounded exact shapes.
constexpr size_t kMaxPlans = 4096;

size_t elem_bytes(GemmType t) {
  return t == GemmType::BF16 ? 2 : 4;
}
cudaDataType_t cuda_type(GemmType t) {
  return t == GemmType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}
const char* type_name(GemmType t) {
  return t == GemmType::BF16 ? "bf16" : "fp32";
}

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preferences
// default to 256 and exclude kernels that need more than the operands have).
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Bucket width at or below the bucket bound b: 128 up to 2048, then 1/8 of the power of two below
// b.
int64_t bucket_step(int64_t b) {
  if (b <= 2048) return 128;
  return pow2_ceil(b) / 16;  // b in (2^e, 2^(e+1)]: step 2^e / 8
}

int64_t bucket_upper(int64_t v) {
  const int64_t step = v <= 1024 ? 128 : pow2_ceil(v) / 16;
  return (v + step - 1) / step * step;
}

// The smallest size in the bucket whose upper bound is b.
int64_t bucket_lower(int64_t b) {
  return std::max<int64_t>(1, b - bucket_step(b) + 1);
}

// Which dimension of a plan is a bucket (the exact value is set on the layouts per call).
enum class Vary : uint8_t { None, M, K };

struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool trans_a, trans_b, bias, beta_zero;
  GemmType ab, c;
  uint32_t align_a, align_b, align_c, align_bias;
  Vary vary = Vary::None;  // with M or K, that field holds the bucket's upper bound
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc}) mix(uint64_t(v));
    mix(uint64_t(k.trans_a) | uint64_t(k.trans_b) << 1 | uint64_t(k.bias) << 2 |
        uint64_t(k.beta_zero) << 3 | uint64_t(k.ab) << 4 | uint64_t(k.c) << 6 |
        uint64_t(k.vary) << 8);
    mix(uint64_t(k.align_a) | uint64_t(k.align_b) << 16 | uint64_t(k.align_c) << 32 |
        uint64_t(k.align_bias) << 48);
    return size_t(h);
  }
};

Key tuning_key(Key k) {
  k.M = pow2_ceil(k.M);
  k.N = pow2_ceil(k.N);
  k.K = pow2_ceil(k.K);
  return k;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(a.data, b.data, sizeof(a.data)) == 0;
}

// One cached problem: cuBLASLt's descriptors and the chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lay_a = nullptr;  // cuBLASLt's A: our B
  cublasLtMatrixLayout_t lay_b = nullptr;  // cuBLASLt's B: our A
  cublasLtMatrixLayout_t lay_c = nullptr;  // C and D (same layout)
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // false with a bias: added by add_bias_rows instead
  // Bucket plans: false when no candidate is legal at both ends of the bucket (every call then
  // runs an exact-shape plan); cur_M/cur_K are the dimensions the layouts hold now.
  bool usable = true;
  int64_t cur_M = 0, cur_K = 0;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lay_a) cublasLtMatrixLayoutDestroy(lay_a);
    if (lay_b) cublasLtMatrixLayoutDestroy(lay_b);
    if (lay_c) cublasLtMatrixLayoutDestroy(lay_c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// The operands of one call.
struct Call {
  const void* A;
  const void* B;
  void* C;
  const float* bias;
  float alpha, beta;
  cudaStream_t st;
};

std::unique_ptr<Plan> make_plan(const Key& k, const float* bias, bool bias_epilogue) {
  auto p = std::make_unique<Plan>();
  ZAYA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZAYA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  ZAYA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (bias_epilogue) {
    const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    ZAYA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    ZAYA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bias_type, sizeof(bias_type)));
    // The heuristic reads the pointer's alignment, so it is set before the heuristic runs.
    const void* bp = bias;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bp, sizeof(bp)));
    p->bias_epilogue = true;
  }
  const cudaDataType_t ab = cuda_type(k.ab);
  // Column-major shapes: op(B)^T is [N,K]; B stored [K,N] row-major is a column-major [N,K] (OP_N),
  // B stored [N,K] (trans_b) is a column-major [K,N] (OP_T). Likewise for A with [K,M].
  ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_a, ab, uint64_t(k.trans_b ? k.K : k.N),
                                               uint64_t(k.trans_b ? k.N : k.K), k.ldb));
  ZAYA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_b, ab, uint64_t(k.trans_a ? k.M : k.K),
                                               uint64_t(k.trans_a ? k.K : k.M), k.lda));
  ZAYA_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p->lay_c, cuda_type(k.c), uint64_t(k.N), uint64_t(k.M), k.ldc));
  p->cur_M = k.M;
  p->cur_K = k.K;
  return p;
}

// Sets the layouts of a plan made from a key with k's transposes and N to k's M and K (the same
// formulas as make_plan). Host-side attribute writes only; skipped when nothing changes.
void set_dims(Plan& p, const Key& k) {
  if (p.cur_M == k.M && p.cur_K == k.K) return;
  auto set = [](cublasLtMatrixLayout_t l, int64_t rows, int64_t cols) {
    const uint64_t r = uint64_t(rows), c = uint64_t(cols);
    ZAYA_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
    ZAYA_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
  };
  set(p.lay_a, k.trans_b ? k.K : k.N, k.trans_b ? k.N : k.K);
  set(p.lay_b, k.trans_a ? k.M : k.K, k.trans_a ? k.K : k.M);
  set(p.lay_c, k.N, k.M);
  p.cur_M = k.M;
  p.cur_K = k.K;
}

// Destroys a preference object on every path out of the heuristic query.
struct PrefGuard {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PrefGuard() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    ZAYA_CUDA_CHECK(cudaEventCreate(&start));
    ZAYA_CUDA_CHECK(cudaEventCreate(&stop));
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

// Scratch output for timing calls with beta != 0 (stream-ordered, freed on every path out).
struct ScratchGuard {
  void* p = nullptr;
  cudaStream_t st = nullptr;
  ~ScratchGuard() {
    if (p) cudaFreeAsync(p, st);
  }
};

void check_dims(const char* fn, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                int64_t lda, int64_t ldb, int64_t ldc) {
  ZAYA_CHECK(M > 0, "{}: M = {} must be positive (M = {}, N = {}, K = {})", fn, M, M, N, K);
  ZAYA_CHECK(N > 0, "{}: N = {} must be positive (M = {}, N = {}, K = {})", fn, N, M, N, K);
  ZAYA_CHECK(K > 0, "{}: K = {} must be positive (M = {}, N = {}, K = {})", fn, K, M, N, K);
  if (trans_a)
    ZAYA_CHECK(lda >= M, "{}: lda = {} is smaller than M = {} (trans_a: A is stored [K,M])", fn,
               lda, M);
  else
    ZAYA_CHECK(lda >= K, "{}: lda = {} is smaller than K = {} (A is stored [M,K])", fn, lda, K);
  if (trans_b)
    ZAYA_CHECK(ldb >= K, "{}: ldb = {} is smaller than K = {} (trans_b: B is stored [N,K])", fn,
               ldb, K);
  else
    ZAYA_CHECK(ldb >= N, "{}: ldb = {} is smaller than N = {} (B is stored [K,N])", fn, ldb, N);
  ZAYA_CHECK(ldc >= N, "{}: ldc = {} is smaller than N = {} (C is [M,N])", fn, ldc, N);
}

// All row counts are checked before any GEMM is enqueued, so a bad count leaves C untouched.
void check_rows(const char* fn, const int32_t* rows_host, int64_t G) {
  ZAYA_CHECK(rows_host, "{}: rows_host is null with G = {}", fn, G);
  for (int64_t g = 0; g < G; ++g)
    ZAYA_CHECK(rows_host[g] >= 0, "{}: rows_host[{}] = {} is negative", fn, g, rows_host[g]);
}

}  // namespace

struct GemmContext::Impl {
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  bool autotune = true;
  int search_per_algo = 0;  // with autotune: the wider search (lt_search.h), per algorithm id
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
  std::unordered_map<Key, cublasLtMatmulAlgo_t, KeyHash> tuned;  // by tuning_key

  ~Impl() {
    plans.clear();  // descriptors before the handle
    if (ws) cudaFree(ws);
    if (lt) cublasLtDestroy(lt);
  }

  cublasStatus_t matmul(const Plan& p, const Call& c, const cublasLtMatmulAlgo_t& algo,
                        void* D) const {
    return cublasLtMatmul(lt, p.desc, &c.alpha, c.B, p.lay_a, c.A, p.lay_b, &c.beta, c.C, p.lay_c,
                          D, p.lay_c, &algo, ws, ws_bytes, c.st);
  }

  // The heuristic's usable candidates (empty when none); *status gets the heuristic's own status.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates(const Plan& p, const Key& k,
                                                          cublasStatus_t* status) const {
    PrefGuard g;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&g.pref));
    const uint64_t ws_max = ws_bytes;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof(ws_max)));
    // NONE (0) always passes the mask; COMPUTE_TYPE is split-K reduced in fp32 in a separate,
    // fixed-order pass. INPLACE and OUTPUT_TYPE are excluded (see the file comment).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        g.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c}};
    for (const auto& [attr, v] : aligns)
      ZAYA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(g.pref, attr, &v, sizeof(v)));
    std::vector<cublasLtMatmulHeuristicResult_t> res(kCandidates);
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        lt, p.desc, p.lay_a, p.lay_b, p.lay_c, p.lay_c, g.pref, kCandidates, res.data(), &returned);
    if (status) *status = st;
    if (st != CUBLAS_STATUS_SUCCESS) return {};
    res.resize(size_t(std::max(returned, 0)));
    std::erase_if(res, [&](const cublasLtMatmulHeuristicResult_t& r) {
      return r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > ws_bytes;
    });
    // Only for autotuning: the heuristic's first choice (res[0]) stays first, and it stays the
    // choice unless a timed candidate beats it by more than kSwitchFraction.
    if (autotune && search_per_algo > 0 && !res.empty())
      add_per_algo_id_candidates(lt, p.desc, p.lay_a, p.lay_b, p.lay_c, g.pref, cuda_type(k.ab),
                                 cuda_type(k.c), search_per_algo, ws_bytes, res);
    return res;
  }

  // Times each candidate on the call's operands; returns the index of the one to keep.
  size_t time_candidates(const Plan& p, const Key& k,
                         const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
                         const Call& call) const {
    void* D = call.C;
    ScratchGuard scratch{nullptr, call.st};
    if (!k.beta_zero) {
      const size_t bytes = size_t((k.M - 1) * k.ldc + k.N) * elem_bytes(k.c);
      if (cudaMallocAsync(&scratch.p, bytes, call.st) != cudaSuccess) {
        (void)cudaGetLastError();  // out of memory: keep the heuristic's choice
        scratch.p = nullptr;
        return 0;
      }
      D = scratch.p;
    }
    EventPair ev;
    constexpr float kFailed = std::numeric_limits<float>::infinity();
    std::vector<float> ms(cands.size(), kFailed);
    for (size_t i = 0; i < cands.size(); ++i) {
      // The warm-up also probes that the candidate runs on these operands.
      if (matmul(p, call, cands[i].algo, D) != CUBLAS_STATUS_SUCCESS) continue;
      ZAYA_CUDA_CHECK(cudaEventRecord(ev.start, call.st));
      bool ok = true;
      for (int r = 0; r < kTimedRuns && ok; ++r)
        ok = matmul(p, call, cands[i].algo, D) == CUBLAS_STATUS_SUCCESS;
      ZAYA_CUDA_CHECK(cudaEventRecord(ev.stop, call.st));
      ZAYA_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float t = 0;
      ZAYA_CUDA_CHECK(cudaEventElapsedTime(&t, ev.start, ev.stop));
      if (ok) ms[i] = t / kTimedRuns;
    }
    size_t best = size_t(std::min_element(ms.begin(), ms.end()) - ms.begin());
    if (ms[0] != kFailed && ms[best] > kSwitchFraction * ms[0]) best = 0;
    zaya::log(
        LogLevel::Debug,
        "gemm autotune M={} N={} K={} ta={} tb={} {}->{}: candidate {} of {} ({:.2f} us; first "
        "{:.2f} us)",
        k.M, k.N, k.K, k.trans_a, k.trans_b, type_name(k.ab), type_name(k.c), best, cands.size(),
        double(ms[best]) * 1e3, double(ms[0]) * 1e3);
    return best;
  }

  // k is the call's exact problem, and p's layouts hold it. For a bucket plan (bucketed) the
  // candidates are already those legal across the bucket, and the bucket is the tuning unit.
  cublasLtMatmulAlgo_t choose(const Plan& p, const Key& k,
                              const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
                              const Call& call, bool bucketed) {
    if (!autotune) return cands[0].algo;
    const Key tk = tuning_key(k);
    if (const auto t = bucketed ? tuned.end() : tuned.find(tk); t != tuned.end()) {
      // A bucket-mate was timed: reuse its winner if it is legal for this exact problem.
      for (const auto& c : cands)
        if (same_algo(c.algo, t->second)) return c.algo;
      cublasLtMatmulHeuristicResult_t r{};
      if (cublasLtMatmulAlgoCheck(lt, p.desc, p.lay_a, p.lay_b, p.lay_c, p.lay_c, &t->second, &r) ==
              CUBLAS_STATUS_SUCCESS &&
          r.workspaceSize <= ws_bytes)
        return t->second;
      return cands[0].algo;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ZAYA_CUDA_CHECK(cudaStreamIsCapturing(call.st, &capture));
    if (capture != cudaStreamCaptureStatusNone) return cands[0].algo;  // cannot time in a graph
    const size_t best = cands.size() > 1 ? time_candidates(p, k, cands, call) : 0;
    if (!bucketed) tuned.emplace(tk, cands[best].algo);
    return cands[best].algo;
  }

  // Inserts a new plan, first dropping the whole cache when it is full (references to plans do
  // not outlive the call that looked them up).
  Plan& insert(const Key& k, std::unique_ptr<Plan> p) {
    if (plans.size() >= kMaxPlans) {
      zaya::log(LogLevel::Warn,
                "gemm: {} cached plans; dropping them all (some caller's shapes never repeat)",
                plans.size());
      plans.clear();
    }
    return *plans.emplace(k, std::move(p)).first->second;
  }

  // Whether algo runs the problem that p's layouts now hold within the workspace.
  bool legal(const Plan& p, const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t r{};
    return cublasLtMatmulAlgoCheck(lt, p.desc, p.lay_a, p.lay_b, p.lay_c, p.lay_c, &algo, &r) ==
               CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= ws_bytes;
  }

  // The plan of a bucket key kb (no bias); k is the call's exact problem (in the bucket). The
  // heuristic is asked at the bucket's upper bound, and its candidates are kept in their order
  // when cublasLtMatmulAlgoCheck also accepts them at the bucket's lower bound; the first one left
  // (or, with autotune, the fastest on this call) is the bucket's algorithm. Every input to that
  // choice is the bucket key, so it does not depend on which size created the plan.
  Plan& bucket_plan_for(const Key& kb, const Key& k, const Call& call) {
    if (const auto it = plans.find(kb); it != plans.end()) return *it->second;
    std::unique_ptr<Plan> p = make_plan(kb, nullptr, false);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    std::vector<cublasLtMatmulHeuristicResult_t> cands = candidates(*p, kb, &st);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) ZAYA_CUBLAS_CHECK(st);
    Key lo = kb;
    (kb.vary == Vary::M ? lo.M : lo.K) = bucket_lower(kb.vary == Vary::M ? kb.M : kb.K);
    set_dims(*p, lo);
    std::vector<cublasLtMatmulHeuristicResult_t> ok;
    for (const auto& c : cands) {
      if (!legal(*p, c.algo)) continue;
      ok.push_back(c);
      if (!autotune) break;  // only the first is used
    }
    if (ok.empty()) {
      zaya::log(LogLevel::Debug,
                "gemm: no algorithm for the bucket {} of {} (M={} N={} K={} ta={} tb={}); its "
                "sizes run exact-shape plans",
                kb.vary == Vary::M ? kb.M : kb.K, kb.vary == Vary::M ? "M" : "K", kb.M, kb.N, kb.K,
                kb.trans_a, kb.trans_b);
      p->usable = false;
    } else {
      set_dims(*p, k);
      p->algo = choose(*p, k, ok, call, true);
    }
    return insert(kb, std::move(p));
  }

  // One GEMM. With vary != None, the plan is the bucket's of that dimension of k; if the bucket has
  // no algorithm, or cuBLASLt refuses the bucket's algorithm for this exact size (its checks run
  // on the host before any launch), the call runs an exact-shape plan instead.
  void run(const Key& k, Vary vary, const Call& call) {
    if (vary != Vary::None) {
      Key kb = k;
      kb.vary = vary;
      int64_t& d = vary == Vary::M ? kb.M : kb.K;
      d = bucket_upper(d);
      Plan& b = bucket_plan_for(kb, k, call);
      if (b.usable) {
        set_dims(b, k);
        const cublasStatus_t st = matmul(b, call, b.algo, call.C);
        if (st == CUBLAS_STATUS_SUCCESS) return;
        zaya::log(LogLevel::Debug,
                  "gemm: the bucket algorithm refused M={} N={} K={} ta={} tb={} ({}); running an "
                  "exact-shape plan",
                  k.M, k.N, k.K, k.trans_a, k.trans_b, int(st));
      }
    }
    Plan& p = plan_for(k, call);
    if (p.bias_epilogue) {
      const void* bp = call.bias;
      ZAYA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bp, sizeof(bp)));
    }
    ZAYA_CUBLAS_CHECK(matmul(p, call, p.algo, call.C));
    if (call.bias && !p.bias_epilogue)
      add_bias_rows(call.C, k.ldc, k.c == GemmType::BF16, call.bias, k.M, k.N, call.st);
  }

  Plan& plan_for(const Key& k, const Call& call) {
    if (const auto it = plans.find(k); it != plans.end()) return *it->second;
    std::unique_ptr<Plan> p = make_plan(k, call.bias, k.bias);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    std::vector<cublasLtMatmulHeuristicResult_t> cands = candidates(*p, k, &st);
    // No fp32-bias epilogue for this problem (reported as NOT_SUPPORTED or INVALID_VALUE depending
    // on the library version): run without it and add the bias with a kernel instead.
    if (cands.empty() && k.bias) {
      p = make_plan(k, nullptr, false);
      cands = candidates(*p, k, &st);
    }
    // NOT_SUPPORTED means no algorithm fits (reported below with the problem); others are errors.
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) ZAYA_CUBLAS_CHECK(st);
    if (cands.empty())
      fail(
          "gemm: cuBLASLt has no algorithm for M = {}, N = {}, K = {}, lda = {}, ldb = {}, "
          "ldc = {}, trans_a = {}, trans_b = {}, {} x {} -> {} (pointer alignments A {}, B {}, "
          "C {}) within a {}-byte workspace",
          k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.trans_a, k.trans_b, type_name(k.ab),
          type_name(k.ab), type_name(k.c), k.align_a, k.align_b, k.align_c, ws_bytes);
    p->algo = choose(*p, k, cands, call, false);
    return insert(k, std::move(p));
  }
};

GemmContext::GemmContext(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  ZAYA_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));
  if (workspace_bytes > 0) ZAYA_CUDA_CHECK(cudaMalloc(&impl_->ws, workspace_bytes));
  impl_->ws_bytes = workspace_bytes;
  const char* env = std::getenv("ZAYA_GEMM_AUTOTUNE");
  impl_->autotune = env && std::string_view(env) == "1";
  if (const char* n = std::getenv("ZAYA_GEMM_SEARCH_ALGOS"); impl_->autotune && n) {
    char* end = nullptr;
    const long v = std::strtol(n, &end, 10);
    ZAYA_CHECK(end != n && *end == '\0' && v >= 0 && v <= 64,
               "ZAYA_GEMM_SEARCH_ALGOS = '{}': expected a count of configurations per algorithm "
               "id, 0 to 64",
               n);
    impl_->search_per_algo = int(v);
  }
}

GemmContext::~GemmContext() = default;

namespace {
// The plan key of one problem (exact dimensions; run() buckets the varying one).
Key make_key(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
             int64_t ldc, float beta, GemmType ab, GemmType c, const void* A, const void* B,
             const void* C, const float* bias) {
  return Key{.M = M,
             .N = N,
             .K = K,
             .lda = lda,
             .ldb = ldb,
             .ldc = ldc,
             .trans_a = trans_a,
             .trans_b = trans_b,
             .bias = bias != nullptr,
             .beta_zero = beta == 0.f,
             .ab = ab,
             .c = c,
             .align_a = alignment(A),
             .align_b = alignment(B),
             .align_c = alignment(C),
             .align_bias = bias ? alignment(bias) : 256u};
}
}  // namespace

void GemmContext::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                       int64_t ldc, GemmType ab_type, GemmType c_type, const float* bias,
                       cudaStream_t st) {
  check_dims("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  ZAYA_CHECK(A && B && C, "gemm: null operand pointer (A = {}, B = {}, C = {})", A, B,
             static_cast<const void*>(C));
  ZAYA_CHECK(
      !(ab_type == GemmType::F32 && c_type == GemmType::BF16),
      "gemm: fp32 operands need an fp32 output (c_type bf16 is not supported with fp32 A/B)");
  ZAYA_CHECK(!bias || beta == 0.f, "gemm: a bias needs beta = 0 (got beta = {})", beta);
  const Key k =
      make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, beta, ab_type, c_type, A, B, C, bias);
  impl_->run(k, Vary::None, Call{A, B, C, bias, alpha, beta, st});
}

size_t GemmContext::plan_count() const {
  return impl_->plans.size();
}

int64_t GemmContext::size_bucket(int64_t v) {
  ZAYA_CHECK(v >= 1, "GemmContext::size_bucket: v = {} must be positive", v);
  return bucket_upper(v);
}

// One bf16 × bf16 GEMM of a grouped call, its plan cached by the bucket of the varying dimension.
// That dimension must be an outer (row) dimension of every operand holding it, so the bucket's
// layouts stay valid: M with A not transposed, K with A transposed and B not.
void GemmContext::grouped_one(int vary, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                              float beta, void* C, int64_t ldc, GemmType c_type, cudaStream_t st) {
  check_dims("grouped gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  ZAYA_CHECK(vary == int(Vary::M) ? !trans_a : vary == int(Vary::K) && trans_a && !trans_b,
             "grouped gemm: dimension {} cannot be bucketed with trans_a = {}, trans_b = {}", vary,
             trans_a, trans_b);
  const Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, beta, GemmType::BF16, c_type, A,
                         B, C, nullptr);
  impl_->run(k, Vary(vary), Call{A, B, C, nullptr, alpha, beta, st});
}

void GemmContext::grouped_gemm(bool trans_b, const int32_t* rows_host, int64_t G, int64_t N,
                               int64_t K, float alpha, const void* A, int64_t lda, const void* B,
                               int64_t ldb, int64_t b_stride, float beta, void* C, int64_t ldc,
                               GemmType c_type, cudaStream_t st) {
  ZAYA_CHECK(G >= 0, "grouped_gemm: G = {} must not be negative", G);
  ZAYA_CHECK(b_stride >= 0, "grouped_gemm: b_stride = {} must not be negative", b_stride);
  // Checked once here (with M = 1) so bad dimensions fail even when every group is empty.
  check_dims("grouped_gemm", false, trans_b, 1, N, K, lda, ldb, ldc);
  if (G == 0) return;
  check_rows("grouped_gemm", rows_host, G);
  const size_t c_es = elem_bytes(c_type), ab_es = elem_bytes(GemmType::BF16);
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = rows_host[g];
    if (rows > 0)
      grouped_one(int(Vary::M), false, trans_b, rows, N, K, alpha,
                  static_cast<const char*>(A) + size_t(off * lda) * ab_es, lda,
                  static_cast<const char*>(B) + size_t(g * b_stride) * ab_es, ldb, beta,
                  static_cast<char*>(C) + size_t(off * ldc) * c_es, ldc, c_type, st);
    off += rows;
  }
}

void GemmContext::grouped_wgrad(const int32_t* rows_host, int64_t G, int64_t M_out, int64_t K,
                                float alpha, const void* dY, int64_t ld_dy, const void* X,
                                int64_t ld_x, float beta, void* dW, int64_t w_stride,
                                GemmType c_type, cudaStream_t st) {
  ZAYA_CHECK(G >= 0, "grouped_wgrad: G = {} must not be negative", G);
  ZAYA_CHECK(M_out > 0, "grouped_wgrad: M_out = {} must be positive (K = {})", M_out, K);
  ZAYA_CHECK(K > 0, "grouped_wgrad: K = {} must be positive (M_out = {})", K, M_out);
  ZAYA_CHECK(ld_dy >= M_out, "grouped_wgrad: ld_dy = {} is smaller than M_out = {}", ld_dy, M_out);
  ZAYA_CHECK(ld_x >= K, "grouped_wgrad: ld_x = {} is smaller than K = {}", ld_x, K);
  ZAYA_CHECK(G <= 1 || w_stride >= M_out * K,
             "grouped_wgrad: w_stride = {} is smaller than one gradient, M_out·K = {}", w_stride,
             M_out * K);
  if (G == 0) return;
  check_rows("grouped_wgrad", rows_host, G);
  // Empty groups are defined for beta 0 (zero the gradient) and 1 (leave it); anything else would
  // need a scaling pass that no caller wants. Checked before any work is enqueued.
  for (int64_t g = 0; g < G; ++g)
    ZAYA_CHECK(rows_host[g] > 0 || beta == 0.f || beta == 1.f,
               "grouped_wgrad: group {} is empty and beta = {}; empty groups need beta 0 or 1", g,
               beta);
  const size_t c_es = elem_bytes(c_type), ab_es = elem_bytes(GemmType::BF16);
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = rows_host[g];
    char* dW_g = static_cast<char*>(dW) + size_t(g * w_stride) * c_es;
    if (rows > 0) {
      // dW_g[M_out,K] = alpha · dY_g^T · X_g + beta · dW_g: op(A) = A^T with A = dY_g [rows,M_out].
      grouped_one(int(Vary::K), true, false, M_out, K, rows, alpha,
                  static_cast<const char*>(dY) + size_t(off * ld_dy) * ab_es, ld_dy,
                  static_cast<const char*>(X) + size_t(off * ld_x) * ab_es, ld_x, beta, dW_g, K,
                  c_type, st);
    } else if (beta == 0.f) {
      // An empty sum: the gradient is zero (the header's contract), not left stale.
      ZAYA_CUDA_CHECK(cudaMemsetAsync(dW_g, 0, size_t(M_out * K) * c_es, st));
    }
    off += rows;
  }
}

}  // namespace zaya::cuda
