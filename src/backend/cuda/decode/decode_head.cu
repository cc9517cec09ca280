// The step's ends and bookkeeping of decode (decode_kernels.h): argmax over the logits, the LM
// head's GEMV with its argmax folded in and the token commit (lm_head_greedy), the L2 set-aside,
// the cache append of prefill and the length counters.
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

// The greedy step's end in two launches instead of four (DecodeTuning::fused_step_ends): the LM
// head's GEMV reduces each block's rows to one 64-bit key per sequence, (order-preserving bits of
// the logit) << 32 | ~index, and folds it into keys[m] with a fire-and-forget atomic max; so the
// largest logit wins and, among equal logits, the lowest index (argmax_rows' rule; −0 counts as +0,
// and a NaN logit outranks every number, where argmax_rows keeps whichever it met first). The
// logits themselves are the same bits as gemv_bf16's. token_commit then turns the key into the
// token (next input, token history), zeroes the key for the next step and advances the lengths.
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
  if (v == 0.f) v = 0.f;
  unsigned u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - unsigned(i));
}

// kPre (lm_head_greedy's prefetch): each warp's first kPreChunks pieces of its row loaded before
// the wait, as gemv_bf16_kernel's register prologue — so the blocks of the first wave, which
// start while the last residual norm still waits on the experts (its early trigger), have their
// rows in flight when x lands. The same bits. kStage (lm_head_greedy's stage_x): the block copies
// the M input rows into shared memory once after the wait and its warps read them there. kEF
// kWeightNoL1 (lm_head_greedy's no_l1): the streamed rows are not allocated in L1.
template <int M, int kEF = kWeightNormal, bool kPre = false, bool kStage = false>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_argmax_kernel(float* y32, int64_t ldy, const bf16* x, int64_t ldx, const bf16* W,
                       int64_t ldw, const float* bias, int64_t O, int64_t K,
                       unsigned long long* keys) {
  __shared__ unsigned long long best[M][kRowsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const bool live = o < O;
  const bf16* w = W + (live ? o : 0) * ldw;
  uint4 wpre[kPreChunks];
  if constexpr (kPre) load_row_pieces<kEF>(wpre, w, K, lane, live);
  pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (kStage) {
    extern __shared__ __align__(16) float lm_x_sh[];  // [M][K]
    x = stage_rows<M>(x, ldx, K, lm_x_sh), ldx = K;
  }
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  if constexpr (kPre) {
    if (live) gemv_bf16_row_pre<M, kEF>(acc, wpre, x, ldx, w, K, lane);
  } else {
    if (live) gemv_bf16_row<M, true, kEF>(acc, x, ldx, w, K, lane);
  }
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

// The LM head's greedy GEMV as a persistent grid (DecodeTuning::lm_head_persistent): as many
// blocks as fit on the device at once, each warp taking rows o, o + step, ... (step = the grid's
// warps) with the next row's loads in flight while it sums the current one, and one atomic max
// per block at the end — instead of ~32K blocks of one row per warp in ~31 waves, each block
// paying its start, its reduction and its atomic. Each row's sum is gemv_argmax_kernel's (the
// same pieces, the same fmaf chain, the same bias expression), and the key maximum does not
// depend on the order rows are visited, so logits and tokens are the same bits. kPre: the first
// row's loads issued before the wait (weights only).
template <int M, bool kPre>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    gemv_argmax_persistent_kernel(float* y32, int64_t ldy, const bf16* x, int64_t ldx,
                                  const bf16* W, int64_t ldw, const float* bias, int64_t O,
                                  int64_t K, unsigned long long* keys) {
  __shared__ unsigned long long best[M][kRowsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
  int64_t o = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  unsigned long long b[M];
#pragma unroll
  for (int m = 0; m < M; m++) b[m] = 0ull;
  uint4 ra[kPreChunks], rb[kPreChunks];
  auto load = [&](uint4(&r)[kPreChunks], int64_t row) {
    load_row_pieces(r, W + (row < O ? row : 0) * ldw, K, lane, row < O);
  };
  if constexpr (kPre) load(ra, o);
  pdl_begin(DecodeTraceEvent::Gemv);
  if constexpr (!kPre) load(ra, o);
  // Row `row` from `cur`, with the loads of row + step into `nxt` issued first.
  auto row_step = [&](uint4(&cur)[kPreChunks], uint4(&nxt)[kPreChunks], int64_t row) {
    load(nxt, row + step);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.f;
    gemv_bf16_row_pre<M>(acc, cur, x, ldx, W + row * ldw, K, lane);
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float s = warp_sum(acc[m]) + (bias ? bias[row] : 0.f);  // as gemv_argmax_kernel
      if (lane == 0 && y32) y32[m * ldy + row] = s;
      const unsigned long long k = argmax_key(s, row);
      b[m] = b[m] > k ? b[m] : k;
    }
  };
  while (o < O) {  // unrolled by two, so the two register sets swap roles without copies
    row_step(ra, rb, o);
    o += step;
    if (o >= O) break;
    row_step(rb, ra, o);
    o += step;
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; m++) best[m][warp] = b[m];
  }
  __syncthreads();
  if (threadIdx.x < M) {
    unsigned long long v = 0ull;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; w++) v = v > best[threadIdx.x][w] ? v : best[threadIdx.x][w];
    atomicMax(keys + threadIdx.x, v);
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
                 cudaStream_t st, int32_t* hist, const int32_t* len_B,
    const DecodePolicy& policy) {
  check(hist == nullptr || len_B != nullptr, "argmax_rows: a token history needs the lengths");
  int64_t* part_i = static_cast<int64_t*>(ws);
  float* part_v = reinterpret_cast<float*>(part_i + M * kArgmaxSlices);
  launch_k(argmax_slices_kernel, dim3{unsigned(kArgmaxSlices), unsigned(M)}, dim3(256), 0, st, policy,
           part_v, part_i, logits_MV, V);
  launch_k(argmax_final_kernel, dim3(unsigned(M)), dim3(256), 0, st, policy, ids_out, part_v, part_i, hist,
           len_B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

L2Persist set_l2_persisting(size_t bytes) {
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  ZAYA_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  L2Persist r;
  const size_t aside = std::min(bytes, size_t(p.persistingL2CacheMaxSize));
  ZAYA_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, aside));
  if (aside == 0) {
    ZAYA_CUDA_CHECK(cudaCtxResetPersistingL2Cache());
    return r;
  }
  r.bytes = std::min(bytes, size_t(p.accessPolicyMaxWindowSize));
  r.hit_ratio = r.bytes > aside ? float(double(aside) / double(r.bytes)) : 1.f;
  return r;
}

bool lm_head_greedy_supported(int64_t M, int64_t V, int64_t D, const bf16* x, int64_t ldx,
                              const bf16* W) {
  return M >= 1 && M <= kGemvMaxRows && V > 0 && V < int64_t(0xFFFFFFFFu) && D > 0 && D % 8 == 0 &&
         ldx % 8 == 0 && aligned16(x) && aligned16(W);
}

void lm_head_greedy(float* logits_MV, const bf16* x, int64_t ldx, const bf16* W, int64_t M,
                    int64_t V, int64_t D, unsigned long long* keys_M, int32_t* ids_out,
                    int32_t* hist, int32_t* len_B, cudaStream_t st, L2Persist persist,
                    bool prefetch, bool persistent, bool stage_x, bool no_l1,
    const DecodePolicy& policy) {
  check(lm_head_greedy_supported(M, V, D, x, ldx, W) && keys_M && ids_out && len_B,
        "lm_head_greedy: needs lm_head_greedy_supported, the keys, the ids and the lengths");
  // persist_bytes: the first rows of W marked to stay in L2 across launches (an access policy
  // window on this launch; the device's persisting set-aside is set by set_l2_persisting).
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((V + kRowsPerBlock - 1) / kRowsPerBlock));
  cfg.blockDim = dim3(kRowsPerBlock * kWarp);
  cfg.stream = st;
  cudaLaunchAttribute at[2];
  unsigned n_at = add_pdl_attribute(at, 0, policy);
  if (persist.bytes > 0) {
    at[n_at].id = cudaLaunchAttributeAccessPolicyWindow;
    at[n_at].val.accessPolicyWindow.base_ptr = const_cast<bf16*>(W);
    at[n_at].val.accessPolicyWindow.num_bytes =
        std::min(persist.bytes, size_t(V) * size_t(D) * sizeof(bf16));
    at[n_at].val.accessPolicyWindow.hitRatio = persist.hit_ratio;
    at[n_at].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    at[n_at++].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  }
  cfg.attrs = at;
  cfg.numAttrs = n_at;
  with_rows(M, [&](auto n) {
    constexpr int kM = decltype(n)::value;
    if (persistent) {
      const auto kernel = prefetch ? gemv_argmax_persistent_kernel<kM, true>
                                   : gemv_argmax_persistent_kernel<kM, false>;
      // As many blocks as are resident at once on the whole device (queried once per kernel and
      // device; not inside a capture: the first decode step runs eagerly), at most one per
      // 8-row group of the head.
      static int known_dev[2] = {-1, -1}, known_grid[2] = {0, 0};
      int dev = 0;
      ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
      const int slot = prefetch ? 1 : 0;
      if (known_dev[slot] != dev) {
        int per_sm = 0, sms = 0;
        ZAYA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                                      kRowsPerBlock * kWarp, 0));
        ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        known_grid[slot] = std::max(1, per_sm * sms);
        known_dev[slot] = dev;
      }
      cfg.gridDim = dim3(
          unsigned(std::min<int64_t>(known_grid[slot], (V + kRowsPerBlock - 1) / kRowsPerBlock)));
      ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, logits_MV, V, x, ldx, W, D,
                                         static_cast<const float*>(nullptr), V, D, keys_M));
      return;
    }
    // stage_x and no_l1 only without the prefetch form; staged rows within the default 48 KB of
    // dynamic shared memory.
    const bool stage = stage_x && !prefetch && size_t(kM) * size_t(D) * sizeof(bf16) <= 48 * 1024;
    const bool nol1 = no_l1 && !prefetch;
    auto kernel = prefetch ? gemv_argmax_kernel<kM, kWeightNormal, true>
                           : gemv_argmax_kernel<kM, kWeightNormal>;
    if (stage || nol1)
      kernel = stage ? (nol1 ? gemv_argmax_kernel<kM, kWeightNoL1, false, true>
                             : gemv_argmax_kernel<kM, kWeightNormal, false, true>)
                     : gemv_argmax_kernel<kM, kWeightNoL1>;
    cfg.dynamicSmemBytes = stage ? size_t(kM) * size_t(D) * sizeof(bf16) : 0;
    ZAYA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, logits_MV, V, x, ldx, W, D,
                                       static_cast<const float*>(nullptr), V, D, keys_M));
  });
  launch_k(token_commit_kernel, dim3(1), dim3(kWarp), 0, st, policy, ids_out, hist, len_B, keys_M, int(M));
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

void advance_lengths(int32_t* len_B, int32_t n, int64_t B, cudaStream_t st,
    const DecodePolicy& policy) {
  launch_k(advance_kernel, dim3(unsigned((B + 127) / 128)), dim3(128), 0, st, policy, len_B, n, B);
  ZAYA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zaya::cuda

ZAYA_DECODE_TRACE_UNIT(head)
