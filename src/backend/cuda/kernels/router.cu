// The MoE router's pointwise kernels and the expert dispatch of the CUDA backend
// (backend/cuda/ops.h): router_eda_fwd, router_select (+ backward), sort_by_expert, gather_rows,
// scatter_gate_rows (+ backward) and scatter_add_rows. Specification: model/zaya.cpp's
// moe_forward and model/backward.cpp's moe_bwd, cpu::router_select.
//
// router_select keeps cpu::router_select's decision rule: fp32 softmax (max, exp(l − max), sum,
// divide), choice = the first index of the largest p + bias (ties to the lowest index; class 0,
// like the reference, when class 0's value is NaN or no value compares greater than −inf). One warp
// per token; the per-lane sums are combined by a fixed butterfly, so probabilities differ from the
// reference only by rounding and decisions agree except on ties closer than that rounding.
//
// sort_by_expert is a stable counting sort in three kernels over tiles of 1024 tokens: per-tile
// class counts (shared-memory integer atomics: exact), one block turning them into class offsets
// and per-tile starting offsets (fixed serial order), and a scatter in which each token's rank
// within its tile and class comes from warp match/ballot masks and per-warp prefix counts. No
// token order depends on scheduling, so perm is the same on every run. Choices outside [0, E1)
// are left out (counts and perm then cover only the valid tokens).
//
// Dispatch rows are bf16 (the grouped GEMMs' operands) with fp32 gates; one warp per row with
// 4-wide accesses when D allows. Deliberately not here: top-k routing (ZAYA1 routes each token
// to one class) and capacity limits (the grouped GEMMs take any counts).
#include <cfloat>

#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

constexpr int kSortTile = 1024;  // tokens per sort block: 32 warps

template <int W>
__global__ void router_eda_kernel(float* r, const float* state, const float* scale, int64_t N,
                                  int64_t R) {
  const int64_t n = warp_row();
  if (n >= N) return;
  for (int64_t i = int64_t(lane_id()) * W; i < R; i += 32 * W) {
    float rv[W], sv[W], cv[W];
    load_w<W>(r + n * R + i, rv);
    load_w<W>(state + n * R + i, sv);
    load_w<W>(scale + i, cv);
#pragma unroll
    for (int j = 0; j < W; j++) rv[j] += sv[j] * cv[j];
    store_w<W>(r + n * R + i, rv);
  }
}

__global__ void router_select_kernel(float* probs, int32_t* choice, float* gate,
                                     const float* logits, const float* bias, int64_t N,
                                     int64_t E1) {
  const int64_t n = warp_row();
  if (n >= N) return;
  warp_router_select(probs + n * E1, choice + n, gate + n, logits + n * E1, bias, E1);
}

// dlogit_j = dgate · p_c · (δ_jc − p_j), c the chosen class.
__global__ void router_select_bwd_kernel(float* dlogits, const float* dgate, const float* probs,
                                         const int32_t* choice, int64_t N, int64_t E1) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int32_t c = choice[n];
  const float* p = probs + n * E1;
  const float w = dgate[n] * p[c];
  for (int64_t j = lane_id(); j < E1; j += 32) dlogits[n * E1 + j] = w * (float(j == c) - p[j]);
}

// ---- stable counting sort by class ----
__global__ void sort_tile_count_kernel(int32_t* tile_counts, const int32_t* choice, int64_t N,
                                       int64_t E1) {
  extern __shared__ int32_t cnt[];  // E1
  for (int64_t e = threadIdx.x; e < E1; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kSortTile + threadIdx.x;
  if (i < N) {
    const int32_t c = choice[i];
    if (c >= 0 && int64_t(c) < E1) atomicAdd(&cnt[c], 1);  // integer: exact in any order
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E1; e += blockDim.x)
    tile_counts[int64_t(blockIdx.x) * E1 + e] = cnt[e];
}

// One block: class totals, exclusive class offsets, and each tile's first slot per class.
__global__ void sort_offsets_kernel(int32_t* counts, int32_t* offsets, int32_t* tile_off,
                                    const int32_t* tile_counts, int64_t tiles, int64_t E1) {
  extern __shared__ int32_t sh[];  // tot[E1], off[E1]
  int32_t* tot = sh;
  int32_t* off = sh + E1;
  for (int64_t e = threadIdx.x; e < E1; e += blockDim.x) {
    int32_t t = 0;
    for (int64_t g = 0; g < tiles; g++) t += tile_counts[g * E1 + e];
    tot[e] = t;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int64_t e = 0; e < E1; e++) {
      off[e] = run;
      run += tot[e];
    }
    offsets[E1] = run;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E1; e += blockDim.x) {
    counts[e] = tot[e];
    offsets[e] = off[e];
    int32_t run = off[e];
    for (int64_t g = 0; g < tiles; g++) {
      tile_off[g * E1 + e] = run;
      run += tile_counts[g * E1 + e];
    }
  }
}

__global__ void __launch_bounds__(kSortTile)
    sort_scatter_kernel(int32_t* perm, const int32_t* choice, const int32_t* tile_off, int64_t N,
                        int64_t E1) {
  extern __shared__ int32_t wslot[];  // [32 warps][E1]: count, then first slot, per warp and class
  const int warp = int(threadIdx.x >> 5), lane = lane_id();
  for (int64_t k = threadIdx.x; k < 32 * E1; k += blockDim.x) wslot[k] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kSortTile + threadIdx.x;
  int32_t c = i < N ? choice[i] : -1;
  const bool valid = c >= 0 && int64_t(c) < E1;
  if (!valid) c = -1;
  const unsigned peers = __match_any_sync(0xffffffffu, c);
  const int rank = __popc(peers & ((1u << lane) - 1u));  // earlier lanes of the same class
  if (valid && rank == 0) wslot[warp * E1 + c] = __popc(peers);
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E1; e += blockDim.x) {
    int32_t run = tile_off[int64_t(blockIdx.x) * E1 + e];
    for (int w = 0; w < 32; w++) {
      const int32_t t = wslot[w * E1 + e];
      wslot[w * E1 + e] = run;
      run += t;
    }
  }
  __syncthreads();
  if (valid) perm[wslot[warp * E1 + c] + rank] = int32_t(i);
}

// ---- row movement ----
template <int W>
__global__ void gather_rows_kernel(bf16* xs, const bf16* x, const int32_t* perm, int64_t M,
                                   int64_t D) {
  const int64_t j = warp_row();
  if (j >= M) return;
  const int64_t n = perm[j];
  for (int64_t i = int64_t(lane_id()) * W; i < D; i += 32 * W) {
    float v[W];
    load_w<W>(x + n * D + i, v);  // bf16 → fp32 → bf16 is exact
    store_w<W>(xs + j * D + i, v);
  }
}

template <int W>
__global__ void scatter_gate_rows_kernel(bf16* out, const bf16* ys, const bf16* x,
                                         const float* gate, const int32_t* perm,
                                         const int32_t* choice, int64_t E, bool skip_scaled_input,
                                         int64_t N, int64_t M, int64_t D) {
  const int64_t j = warp_row();
  if (j >= N) return;
  const int64_t n = perm[j];
  const bool routed = choice[n] < E;
  const float g = gate[n];
  // Routed rows read their expert output; scaled-input skips their input; zero skips nothing.
  const bf16* src =
      routed ? (j < M ? ys + j * D : nullptr) : (skip_scaled_input ? x + n * D : nullptr);
  for (int64_t i = int64_t(lane_id()) * W; i < D; i += 32 * W) {
    float v[W];
    if (src) {
      load_w<W>(src + i, v);
#pragma unroll
      for (int k = 0; k < W; k++) v[k] *= g;
    } else {
#pragma unroll
      for (int k = 0; k < W; k++) v[k] = 0.f;
    }
    store_w<W>(out + n * D + i, v);
  }
}

template <int W>
__global__ void scatter_gate_rows_bwd_kernel(bf16* dys, float* dgate, float* dx_skip,
                                             const bf16* dout, const bf16* ys, const bf16* x,
                                             const float* gate, const int32_t* perm,
                                             const int32_t* choice, int64_t E,
                                             bool skip_scaled_input, int64_t N, int64_t M,
                                             int64_t D) {
  const int64_t j = warp_row();
  if (j >= N) return;
  const int lane = lane_id();
  const int64_t n = perm[j];
  const bool routed = choice[n] < E;
  const float g = gate[n];
  // As in the forward: a routed row sorted past M (inconsistent input) has no expert output.
  const bf16* y =
      routed ? (j < M ? ys + j * D : nullptr) : (skip_scaled_input ? x + n * D : nullptr);
  float dot = 0.f;
  if (y) {
    for (int64_t i = int64_t(lane) * W; i < D; i += 32 * W) {
      float d[W], yv[W];
      load_w<W>(dout + n * D + i, d);
      load_w<W>(y + i, yv);
#pragma unroll
      for (int k = 0; k < W; k++) dot += d[k] * yv[k];
      if (routed) {
#pragma unroll
        for (int k = 0; k < W; k++) d[k] *= g;
        store_w<W>(dys + j * D + i, d);
      } else if (dx_skip) {
        float o[W];
        load_w<W>(dx_skip + n * D + i, o);
#pragma unroll
        for (int k = 0; k < W; k++) o[k] += g * d[k];
        store_w<W>(dx_skip + n * D + i, o);
      }
    }
    dot = warp_sum(dot);
  }
  if (lane == 0) dgate[n] = dot;
}

template <int W>
__global__ void scatter_add_rows_kernel(float* dx, const bf16* dxs, const int32_t* perm, int64_t M,
                                        int64_t D) {
  const int64_t j = warp_row();
  if (j >= M) return;
  const int64_t n = perm[j];
  for (int64_t i = int64_t(lane_id()) * W; i < D; i += 32 * W) {
    float a[W], b[W];
    load_w<W>(dx + n * D + i, a);
    load_w<W>(dxs + j * D + i, b);
#pragma unroll
    for (int k = 0; k < W; k++) a[k] += b[k];
    store_w<W>(dx + n * D + i, a);
  }
}

constexpr unsigned kRowBlock = 32 * kRowWarps;

}  // namespace

void router_eda_fwd(float* r_NR, const float* state_NR, const float* scale_R, int64_t N, int64_t R,
                    cudaStream_t st) {
  if (!state_NR || !scale_R) return;  // layer 0: no previous state
  if (!check_sizes("router_eda_fwd", __LINE__, N, R)) return;
  if (vec4_ok(R, {r_NR, state_NR, scale_R}))
    router_eda_kernel<4><<<row_grid(N), kRowBlock, 0, st>>>(r_NR, state_NR, scale_R, N, R);
  else
    router_eda_kernel<1><<<row_grid(N), kRowBlock, 0, st>>>(r_NR, state_NR, scale_R, N, R);
  ZAYA_KERNEL_CHECK();
}

void router_select(float* probs_NE1, int32_t* choice_N, float* gate_N, const float* logits_NE1,
                   const float* balancing_bias_E1, int64_t N, int64_t E1, cudaStream_t st) {
  if (!check_sizes("router_select", __LINE__, N, E1)) return;
  router_select_kernel<<<row_grid(N), kRowBlock, 0, st>>>(probs_NE1, choice_N, gate_N, logits_NE1,
                                                          balancing_bias_E1, N, E1);
  ZAYA_KERNEL_CHECK();
}

void router_select_bwd(float* dlogits_NE1, const float* dgate_N, const float* probs_NE1,
                       const int32_t* choice_N, int64_t N, int64_t E1, cudaStream_t st) {
  if (!check_sizes("router_select_bwd", __LINE__, N, E1)) return;
  router_select_bwd_kernel<<<row_grid(N), kRowBlock, 0, st>>>(dlogits_NE1, dgate_N, probs_NE1,
                                                              choice_N, N, E1);
  ZAYA_KERNEL_CHECK();
}

size_t sort_by_expert_workspace_bytes(int64_t N, int64_t E1) {
  const int64_t tiles = ceil_div(N, kSortTile);
  return 2 * ws_piece(size_t(tiles) * size_t(E1) * sizeof(int32_t));
}

void sort_by_expert(int32_t* perm_N, int32_t* counts_E1, int32_t* offsets_E1p1,
                    int32_t* counts_host, const int32_t* choice_N, int64_t N, int64_t E1,
                    Workspace& ws, cudaStream_t st) {
  if (E1 <= 0) fail_arg("sort_by_expert", __LINE__, "needs at least one class");
  if (N < 0 || N > int64_t(INT32_MAX))
    fail_arg("sort_by_expert", __LINE__, "token count outside [0, 2^31)");
  const size_t scatter_smem = size_t(32 * E1) * sizeof(int32_t);
  if (scatter_smem > 48 * 1024)
    fail_arg("sort_by_expert", __LINE__, "too many classes for the shared-memory sort");
  if (N == 0) {
    ZAYA_CUDA_CHECK(cudaMemsetAsync(counts_E1, 0, size_t(E1) * sizeof(int32_t), st));
    ZAYA_CUDA_CHECK(cudaMemsetAsync(offsets_E1p1, 0, size_t(E1 + 1) * sizeof(int32_t), st));
  } else {
    const int64_t tiles = ceil_div(N, kSortTile);
    int32_t* tile_counts = ws.take_n<int32_t>(size_t(tiles * E1));
    int32_t* tile_off = ws.take_n<int32_t>(size_t(tiles * E1));
    sort_tile_count_kernel<<<unsigned(tiles), kSortTile, size_t(E1) * sizeof(int32_t), st>>>(
        tile_counts, choice_N, N, E1);
    ZAYA_KERNEL_CHECK();
    sort_offsets_kernel<<<1, 256, 2 * size_t(E1) * sizeof(int32_t), st>>>(
        counts_E1, offsets_E1p1, tile_off, tile_counts, tiles, E1);
    ZAYA_KERNEL_CHECK();
    sort_scatter_kernel<<<unsigned(tiles), kSortTile, scatter_smem, st>>>(perm_N, choice_N,
                                                                          tile_off, N, E1);
    ZAYA_KERNEL_CHECK();
  }
  // The grouped GEMMs size their launches from the counts on the host: copy and wait.
  ZAYA_CUDA_CHECK(cudaMemcpyAsync(counts_host, counts_E1, size_t(E1) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
}

void gather_rows(bf16* xs_MD, const bf16* x_ND, const int32_t* perm, int64_t M, int64_t D,
                 cudaStream_t st) {
  if (!check_sizes("gather_rows", __LINE__, M, D)) return;
  if (vec4_ok(D, {xs_MD, x_ND}))
    gather_rows_kernel<4><<<row_grid(M), kRowBlock, 0, st>>>(xs_MD, x_ND, perm, M, D);
  else
    gather_rows_kernel<1><<<row_grid(M), kRowBlock, 0, st>>>(xs_MD, x_ND, perm, M, D);
  ZAYA_KERNEL_CHECK();
}

void scatter_gate_rows(bf16* out_ND, const bf16* ys_MD, const bf16* x_ND, const float* gate_N,
                       const int32_t* perm, const int32_t* choice_N, int64_t E,
                       bool skip_scaled_input, int64_t N, int64_t M, int64_t D, cudaStream_t st) {
  if (!check_sizes("scatter_gate_rows", __LINE__, N, D)) return;
  if (vec4_ok(D, {out_ND, ys_MD, x_ND}))
    scatter_gate_rows_kernel<4><<<row_grid(N), kRowBlock, 0, st>>>(
        out_ND, ys_MD, x_ND, gate_N, perm, choice_N, E, skip_scaled_input, N, M, D);
  else
    scatter_gate_rows_kernel<1><<<row_grid(N), kRowBlock, 0, st>>>(
        out_ND, ys_MD, x_ND, gate_N, perm, choice_N, E, skip_scaled_input, N, M, D);
  ZAYA_KERNEL_CHECK();
}

void scatter_gate_rows_bwd(bf16* dys_MD, float* dgate_N, float* dx_skip_ND, const bf16* dout_ND,
                           const bf16* ys_MD, const bf16* x_ND, const float* gate_N,
                           const int32_t* perm, const int32_t* choice_N, int64_t E,
                           bool skip_scaled_input, int64_t N, int64_t M, int64_t D,
                           cudaStream_t st) {
  if (!check_sizes("scatter_gate_rows_bwd", __LINE__, N, D)) return;
  if (vec4_ok(D, {dys_MD, dx_skip_ND, dout_ND, ys_MD, x_ND}))
    scatter_gate_rows_bwd_kernel<4>
        <<<row_grid(N), kRowBlock, 0, st>>>(dys_MD, dgate_N, dx_skip_ND, dout_ND, ys_MD, x_ND,
                                            gate_N, perm, choice_N, E, skip_scaled_input, N, M, D);
  else
    scatter_gate_rows_bwd_kernel<1>
        <<<row_grid(N), kRowBlock, 0, st>>>(dys_MD, dgate_N, dx_skip_ND, dout_ND, ys_MD, x_ND,
                                            gate_N, perm, choice_N, E, skip_scaled_input, N, M, D);
  ZAYA_KERNEL_CHECK();
}

void scatter_add_rows(float* dx_ND, const bf16* dxs_MD, const int32_t* perm, int64_t M, int64_t D,
                      cudaStream_t st) {
  if (!check_sizes("scatter_add_rows", __LINE__, M, D)) return;
  if (vec4_ok(D, {dx_ND, dxs_MD}))
    scatter_add_rows_kernel<4><<<row_grid(M), kRowBlock, 0, st>>>(dx_ND, dxs_MD, perm, M, D);
  else
    scatter_add_rows_kernel<1><<<row_grid(M), kRowBlock, 0, st>>>(dx_ND, dxs_MD, perm, M, D);
  ZAYA_KERNEL_CHECK();
}

}  // namespace zaya::cuda
