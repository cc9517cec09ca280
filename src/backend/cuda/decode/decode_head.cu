// The step's ends and bookkeeping of decode (decode_kernels.h): argmax over the logits, the LM
// head's GEMV with its argmax folded in and the token commit (lm_head_greedy), the cache append of
// prefill and the length counters.
#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {
namespace {

// Argmax over long rows in two passes: 256 blocks per row each reduce a slice to (value, index),
// then one block per row reduces the slices in order. Ties go to the lowest index throughout.
constexpr int kArgmaxSlices = 256;

__device__ void argmax_merge(float& bv, int64_t& bi, float ov, int64_t oi) {
  if (ov > bv || (ov == bv && oi < bi) || (bi < 0 && oi >= 0)) {
    bv = ov;
    bi = oi;
  }
}

__device__ void block_argmax(float& bv, int64_t& bi) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  for (int o = kWarp / 2; o > 0; o >>= 1)
    argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x) / kWarp; w++) argmax_merge(bv, bi, sv[w], si[w]);
  }
}

__global__ void argmax_slices_kernel(float* part_v, int64_t* part_i, const float* logits,
                                     int64_t V) {
  pdl_begin(DecodeTraceEvent::Argmax);
  const int64_t m = blockIdx.y, slice = blockIdx.x;
  const int64_t per = (V + kArgmaxSlices - 1) / kArgmaxSlices;
  const int64_t v0 = slice * per, v1 = v0 + per < V ? v0 + per : V;
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x)
    argmax_merge(bv, bi, logits[m * V + v], v);
  block_argmax(bv, bi);
  if (threadIdx.x == 0) {
    part_v[m * kArgmaxSlices + slice] = bv;
    part_i[m * kArgmaxSlices + slice] = bi;
  }
}

__global__ void argmax_final_kernel(int32_t* out, const float* part_v, const int64_t* part_i,
                                    int32_t* hist, const int32_t* len) {
  pdl_begin(DecodeTraceEvent::ArgmaxFinal);
  const int64_t m = blockIdx.x;
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int s = threadIdx.x; s < kArgmaxSlices; s += blockDim.x)
    argmax_merge(bv, bi, part_v[m * kArgmaxSlices + s], part_i[m * kArgmaxSlices + s]);
  block_argmax(bv, bi);
  if (threadIdx.x == 0) {
    out[m] = int32_t(bi < 0 ? 0 : bi);
    if (hist) hist[int64_t(len[m]) * gridDim.x + m] = int32_t(bi < 0 ? 0 : bi);
  }
}

// The greedy step's end in two launches instead of four: the LM head's GEMV reduces each block's
// rows to one 64-bit key per sequence, (order-preserving bits of the logit) << 32 | ~index, and
// folds it into keys[m] with a fire-and-forget atomic max; so the largest logit wins and, among
// equal logits, the lowest index (argmax_rows' rule; −0 counts as +0, and a NaN logit outranks
// every number, where argmax_rows keeps whichever it met first). The logits themselves are the
// same bits as gemv_bf16's. token_commit then turns the key into the token (next input, token
// history), zeroes the key for the next step and advances the lengths.
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
  if (v == 0.f) v = 0.f;
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - unsigned(i));
}

// kStage (lm_head_greedy's stage_x): the block copies the M input rows into shared memory once
// after the wait and its warps read them there. kEF kWeightNoL1 (lm_head_greedy's no_l1): the
// streamed rows are not allocated in L1.
template <int M, int kEF = kWeightNormal, bool kStage = false>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_argmax_kernel(float* y32, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                       int64_t ldw, const float* bias, int64_t O, int64_t K,
                       unsigned long long* keys) {
  __shared__ unsigned long long best[M][kRowsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const bool live = o < O;
  const bf16* w = W + (live ? o : 0) * ldw;
  pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (kStage) {
    extern __shared__ __align__(16) float lm_x_sh[];  // [M][K]
    x = stage_rows<M>(x, ldx, K, lm_x_sh), ldx = K;
  }
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  if (live) gemv_bf16_row<M, true, kEF>(acc, x, ldx, w, K, lane);
#pragma unroll
  for (int m = 0; m < M; m++) {
    const float s = warp_sum(acc[m]) + (bias && live ? bias[o] : 0.f);  // as gemv_bf16_kernel
    if (lane == 0) {
      if (live && y32) y32[m * ldy + o] = s;
      best[m][warp] = live ? argmax_key(s, o) : 0ull;
    }
  }
  __syncthreads();
  if (threadIdx.x < M) {
    unsigned long long b = 0ull;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; w++) b = b > best[threadIdx.x][w] ? b : best[threadIdx.x][w];
    atomicMax(keys + threadIdx.x, b);
  }
}

__global__ void token_commit_kernel(int32_t* ids, int32_t* hist, int32_t* len,
                                    unsigned long long* keys, int M) {
  pdl_begin(DecodeTraceEvent::Advance);
  const int m = threadIdx.x;
  if (m >= M) return;
  const unsigned long long k = keys[m];
  keys[m] = 0ull;
  const int32_t tok = k == 0ull ? 0 : int32_t(0xFFFFFFFFu - unsigned(k & 0xFFFFFFFFull));
  ids[m] = tok;
  if (hist) hist[int64_t(len[m]) * M + m] = tok;
  len[m] += 1;
}

__global__ void kv_append_kernel(bf16* kc, bf16* vc, const bf16* k, const bf16* v, int64_t past,
                                 int64_t cap, int64_t S, int64_t row) {
  const int64_t bt = blockIdx.x;  // b·S + t
  const int64_t b = bt / S, t = bt % S;
  const int64_t dst = (b * cap + past + t) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[dst + i] = k[bt * row + i];
    vc[dst + i] = v[bt * row + i];
  }
}

__global__ void advance_kernel(int32_t* len, int32_t n, int64_t B) {
  pdl_begin(DecodeTraceEvent::Advance);
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < B) len[b] += n;
}

}  // namespace

void kv_append(bf16* kcache, bf16* vcache, const bf16* k, const bf16* v, int64_t past, int64_t cap,
               int64_t B, int64_t S, int64_t Hkv, int64_t d, cudaStream_t st,
               const DecodePolicy& policy) {
  check(past + S <= cap, "kv_append: past the cache capacity");
  kv_append_kernel<<<unsigned(B * S), 128, 0, st>>>(kcache, vcache, k, v, past, cap, S, Hkv * d);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

size_t argmax_workspace_bytes(int64_t M) {
  return size_t(M) * kArgmaxSlices * (sizeof(float) + sizeof(int64_t)) + 16;
}

void argmax_rows(int32_t* ids_out, const float* logits_MV, int64_t M, int64_t V, void* ws,
                 cudaStream_t st, int32_t* hist, const int32_t* len_B, const DecodePolicy& policy) {
  check(hist == nullptr || len_B != nullptr, "argmax_rows: a token history needs the lengths");
  int64_t* part_i = static_cast<int64_t*>(ws);
  float* part_v = reinterpret_cast<float*>(part_i + M * kArgmaxSlices);
  launch_k(argmax_slices_kernel, dim3{unsigned(kArgmaxSlices), unsigned(M)}, dim3(256), 0, st,
           policy, part_v, part_i, logits_MV, V);
  launch_k(argmax_final_kernel, dim3(unsigned(M)), dim3(256), 0, st, policy, ids_out, part_v,
           part_i, hist, len_B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

bool lm_head_greedy_supported(int64_t M, int64_t V, int64_t D, const bf16* x, int64_t ldx,
                              const bf16* W) {
  return M >= 1 && M <= kGemvMaxRows && V > 0 && V < int64_t(0xFFFFFFFFu) && D > 0 && D % 8 == 0 &&
         ldx % 8 == 0 && aligned16(x) && aligned16(W);
}

void lm_head_greedy(float* logits_MV, const bf16* x, int64_t ldx, const bf16* W, int64_t M,
                    int64_t V, int64_t D, unsigned long long* keys_M, int32_t* ids_out,
                    int32_t* hist, int32_t* len_B, cudaStream_t st, bool stage_x, bool no_l1,
                    const DecodePolicy& policy) {
  check(lm_head_greedy_supported(M, V, D, x, ldx, W) && keys_M && ids_out && len_B,
        "lm_head_greedy: needs lm_head_greedy_supported, the keys, the ids and the lengths");
  const dim3 grid(unsigned((V + kRowsPerBlock - 1) / kRowsPerBlock));
  const dim3 block(kRowsPerBlock * kWarp);
  with_rows(M, [&](auto n) {
    constexpr int kM = decltype(n)::value;
    // Staged rows within the default 48 KB of dynamic shared memory.
    const bool stage = stage_x && size_t(kM) * size_t(D) * sizeof(bf16) <= 48 * 1024;
    auto kernel = gemv_argmax_kernel<kM, kWeightNormal>;
    if (stage || no_l1)
      kernel = stage ? (no_l1 ? gemv_argmax_kernel<kM, kWeightNoL1, true>
                              : gemv_argmax_kernel<kM, kWeightNormal, true>)
                     : gemv_argmax_kernel<kM, kWeightNoL1>;
    launch_k(kernel, grid, block, stage ? size_t(kM) * size_t(D) * sizeof(bf16) : 0, st, policy,
             logits_MV, V, x, ldx, W, D, static_cast<const float*>(nullptr), V, D, keys_M);
  });
  launch_k(token_commit_kernel, dim3(1), dim3(kWarp), 0, st, policy, ids_out, hist, len_B, keys_M,
           int(M));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void advance_lengths(int32_t* len_B, int32_t n, int64_t B, cudaStream_t st,
                     const DecodePolicy& policy) {
  launch_k(advance_kernel, dim3(unsigned((B + 127) / 128)), dim3(128), 0, st, policy, len_B, n, B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(head)
