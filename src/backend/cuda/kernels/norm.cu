// RMSNorm and ZAYA1's residual scaling on the GPU (backend/cuda/ops.h): rmsnorm_fwd (bf16 and
// fp32 outputs), rmsnorm_bwd (bf16 or fp32 dy), residual_scale_rmsnorm_fwd (the residual update
// fused with the next norm), residual_scale_bwd, and rmsnorm_residual_bwd (a norm's backward fused
// with the residual backward that consumes its dx). Specification: cpu::rmsnorm,
// cpu::rmsnorm_backward, cpu::residual_scale, cpu::residual_scale_backward.
//
// These kernels only move bytes (a few FLOPs per element), so the design goal is that every tensor
// is read once and written once, with enough 16-byte accesses in flight to saturate HBM.
//
// Row-block layout: a block of T threads (a multiple of 32, at most 256) works on RB rows at a
// time; thread t owns the column vectors j = t + k·T (k < V) of W elements (W = 4: float4 / 4×bf16
// accesses; W = 1 when D % 4 != 0 or a pointer is not 16-byte aligned), T·V·W >= D. All loads of
// an RB-row step are issued before any arithmetic, the rows stay in registers across the row
// statistic, and outputs are stored from registers: no tensor is read twice. Row sums (Σx², Σw·g·x)
// are added per thread over k and j in order, per warp by butterfly, and across warps in warp
// order through shared memory (one __syncthreads per step, double-buffered).
//
// Parameter gradients (dw, dhs, dhb, drs, drb) are column sums over tokens. Backward kernels run a
// fixed grid of row chunks whose size depends only on (N, T); each thread sums its own columns over
// its chunk's rows in row order, in registers, and writes one partial per chunk;
// kern::colreduce_finish_kernel then adds the partials in a fixed order. No float atomics, so the
// results are bit-reproducible for given (N, D, W). rmsnorm_bwd, residual_scale_bwd and their
// fusion share this code, grid and arithmetic (explicit _rn intrinsics, so no contraction choice
// can differ between instantiations): the fusion gives the same bits as the two separate calls
// when the pointers select the same W. The model relies on this (recompute on/off agree bit for bit
// although only the no-recompute schedule can fuse across layers).
//
// Rows wider than the layout holds (D > 4096 with W = 4, D > 1024 with W = 1) take the generic
// path: one warp per row, two passes over the row, kern::colreduce for the column sums. So do the
// residual backward with V = 4 (D > 2048 with W = 4, > 512 with W = 1: its sums would spill), and
// the fused backward there runs as the two separate passes. Not here:
// the norms of CCA (qk_norm lives with the CCA kernels) and decoding's single-row kernels
// (decode/decode.cu).
#include <type_traits>

#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

// ---- row-block layout ---------------------------------------------------------------------------

constexpr int kMaxRowThreads = 256;
constexpr int kMaxRowWarps = kMaxRowThreads / 32;

struct RowLayout {
  int W = 1, V = 0, T = 0;  // V == 0: too wide for the register layout (generic path)
  bool ok() const { return V > 0; }
};

RowLayout row_layout(int64_t D, bool vec4) {
  RowLayout L;
  L.W = vec4 ? 4 : 1;
  const int64_t nvec = ceil_div(D, L.W);
  for (int v : {1, 2, 4}) {
    if (nvec <= int64_t(v) * kMaxRowThreads) {
      L.V = v;
      L.T = int(ceil_div(ceil_div(nvec, v), 32) * 32);
      return L;
    }
  }
  return L;
}

// Rows per step: about four column vectors per thread and tensor in flight.
constexpr int fwd_rows(int V) {
  return V >= 4 ? 1 : 4 / V;
}
// The fused backward keeps five tensors and five column sums per vector: fewer rows per step.
constexpr int fused_rows(int V) {
  return V >= 2 ? 1 : 2;
}

// Forward grids: a few steps per block for large N, one step per block for small N (prefill).
int64_t fwd_rows_per_block(int64_t N, int RB) {
  int64_t steps = ceil_div(N, int64_t(RB) * 1024);
  if (steps < 1) steps = 1;
  if (steps > 4) steps = 4;
  return steps * RB;
}

// Backward grids: a fixed number of row chunks per (N, T), about 64K threads in all (two 256-thread
// blocks per SM of an H200), so the partials stay few (chunks·K·D floats, L2-resident).
struct ChunkGrid {
  int64_t rows = 1, chunks = 0;
};
ChunkGrid chunk_grid(int64_t N, int T) {
  ChunkGrid g;
  const int64_t max_chunks = 65536 / T;
  g.rows = ceil_div(N, max_chunks);
  if (g.rows < 1) g.rows = 1;
  g.chunks = ceil_div(N, g.rows);
  return g;
}

// Workspace for K column sums, whichever path (row-block layout with W = 4 or 1, or generic) runs.
size_t bwd_workspace_bytes(int64_t N, int64_t D, int K) {
  size_t b = colreduce_workspace_bytes(N, D, K);
  for (bool vec4 : {false, true}) {
    if (vec4 && D % 4 != 0) continue;
    const RowLayout L = row_layout(D, vec4);
    if (!L.ok()) continue;
    const ChunkGrid g = chunk_grid(N, L.T);
    const size_t r = ws_piece(size_t(g.chunks) * size_t(K) * size_t(D) * sizeof(float));
    if (r > b) b = r;
  }
  return b;
}

template <int X>
using IntC = std::integral_constant<int, X>;

// Calls f(IntC<W>, IntC<V>) for the layout's W and V.
template <class F>
void with_layout(const RowLayout& L, F&& f) {
  if (L.W == 4) {
    if (L.V == 1)
      f(IntC<4>{}, IntC<1>{});
    else if (L.V == 2)
      f(IntC<4>{}, IntC<2>{});
    else
      f(IntC<4>{}, IntC<4>{});
  } else {
    if (L.V == 1)
      f(IntC<1>{}, IntC<1>{});
    else if (L.V == 2)
      f(IntC<1>{}, IntC<2>{});
    else
      f(IntC<1>{}, IntC<4>{});
  }
}

// The first column of the calling thread's k-th vector.
template <int W>
__device__ __forceinline__ int64_t own_col(int k) {
  return (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * W;
}

template <int W>
__device__ __forceinline__ void zero_w(float (&v)[W]) {
#pragma unroll
  for (int j = 0; j < W; j++) v[j] = 0.f;
}

// Row sums of an RB-row step across the block: every thread returns the same, order-fixed sums.
// red is double-buffered by `parity`, so one barrier per step suffices: a buffer is rewritten two
// steps later, after every thread has passed the barrier of the step in between.
template <int RB>
__device__ __forceinline__ void block_row_sums(float (&s)[RB], float (&red)[2][RB][kMaxRowWarps],
                                               int& parity) {
  const int warp = int(threadIdx.x >> 5), nwarps = int(blockDim.x >> 5);
#pragma unroll
  for (int r = 0; r < RB; r++) s[r] = warp_sum(s[r]);
  if (lane_id() == 0) {
#pragma unroll
    for (int r = 0; r < RB; r++) red[parity][r][warp] = s[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < RB; r++) {
    float t = red[parity][r][0];
    for (int i = 1; i < nwarps; i++) t += red[parity][r][i];
    s[r] = t;
  }
  parity ^= 1;
}

// The normalised rows of a step: rstd = 1/sqrt(ss/D + eps) (row sums already block-reduced),
// stored by thread 0 when rstd is non-null, and y = w ⊙ v · rstd over each thread's columns.
template <int W, int V, int RB, typename TY>
__device__ __forceinline__ void store_normalised_rows(TY* y, float* rstd, const float* w,
                                                      const float (&v)[RB][V][W],
                                                      const float (&ss)[RB], int64_t n0,
                                                      int64_t n_end, int64_t D, float eps) {
#pragma unroll
  for (int r = 0; r < RB; r++) {
    const int64_t n = n0 + r;
    if (n >= n_end) break;
    const float rr = 1.0f / sqrtf(ss[r] / float(D) + eps);
    if (threadIdx.x == 0 && rstd) rstd[n] = rr;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const int64_t c = own_col<W>(k);
      if (c >= D) continue;
      float wv[W], o[W];
      load_w<W>(w + c, wv);
#pragma unroll
      for (int j = 0; j < W; j++) o[j] = __fmul_rn(wv[j], __fmul_rn(v[r][k][j], rr));
      store_w<W>(y + n * D + c, o);
    }
  }
}

// ---- forward (row-block layout) -----------------------------------------------------------------

template <int W, int V, int RB, typename TY>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_fwd_rows_kernel(TY* y, float* rstd, const float* x, const float* w, float eps,
                            int64_t N, int64_t D, int64_t rpb) {
  __shared__ float red[2][RB][kMaxRowWarps];
  int parity = 0;
  const int64_t n_begin = int64_t(blockIdx.x) * rpb;
  const int64_t n_end = n_begin + rpb < N ? n_begin + rpb : N;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += RB) {
    float v[RB][V][W];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int k = 0; k < V; k++) {
        const int64_t c = own_col<W>(k);
        if (n0 + r < n_end && c < D)
          load_w<W>(x + (n0 + r) * D + c, v[r][k]);
        else
          zero_w<W>(v[r][k]);
      }
    float ss[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) {
      ss[r] = 0.f;
#pragma unroll
      for (int k = 0; k < V; k++)
#pragma unroll
        for (int j = 0; j < W; j++) ss[r] = __fmaf_rn(v[r][k][j], v[r][k][j], ss[r]);
    }
    block_row_sums<RB>(ss, red, parity);
    store_normalised_rows<W, V, RB>(y, rstd, w, v, ss, n0, n_end, D, eps);
  }
}

// h_out = (a + hb) ⊙ hs + (h + rb) ⊙ rs, then y = norm_w ⊙ h_out · rstd when y is non-null.
// h_out may alias h: a step loads all its elements before it stores any, and each element is
// loaded and stored by the same thread.
template <int W, int V, int RB>
__global__ void __launch_bounds__(kMaxRowThreads)
    residual_scale_rmsnorm_rows_kernel(float* h_out, bf16* y, float* rstd, const bf16* a,
                                       const float* h, const float* hs, const float* hb,
                                       const float* rs, const float* rb, const float* norm_w,
                                       float eps, int64_t N, int64_t D, int64_t rpb) {
  __shared__ float red[2][RB][kMaxRowWarps];
  int parity = 0;
  const int64_t n_begin = int64_t(blockIdx.x) * rpb;
  const int64_t n_end = n_begin + rpb < N ? n_begin + rpb : N;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += RB) {
    float av[RB][V][W], o[RB][V][W];  // o holds h until it is overwritten with h_out
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int k = 0; k < V; k++) {
        const int64_t c = own_col<W>(k);
        if (n0 + r < n_end && c < D) {
          load_w<W>(a + (n0 + r) * D + c, av[r][k]);
          load_w<W>(h + (n0 + r) * D + c, o[r][k]);
        } else {
          zero_w<W>(av[r][k]);
          zero_w<W>(o[r][k]);
        }
      }
    float ss[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) {
      ss[r] = 0.f;
      const int64_t n = n0 + r;
#pragma unroll
      for (int k = 0; k < V; k++) {
        const int64_t c = own_col<W>(k);
        if (n >= n_end || c >= D) continue;
        float hsv[W], hbv[W], rsv[W], rbv[W];
        load_w<W>(hs + c, hsv);
        load_w<W>(hb + c, hbv);
        load_w<W>(rs + c, rsv);
        load_w<W>(rb + c, rbv);
#pragma unroll
        for (int j = 0; j < W; j++) {
          const float t = __fmul_rn(__fadd_rn(o[r][k][j], rbv[j]), rsv[j]);
          o[r][k][j] = __fmaf_rn(__fadd_rn(av[r][k][j], hbv[j]), hsv[j], t);
          ss[r] = __fmaf_rn(o[r][k][j], o[r][k][j], ss[r]);
        }
        store_w<W>(h_out + n * D + c, o[r][k]);
      }
    }
    if (!y) continue;  // uniform across the grid
    block_row_sums<RB>(ss, red, parity);
    store_normalised_rows<W, V, RB>(y, rstd, norm_w, o, ss, n0, n_end, D, eps);
  }
}

// ---- backward (row-block layout) ----------------------------------------------------------------

// One kernel for the three backward ops. NORM: d = r·w·dy − c·x with c = r³/D · Σ w·dy·x
// (cpu::rmsnorm_backward's formula and order), g = acc + d (acc null: g = d), dw partial Σ dy·x·r;
// without RES, g is stored to dx (when non-null). RES: from g (NORM) or dout (RES only):
// da = g·hs (bf16), dh = g·rs, partials Σ g·(a+hb), Σ g·hs, Σ g·(h+rb), Σ g·rs. Every output
// element is stored by the thread that loaded that element's inputs, after the step's loads, so dx
// may alias dy or acc, and dh may alias acc, dout or h.
template <typename TG>
struct BwdArgs {
  const TG* dy;
  const float* x;
  const float* w;
  const float* rstd;
  const float* acc;
  float* dx;
  const float* dout;
  const bf16* a;
  const float* h;
  const float *hs, *hb, *rs, *rb;
  bf16* da;
  float* dh;
  float* part;  // [chunks][K][D] column-sum partials; null: not wanted
};

template <int W, int V, int RB, bool NORM, bool RES, typename TG>
__global__ void __launch_bounds__(kMaxRowThreads, 2)
    norm_bwd_rows_kernel(BwdArgs<TG> p, int64_t N, int64_t D, int64_t rpc) {
  constexpr int K = (NORM ? 1 : 0) + (RES ? 4 : 0);
  constexpr int KR = NORM ? 1 : 0;  // index of the first residual sum
  __shared__ float red[2][RB][kMaxRowWarps];
  float cs[K][V][W];
#pragma unroll
  for (int q = 0; q < K; q++)
#pragma unroll
    for (int k = 0; k < V; k++) zero_w<W>(cs[q][k]);
  [[maybe_unused]] float wv[V][W];
  if constexpr (NORM) {
#pragma unroll
    for (int k = 0; k < V; k++) {
      const int64_t c = own_col<W>(k);
      if (c < D)
        load_w<W>(p.w + c, wv[k]);
      else
        zero_w<W>(wv[k]);
    }
  }
  int parity = 0;
  const int64_t n_begin = int64_t(blockIdx.x) * rpc;
  const int64_t n_end = n_begin + rpc < N ? n_begin + rpc : N;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += RB) {
    // Loads of the whole step first (dy, x, acc / dout, a, h).
    float g[RB][V][W];  // dy (NORM) or dout (RES only); becomes the gradient g
    [[maybe_unused]] float xv[RB][V][W], accv[RB][V][W], av[RB][V][W], hv[RB][V][W];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
      for (int k = 0; k < V; k++) {
        const int64_t c = own_col<W>(k);
        const bool ok = n0 + r < n_end && c < D;
        const int64_t e = (n0 + r) * D + c;
        if constexpr (NORM) {
          if (ok) {
            load_w<W>(p.dy + e, g[r][k]);
            load_w<W>(p.x + e, xv[r][k]);
          } else {
            zero_w<W>(g[r][k]);
            zero_w<W>(xv[r][k]);
          }
          if (ok && p.acc)
            load_w<W>(p.acc + e, accv[r][k]);
          else
            zero_w<W>(accv[r][k]);
        } else {
          if (ok)
            load_w<W>(p.dout + e, g[r][k]);
          else
            zero_w<W>(g[r][k]);
        }
        if constexpr (RES) {
          if (ok) {
            load_w<W>(p.a + e, av[r][k]);
            load_w<W>(p.h + e, hv[r][k]);
          } else {
            zero_w<W>(av[r][k]);
            zero_w<W>(hv[r][k]);
          }
        }
      }
    if constexpr (NORM) {
      float s[RB];
#pragma unroll
      for (int r = 0; r < RB; r++) {
        s[r] = 0.f;
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
          for (int j = 0; j < W; j++)
            s[r] = __fmaf_rn(__fmul_rn(wv[k][j], g[r][k][j]), xv[r][k][j], s[r]);
      }
      block_row_sums<RB>(s, red, parity);
#pragma unroll
      for (int r = 0; r < RB; r++) {
        const int64_t n = n0 + r;
        if (n >= n_end) break;
        const float rr = p.rstd[n];
        const float cc = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(s[r], rr), rr), rr), float(D));
#pragma unroll
        for (int k = 0; k < V; k++) {
          if (own_col<W>(k) >= D) continue;
#pragma unroll
          for (int j = 0; j < W; j++) {
            const float gy = g[r][k][j], xx = xv[r][k][j];
            cs[0][k][j] = __fmaf_rn(__fmul_rn(gy, xx), rr, cs[0][k][j]);
            const float d = __fmaf_rn(-cc, xx, __fmul_rn(__fmul_rn(rr, wv[k][j]), gy));
            g[r][k][j] = p.acc ? __fadd_rn(accv[r][k][j], d) : d;
          }
          if constexpr (!RES) {
            if (p.dx) store_w<W>(p.dx + n * D + own_col<W>(k), g[r][k]);
          }
        }
      }
    }
    if constexpr (RES) {
#pragma unroll
      for (int r = 0; r < RB; r++) {
        const int64_t n = n0 + r;
        if (n >= n_end) break;
#pragma unroll
        for (int k = 0; k < V; k++) {
          const int64_t c = own_col<W>(k);
          if (c >= D) continue;
          float hsv[W], hbv[W], rsv[W], rbv[W], dav[W], dhv[W];
          load_w<W>(p.hs + c, hsv);
          load_w<W>(p.hb + c, hbv);
          load_w<W>(p.rs + c, rsv);
          load_w<W>(p.rb + c, rbv);
#pragma unroll
          for (int j = 0; j < W; j++) {
            const float gg = g[r][k][j];
            cs[KR + 0][k][j] = __fmaf_rn(gg, __fadd_rn(av[r][k][j], hbv[j]), cs[KR + 0][k][j]);
            cs[KR + 1][k][j] = __fmaf_rn(gg, hsv[j], cs[KR + 1][k][j]);
            cs[KR + 2][k][j] = __fmaf_rn(gg, __fadd_rn(hv[r][k][j], rbv[j]), cs[KR + 2][k][j]);
            cs[KR + 3][k][j] = __fmaf_rn(gg, rsv[j], cs[KR + 3][k][j]);
            dav[j] = __fmul_rn(gg, hsv[j]);
            dhv[j] = __fmul_rn(gg, rsv[j]);
          }
          store_w<W>(p.da + n * D + c, dav);
          store_w<W>(p.dh + n * D + c, dhv);
        }
      }
    }
  }
  if (!p.part) return;
#pragma unroll
  for (int q = 0; q < K; q++)
#pragma unroll
    for (int k = 0; k < V; k++) {
      const int64_t c = own_col<W>(k);
      if (c < D) store_w<W>(p.part + (int64_t(blockIdx.x) * K + q) * D + c, cs[q][k]);
    }
}

template <int W, int V, int RB, bool NORM, bool RES, typename TG>
void launch_bwd_rows(const BwdArgs<TG>& p, OutPtrs<(NORM ? 1 : 0) + (RES ? 4 : 0)> out, int T,
                     int64_t N, int64_t D, cudaStream_t st) {
  constexpr int K = (NORM ? 1 : 0) + (RES ? 4 : 0);
  const ChunkGrid g = chunk_grid(N, T);
  norm_bwd_rows_kernel<W, V, RB, NORM, RES, TG>
      <<<unsigned(g.chunks), unsigned(T), 0, st>>>(p, N, D, g.rows);
  ZAYA_KERNEL_CHECK();
  if (!p.part) return;
  colreduce_finish_kernel<K><<<dim3(unsigned(ceil_div(D, 32)), unsigned(K)), dim3(32, 8), 0, st>>>(
      out, p.part, g.chunks, D);
  ZAYA_KERNEL_CHECK();
}

// ---- generic path (rows wider than the row-block layout) ----------------------------------------

template <int W, typename TY>
__global__ void rmsnorm_fwd_wide_kernel(TY* y, float* rstd, const float* x, const float* w,
                                        float eps, int64_t N, int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;  // whole warp leaves together: n is uniform across the warp
  const int lane = lane_id();
  const float* xr = x + n * D;
  float ss = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W];
    load_w<W>(xr + i, v);
#pragma unroll
    for (int j = 0; j < W; j++) ss += v[j] * v[j];
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(D) + eps);
  if (lane == 0 && rstd) rstd[n] = r;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W], wv[W], o[W];
    load_w<W>(xr + i, v);
    load_w<W>(w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = wv[j] * (v[j] * r);
    store_w<W>(y + n * D + i, o);
  }
}

// dx = acc + r·w·g − c·x (acc null: no addition); acc may alias dx.
template <int W, typename TG>
__global__ void rmsnorm_bwd_dx_wide_kernel(float* dx, const TG* dy, const float* x, const float* w,
                                           const float* rstd, const float* acc, int64_t N,
                                           int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int lane = lane_id();
  const float* xr = x + n * D;
  const TG* gr = dy + n * D;
  float s = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float xv[W], gv[W], wv[W];
    load_w<W>(xr + i, xv);
    load_w<W>(gr + i, gv);
    load_w<W>(w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) s += wv[j] * gv[j] * xv[j];
  }
  s = warp_sum(s);
  const float r = rstd[n];
  const float c = s * r * r * r / float(D);
  float* dxr = dx + n * D;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float xv[W], gv[W], wv[W], o[W];
    load_w<W>(xr + i, xv);
    load_w<W>(gr + i, gv);
    load_w<W>(w + i, wv);
    if (acc) load_w<W>(acc + n * D + i, o);
#pragma unroll
    for (int j = 0; j < W; j++) {
      const float d = r * wv[j] * gv[j] - c * xv[j];
      o[j] = acc ? o[j] + d : d;
    }
    store_w<W>(dxr + i, o);
  }
}

// dw[c] += Σ_n dy[n,c]·x[n,c]·rstd[n]
template <typename TG>
struct RmsNormDw {
  const TG* dy;
  const float* x;
  const float* rstd;
  int64_t D;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[1]) const {
    const int64_t j = n * D + c;
    v[0] = to_f(dy[j]) * x[j] * rstd[n];
  }
};

template <int W>
__global__ void residual_scale_rmsnorm_wide_kernel(float* h_out, bf16* y, float* rstd,
                                                   const bf16* a, const float* h, const float* hs,
                                                   const float* hb, const float* rs,
                                                   const float* rb, const float* norm_w, float eps,
                                                   int64_t N, int64_t D) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int lane = lane_id();
  const int64_t base = n * D;
  float ss = 0.f;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float av[W], hv[W], hsv[W], hbv[W], rsv[W], rbv[W], o[W];
    load_w<W>(a + base + i, av);
    load_w<W>(h + base + i, hv);
    load_w<W>(hs + i, hsv);
    load_w<W>(hb + i, hbv);
    load_w<W>(rs + i, rsv);
    load_w<W>(rb + i, rbv);
#pragma unroll
    for (int j = 0; j < W; j++) {
      o[j] = (av[j] + hbv[j]) * hsv[j] + (hv[j] + rbv[j]) * rsv[j];
      ss += o[j] * o[j];
    }
    store_w<W>(h_out + base + i, o);
  }
  if (!y) return;  // uniform across the grid
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(D) + eps);
  if (lane == 0 && rstd) rstd[n] = r;
  for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
    float v[W], wv[W], o[W];
    load_w<W>(h_out + base + i, v);
    load_w<W>(norm_w + i, wv);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = wv[j] * (v[j] * r);
    store_w<W>(y + base + i, o);
  }
}

// One pass over dout: the elementwise da, dh and the four column sums.
struct ResidualScaleBwd {
  bf16* da;
  float* dh;
  const float* dout;
  const bf16* a;
  const float* h;
  const float *hs, *hb, *rs, *rb;
  int64_t D;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[4]) const {
    const int64_t j = n * D + c;
    const float g = dout[j], av = to_f(a[j]), hv = h[j];  // read all before writing (aliasing)
    v[0] = g * (av + hb[c]);
    v[1] = g * hs[c];
    v[2] = g * (hv + rb[c]);
    v[3] = g * rs[c];
    da[j] = __float2bfloat16_rn(g * hs[c]);
    dh[j] = g * rs[c];
  }
};

// ---- launchers ----------------------------------------------------------------------------------

template <typename TY>
void launch_rmsnorm_fwd(TY* y, float* rstd, const float* x, const float* w, float eps, int64_t N,
                        int64_t D, cudaStream_t st) {
  if (!check_sizes("rmsnorm_fwd", __LINE__, N, D)) return;
  const bool vec4 = vec4_ok(D, {y, x, w});
  const RowLayout L = row_layout(D, vec4);
  if (L.ok()) {
    with_layout(L, [&](auto wc, auto vc) {
      constexpr int W = decltype(wc)::value, V = decltype(vc)::value, RB = fwd_rows(V);
      const int64_t rpb = fwd_rows_per_block(N, RB);
      rmsnorm_fwd_rows_kernel<W, V, RB, TY>
          <<<unsigned(ceil_div(N, rpb)), unsigned(L.T), 0, st>>>(y, rstd, x, w, eps, N, D, rpb);
    });
  } else {
    const unsigned grid = row_grid(N), block = 32 * kRowWarps;
    if (vec4)
      rmsnorm_fwd_wide_kernel<4, TY><<<grid, block, 0, st>>>(y, rstd, x, w, eps, N, D);
    else
      rmsnorm_fwd_wide_kernel<1, TY><<<grid, block, 0, st>>>(y, rstd, x, w, eps, N, D);
  }
  ZAYA_KERNEL_CHECK();
}

// dx = (acc or 0) + the norm's input gradient (dx may be null: dw only), dw += (when non-null).
template <typename TG>
void launch_rmsnorm_bwd(float* dx, float* dw, const TG* dy, const float* x, const float* w,
                        const float* rstd, const float* acc, int64_t N, int64_t D, Workspace& ws,
                        cudaStream_t st) {
  if (!check_sizes("rmsnorm_bwd", __LINE__, N, D)) return;
  const bool vec4 = vec4_ok(D, {dx, dy, x, w, acc});
  const RowLayout L = row_layout(D, vec4);
  if (L.ok()) {
    BwdArgs<TG> p{};
    p.dy = dy;
    p.x = x;
    p.w = w;
    p.rstd = rstd;
    p.acc = acc;
    p.dx = dx;
    if (dw) p.part = ws.take_n<float>(size_t(chunk_grid(N, L.T).chunks) * size_t(D));
    with_layout(L, [&](auto wc, auto vc) {
      constexpr int W = decltype(wc)::value, V = decltype(vc)::value, RB = fwd_rows(V);
      launch_bwd_rows<W, V, RB, true, false, TG>(p, OutPtrs<1>{{dw}}, L.T, N, D, st);
    });
    return;
  }
  // dw first: it reads dy before dx is written, so dx may alias dy.
  if (dw) colreduce<1>(OutPtrs<1>{{dw}}, RmsNormDw<TG>{dy, x, rstd, D}, N, D, ws, st);
  if (!dx) return;
  const unsigned grid = row_grid(N), block = 32 * kRowWarps;
  if (vec4)
    rmsnorm_bwd_dx_wide_kernel<4, TG><<<grid, block, 0, st>>>(dx, dy, x, w, rstd, acc, N, D);
  else
    rmsnorm_bwd_dx_wide_kernel<1, TG><<<grid, block, 0, st>>>(dx, dy, x, w, rstd, acc, N, D);
  ZAYA_KERNEL_CHECK();
}

void launch_residual_scale_bwd(bf16* da, float* dh, float* dhs, float* dhb, float* drs, float* drb,
                               const float* dout, const bf16* a, const float* h, const float* hs,
                               const float* hb, const float* rs, const float* rb, int64_t N,
                               int64_t D, Workspace& ws, cudaStream_t st) {
  const OutPtrs<4> out{{dhs, dhb, drs, drb}};
  const RowLayout L = row_layout(D, vec4_ok(D, {da, dh, dout, a, h, hs, hb, rs, rb}));
  if (L.ok() && L.V <= 2) {  // V = 4 would spill (four sums per column in registers)
    BwdArgs<float> p{};
    p.dout = dout;
    p.a = a;
    p.h = h;
    p.hs = hs;
    p.hb = hb;
    p.rs = rs;
    p.rb = rb;
    p.da = da;
    p.dh = dh;
    p.part = ws.take_n<float>(size_t(chunk_grid(N, L.T).chunks) * 4 * size_t(D));
    with_layout(L, [&](auto wc, auto vc) {
      constexpr int W = decltype(wc)::value, V = decltype(vc)::value, RB = fwd_rows(V);
      if constexpr (V <= 2) launch_bwd_rows<W, V, RB, false, true, float>(p, out, L.T, N, D, st);
    });
    return;
  }
  colreduce<4>(out, ResidualScaleBwd{da, dh, dout, a, h, hs, hb, rs, rb, D}, N, D, ws, st);
}

}  // namespace

void rmsnorm_fwd(bf16* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                 int64_t N, int64_t D, cudaStream_t st) {
  launch_rmsnorm_fwd<bf16>(y_ND, rstd_N, x_ND, w_D, eps, N, D, st);
}

void rmsnorm_fwd_f32(float* y_ND, float* rstd_N, const float* x_ND, const float* w_D, float eps,
                     int64_t N, int64_t D, cudaStream_t st) {
  launch_rmsnorm_fwd<float>(y_ND, rstd_N, x_ND, w_D, eps, N, D, st);
}

size_t rmsnorm_bwd_workspace_bytes(int64_t N, int64_t D) {
  return bwd_workspace_bytes(N, D, 1);
}

void rmsnorm_bwd(float* dx_ND, float* dw_D, const bf16* dy_ND, const float* x_ND, const float* w_D,
                 const float* rstd_N, bool accumulate, int64_t N, int64_t D, Workspace& ws,
                 cudaStream_t st) {
  launch_rmsnorm_bwd<bf16>(dx_ND, dw_D, dy_ND, x_ND, w_D, rstd_N,
                           accumulate && dx_ND ? dx_ND : nullptr, N, D, ws, st);
}

void rmsnorm_bwd_f32(float* dx_ND, float* dw_D, const float* dy_ND, const float* x_ND,
                     const float* w_D, const float* rstd_N, bool accumulate, int64_t N, int64_t D,
                     Workspace& ws, cudaStream_t st) {
  launch_rmsnorm_bwd<float>(dx_ND, dw_D, dy_ND, x_ND, w_D, rstd_N,
                            accumulate && dx_ND ? dx_ND : nullptr, N, D, ws, st);
}

void residual_scale_rmsnorm_fwd(float* h_out_ND, bf16* y_ND, float* rstd_N, const bf16* a_ND,
                                const float* h_ND, const float* hs_D, const float* hb_D,
                                const float* rs_D, const float* rb_D, const float* norm_w_D,
                                float eps, int64_t N, int64_t D, cudaStream_t st) {
  if (!check_sizes("residual_scale_rmsnorm_fwd", __LINE__, N, D)) return;
  if (y_ND && !norm_w_D)
    fail_arg("residual_scale_rmsnorm_fwd", __LINE__, "a norm output needs norm_w (null)");
  const bool vec4 = vec4_ok(D, {h_out_ND, y_ND, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D});
  const RowLayout L = row_layout(D, vec4);
  if (L.ok()) {
    with_layout(L, [&](auto wc, auto vc) {
      constexpr int W = decltype(wc)::value, V = decltype(vc)::value, RB = fwd_rows(V);
      const int64_t rpb = fwd_rows_per_block(N, RB);
      residual_scale_rmsnorm_rows_kernel<W, V, RB>
          <<<unsigned(ceil_div(N, rpb)), unsigned(L.T), 0, st>>>(
              h_out_ND, y_ND, rstd_N, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D, eps, N, D, rpb);
    });
  } else {
    const unsigned grid = row_grid(N), block = 32 * kRowWarps;
    if (vec4)
      residual_scale_rmsnorm_wide_kernel<4><<<grid, block, 0, st>>>(
          h_out_ND, y_ND, rstd_N, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D, eps, N, D);
    else
      residual_scale_rmsnorm_wide_kernel<1><<<grid, block, 0, st>>>(
          h_out_ND, y_ND, rstd_N, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D, norm_w_D, eps, N, D);
  }
  ZAYA_KERNEL_CHECK();
}

size_t residual_scale_bwd_workspace_bytes(int64_t N, int64_t D) {
  return bwd_workspace_bytes(N, D, 4);
}

void residual_scale_bwd(bf16* da_ND, float* dh_ND, float* dhs_D, float* dhb_D, float* drs_D,
                        float* drb_D, const float* dout_ND, const bf16* a_ND, const float* h_ND,
                        const float* hs_D, const float* hb_D, const float* rs_D, const float* rb_D,
                        int64_t N, int64_t D, Workspace& ws, cudaStream_t st) {
  if (!check_sizes("residual_scale_bwd", __LINE__, N, D)) return;
  launch_residual_scale_bwd(da_ND, dh_ND, dhs_D, dhb_D, drs_D, drb_D, dout_ND, a_ND, h_ND, hs_D,
                            hb_D, rs_D, rb_D, N, D, ws, st);
}

size_t rmsnorm_residual_bwd_workspace_bytes(int64_t N, int64_t D) {
  const size_t fused = bwd_workspace_bytes(N, D, 5);
  const size_t split = bwd_workspace_bytes(N, D, 1) + bwd_workspace_bytes(N, D, 4);
  return fused > split ? fused : split;
}

void rmsnorm_residual_bwd(bf16* da_ND, float* dh_ND, float* dw_D, float* dhs_D, float* dhb_D,
                          float* drs_D, float* drb_D, const float* dy_ND, const float* x_ND,
                          const float* w_D, const float* rstd_N, const float* acc_ND,
                          const bf16* a_ND, const float* h_ND, const float* hs_D, const float* hb_D,
                          const float* rs_D, const float* rb_D, int64_t N, int64_t D, Workspace& ws,
                          cudaStream_t st) {
  if (!check_sizes("rmsnorm_residual_bwd", __LINE__, N, D)) return;
  const RowLayout L = row_layout(
      D, vec4_ok(D, {da_ND, dh_ND, dy_ND, x_ND, w_D, acc_ND, a_ND, h_ND, hs_D, hb_D, rs_D, rb_D}));
  if (L.ok() && L.V <= 2) {
    BwdArgs<float> p{};
    p.dy = dy_ND;
    p.x = x_ND;
    p.w = w_D;
    p.rstd = rstd_N;
    p.acc = acc_ND;
    p.a = a_ND;
    p.h = h_ND;
    p.hs = hs_D;
    p.hb = hb_D;
    p.rs = rs_D;
    p.rb = rb_D;
    p.da = da_ND;
    p.dh = dh_ND;
    p.part = ws.take_n<float>(size_t(chunk_grid(N, L.T).chunks) * 5 * size_t(D));
    const OutPtrs<5> out{{dw_D, dhs_D, dhb_D, drs_D, drb_D}};
    with_layout(L, [&](auto wc, auto vc) {
      constexpr int W = decltype(wc)::value, V = decltype(vc)::value;
      if constexpr (V <= 2)
        launch_bwd_rows<W, V, fused_rows(V), true, true, float>(p, out, L.T, N, D, st);
    });
    return;
  }
  // Wide rows: rmsnorm_bwd_f32 into dh, then residual_scale_bwd from dh in place (dout = dh).
  launch_rmsnorm_bwd<float>(dh_ND, dw_D, dy_ND, x_ND, w_D, rstd_N, acc_ND, N, D, ws, st);
  launch_residual_scale_bwd(da_ND, dh_ND, dhs_D, dhb_D, drs_D, drb_D, dh_ND, a_ND, h_ND, hs_D, hb_D,
                            rs_D, rb_D, N, D, ws, st);
}

}  // namespace zaya::cuda
