// Context parallelism's data movement on the GPU (backend/cuda/ops.h: cp_pack_tails,
// cp_add_tail_grads, cp_split_halos, cp_pack_halo_grads, cp_ranks_to_sequence,
// cp_sequence_to_ranks): the halo rows a rank sends to the rank of the next chunk and their
// gradients on the way back, and the reordering between a cp group's rank blocks (two chunks per
// rank, slot-major) and whole-sequence rows for the keys and values. The specification is the CPU
// reference's copies in model/backward.cpp (cp_send_tails, cp_chunk_rows and their callers).
//
// All of it is copying with at most one add per element: plain one-element-per-thread kernels over
// grid-stride loops. The halos are a few rows of a few thousand floats; the key/value reorders
// touch B·S·Hkv·d elements once per layer, next to attention that reads them S/64 times.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"

namespace zaya::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return unsigned(b);
}

__device__ __forceinline__ float f(bf16 x) {
  return __bfloat162float(x);
}

// Element e of row r's tail in the qkv rows: token S−P+e/C, channel e%C for e < P·C (q0|k0), then
// the last token's vd channels.
__device__ __forceinline__ int64_t tail_offset(int64_t r, int64_t e, int64_t ld, int64_t S,
                                               int64_t P, int64_t C, int64_t VH) {
  const int64_t tok = e < P * C ? r * S + S - P + e / C : r * S + S - 1;
  const int64_t ch = e < P * C ? e % C : C + VH + (e - P * C);
  return tok * ld + ch;
}

__global__ void pack_tails_kernel(float* tails, const bf16* qkv, int64_t ld, int64_t R, int64_t S,
                                  int64_t P, int64_t C, int64_t VH) {
  const int64_t T = P * C + VH, n = R * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    tails[i] = f(qkv[tail_offset(i / T, i % T, ld, S, P, C, VH)]);
}

__global__ void add_tail_grads_kernel(bf16* dqkv, int64_t ld, const float* dtails, int64_t R,
                                      int64_t S, int64_t P, int64_t C, int64_t VH) {
  const int64_t T = P * C + VH, n = R * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    bf16* p = dqkv + tail_offset(i / T, i % T, ld, S, P, C, VH);
    *p = __float2bfloat16(f(*p) + dtails[i]);
  }
}

__global__ void split_halos_kernel(float* hist, float* vdl, const float* halo, int64_t R, int64_t P,
                                   int64_t C, int64_t VH) {
  const int64_t T = P * C + VH, n = R * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / T, e = i % T;
    if (e < P * C)
      hist[r * P * C + e] = halo[i];
    else
      vdl[r * VH + (e - P * C)] = halo[i];
  }
}

__global__ void pack_halo_grads_kernel(float* dhalo, const float* dhist, const bf16* dv, int64_t R,
                                       int64_t S, int64_t P, int64_t C, int64_t KD) {
  const int64_t VH = KD / 2, T = P * C + VH, n = R * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / T, e = i % T;
    dhalo[i] = e < P * C ? dhist[r * P * C + e] : f(dv[(r * S) * KD + VH + (e - P * C)]);
  }
}

// Element (b, t, w) of a whole-sequence row and its place in the rank blocks: chunk k = t / Lc is
// rank k's slot 0 for k < Cc, else rank 2Cc−1−k's slot 1.
__device__ __forceinline__ int64_t rank_index(int64_t b, int64_t t, int64_t w, int64_t B,
                                              int64_t Lc, int64_t Cc, int64_t W,
                                              int64_t rank_stride) {
  const int64_t k = t / Lc, u = t % Lc;
  const int64_t j = k < Cc ? k : 2 * Cc - 1 - k, slot = k < Cc ? 0 : 1;
  return j * rank_stride + ((slot * B + b) * Lc + u) * W + w;
}

__global__ void ranks_to_sequence_kernel(bf16* full, const bf16* gathered, int64_t rank_stride,
                                         int64_t B, int64_t S, int64_t Cc, int64_t W) {
  const int64_t n = B * S * W, Lc = S / (2 * Cc);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % W, bt = i / W, t = bt % S, b = bt / S;
    full[i] = gathered[rank_index(b, t, w, B, Lc, Cc, W, rank_stride)];
  }
}

__global__ void sequence_to_ranks_kernel(float* out, int64_t rank_stride, const bf16* a,
                                         const bf16* b2, int64_t B, int64_t S, int64_t Cc,
                                         int64_t W) {
  const int64_t n = B * S * W, Lc = S / (2 * Cc);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % W, bt = i / W, t = bt % S, b = bt / S;
    out[rank_index(b, t, w, B, Lc, Cc, W, rank_stride)] = f(a[i]) + (b2 ? f(b2[i]) : 0.0f);
  }
}

}  // namespace

void cp_pack_tails(float* tails_RT, const bf16* qkv, int64_t ld, int64_t R, int64_t S, int64_t P,
                   int64_t C, int64_t VH, cudaStream_t st) {
  const int64_t n = R * (P * C + VH);
  if (n <= 0) return;
  pack_tails_kernel<<<grid_for(n), kThreads, 0, st>>>(tails_RT, qkv, ld, R, S, P, C, VH);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void cp_add_tail_grads(bf16* dqkv, int64_t ld, const float* dtails_RT, int64_t R, int64_t S,
                       int64_t P, int64_t C, int64_t VH, cudaStream_t st) {
  const int64_t n = R * (P * C + VH);
  if (n <= 0) return;
  add_tail_grads_kernel<<<grid_for(n), kThreads, 0, st>>>(dqkv, ld, dtails_RT, R, S, P, C, VH);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void cp_split_halos(float* hist_RPC, float* vdl_RV, const float* halo_RT, int64_t R, int64_t P,
                    int64_t C, int64_t VH, cudaStream_t st) {
  const int64_t n = R * (P * C + VH);
  if (n <= 0) return;
  split_halos_kernel<<<grid_for(n), kThreads, 0, st>>>(hist_RPC, vdl_RV, halo_RT, R, P, C, VH);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void cp_pack_halo_grads(float* dhalo_RT, const float* dhist_RPC, const bf16* dv_NKD, int64_t R,
                        int64_t S, int64_t P, int64_t C, int64_t KD, cudaStream_t st) {
  const int64_t n = R * (P * C + KD / 2);
  if (n <= 0) return;
  pack_halo_grads_kernel<<<grid_for(n), kThreads, 0, st>>>(dhalo_RT, dhist_RPC, dv_NKD, R, S, P, C,
                                                           KD);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void cp_ranks_to_sequence(bf16* full_BSW, const bf16* gathered, int64_t rank_stride, int64_t B,
                          int64_t S, int64_t Cc, int64_t W, cudaStream_t st) {
  const int64_t n = B * S * W;
  if (n <= 0) return;
  ranks_to_sequence_kernel<<<grid_for(n), kThreads, 0, st>>>(full_BSW, gathered, rank_stride, B, S,
                                                             Cc, W);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void cp_sequence_to_ranks(float* out, int64_t rank_stride, const bf16* a_BSW, const bf16* b_BSW,
                          int64_t B, int64_t S, int64_t Cc, int64_t W, cudaStream_t st) {
  const int64_t n = B * S * W;
  if (n <= 0) return;
  sequence_to_ranks_kernel<<<grid_for(n), kThreads, 0, st>>>(out, rank_stride, a_BSW, b_BSW, B, S,
                                                             Cc, W);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda
