// The token embedding fused with ZAYA1's input affine on the GPU (backend/cuda/ops.h):
// embed_affine_fwd and embed_affine_bwd. Specification: cpu::embedding + cpu::affine forward;
// backward as model/backward.cpp's input-affine block + cpu::embedding_backward.
//
// Forward: one warp per token (for a few tokens, several warps per token, each a slice of the
// columns), bf16 table row widened to fp32. Ids outside [0, V) produce a zero
// row and record 1 + the smallest offending position in *bad_id_flag (integer CAS: the recorded
// value does not depend on scheduling; the caller zeroes the flag, and across several calls it
// keeps the smallest value recorded).
//
// Backward, all deterministic:
//   - ds, db: kern::colreduce over tokens (fixed-grid partials, ordered finish);
//   - dtable: token positions are sorted by id with a stable radix sort (CUB; keys = id, values =
//     position, so one id's positions stay in token order: a stable counting sort by id), then
//     each touched row is updated by one block per 128-column tile that walks that id's positions
//     in token order, adding de = dh ⊙ s one token at a time exactly as cpu::embedding_backward
//     does (products rounded before the add, so the result matches the reference bit for bit for
//     equal inputs). Out-of-range ids sort last and are skipped.
// Deliberately not here: splitting very frequent ids across blocks (their row is summed by one
// block in token order; that order is what makes the sum reproducible).
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/arch/kernel_utils.cuh"

namespace zaya::cuda {

namespace {

using namespace kern;

template <int W>
__global__ void embed_affine_fwd_kernel(float* h, const int32_t* ids, const bf16* table,
                                        const float* s, const float* b, int32_t* bad_flag,
                                        int64_t N, int64_t D, int64_t V) {
  const int64_t n = warp_row();
  if (n >= N) return;
  const int lane = lane_id();
  const int32_t id = ids[n];
  float* hr = h + n * D;
  if (id < 0 || int64_t(id) >= V) {
    if (lane == 0 && blockIdx.y == 0 && bad_flag) record_first_bad(bad_flag, int32_t(n + 1));
    for (int64_t i = (int64_t(blockIdx.y) * 32 + lane) * W; i < D;
         i += int64_t(gridDim.y) * 32 * W) {
      float z[W];
#pragma unroll
      for (int j = 0; j < W; j++) z[j] = 0.f;
      store_w<W>(hr + i, z);
    }
    return;
  }
  const bf16* er = table + int64_t(id) * D;
  for (int64_t i = (int64_t(blockIdx.y) * 32 + lane) * W; i < D; i += int64_t(gridDim.y) * 32 * W) {
    float e[W], sv[W], bv[W], o[W];
    load_w<W>(er + i, e);
    load_w<W>(s + i, sv);
    load_w<W>(b + i, bv);
#pragma unroll
    for (int j = 0; j < W; j++) o[j] = (e[j] + bv[j]) * sv[j];
    store_w<W>(hr + i, o);
  }
}

// ds += Σ dh⊙(e+b), db += Σ dh⊙s over valid tokens (an invalid id's zero row has no gradient).
struct EmbedAffineParamGrads {
  const float* dh;
  const int32_t* ids;
  const bf16* table;
  const float* s;
  const float* b;
  int64_t D, V;
  __device__ void operator()(int64_t n, int64_t c, float (&v)[2]) const {
    const int32_t id = ids[n];
    if (id < 0 || int64_t(id) >= V) {
      v[0] = v[1] = 0.f;
      return;
    }
    const float g = dh[n * D + c];
    const float e = __bfloat162float(table[int64_t(id) * D + c]);
    v[0] = g * (e + b[c]);
    v[1] = g * s[c];
  }
};

// Sort keys: the id, or V for an out-of-range id (sorted after every valid one).
__global__ void embed_sort_keys_kernel(uint32_t* keys, int32_t* pos, const int32_t* ids, int64_t N,
                                       int64_t V) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[n];
    keys[n] = (id < 0 || int64_t(id) >= V) ? uint32_t(V) : uint32_t(id);
    pos[n] = int32_t(n);
  }
}

constexpr int kRowTile = 128;

// Block (j-stride, column tile): for each sorted index j that starts a run of equal ids, walk the
// run in token order and update that id's row of dtable.
__global__ void __launch_bounds__(kRowTile)
    embed_rows_bwd_kernel(float* dtable, const float* dh, const float* s, const uint32_t* keys,
                          const int32_t* pos, int64_t N, int64_t D, int64_t V) {
  const int64_t c = int64_t(blockIdx.y) * kRowTile + threadIdx.x;
  if (c >= D) return;
  const float sc = s[c];
  for (int64_t j = blockIdx.x; j < N; j += gridDim.x) {
    const uint32_t key = keys[j];
    if (int64_t(key) >= V) break;  // invalid ids sort last: nothing after them
    if (j > 0 && keys[j - 1] == key) continue;
    float r = dtable[int64_t(key) * D + c];
    int64_t k = j;
#pragma unroll 4
    for (; k < N && keys[k] == key; k++)
      r = __fadd_rn(r, __fmul_rn(dh[int64_t(pos[k]) * D + c], sc));  // no FMA: as the reference
    dtable[int64_t(key) * D + c] = r;
  }
}

int key_bits(int64_t V) {
  int bits = 1;
  while ((int64_t(1) << bits) <= V) bits++;  // keys take values 0..V
  return bits;
}

size_t cub_sort_bytes(int64_t N, int64_t V) {
  size_t bytes = 0;
  ZAYA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(N), 0,
      key_bits(V)));
  return bytes;
}

}  // namespace

void embed_affine_fwd(float* h_ND, const int32_t* ids_N, const bf16* table_VD, const float* s_D,
                      const float* b_D, int32_t* bad_id_flag, int64_t N, int64_t D, int64_t V,
                      cudaStream_t st) {
  if (!check_sizes("embed_affine_fwd", __LINE__, N, D)) return;
  // A few tokens (decode): the row's columns split over grid.y warps (one per 32·W columns, up to
  // 256 warps in all) instead of one warp walking the row; many tokens: one warp per row.
  const bool vec = vec4_ok(D, {h_ND, table_VD, s_D, b_D});
  const int64_t per_warp = 32 * (vec ? 4 : 1);
  const int64_t splits =
      std::max<int64_t>(1, std::min<int64_t>((D + per_warp - 1) / per_warp, 256 / N));
  const dim3 grid(row_grid(N), unsigned(splits));
  const unsigned block = 32 * kRowWarps;
  if (vec)
    embed_affine_fwd_kernel<4>
        <<<grid, block, 0, st>>>(h_ND, ids_N, table_VD, s_D, b_D, bad_id_flag, N, D, V);
  else
    embed_affine_fwd_kernel<1>
        <<<grid, block, 0, st>>>(h_ND, ids_N, table_VD, s_D, b_D, bad_id_flag, N, D, V);
  ZAYA_KERNEL_CHECK();
}

size_t embed_affine_bwd_workspace_bytes(int64_t N, int64_t D, int64_t V) {
  if (N <= 0 || D <= 0) return 0;
  return colreduce_workspace_bytes(N, D, 2) + 4 * ws_piece(size_t(N) * 4) +
         ws_piece(cub_sort_bytes(N, V));
}

void embed_affine_bwd(float* dtable_VD, float* ds_D, float* db_D, const float* dh_ND,
                      const int32_t* ids_N, const bf16* table_VD, const float* s_D,
                      const float* b_D, int64_t N, int64_t D, int64_t V, Workspace& ws,
                      cudaStream_t st) {
  if (!check_sizes("embed_affine_bwd", __LINE__, N, D)) return;
  if (N > int64_t(INT32_MAX) - 1)
    fail_arg("embed_affine_bwd", __LINE__, "too many tokens for 32-bit positions");
  colreduce<2>(OutPtrs<2>{{ds_D, db_D}},
               EmbedAffineParamGrads{dh_ND, ids_N, table_VD, s_D, b_D, D, V}, N, D, ws, st);
  if (!dtable_VD) return;
  uint32_t* keys_in = ws.take_n<uint32_t>(size_t(N));
  uint32_t* keys_out = ws.take_n<uint32_t>(size_t(N));
  int32_t* pos_in = ws.take_n<int32_t>(size_t(N));
  int32_t* pos_out = ws.take_n<int32_t>(size_t(N));
  size_t temp_bytes = cub_sort_bytes(N, V);
  void* temp = ws.take(temp_bytes);
  embed_sort_keys_kernel<<<elt_grid(N), kEltThreads, 0, st>>>(keys_in, pos_in, ids_N, N, V);
  ZAYA_KERNEL_CHECK();
  ZAYA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in,
                                                  pos_out, int(N), 0, key_bits(V), st));
  const int64_t gx = N < 1024 ? N : 1024;
  embed_rows_bwd_kernel<<<dim3(unsigned(gx), unsigned(ceil_div(D, kRowTile))), kRowTile, 0, st>>>(
      dtable_VD, dh_ND, s_D, keys_out, pos_out, N, D, V);
  ZAYA_KERNEL_CHECK();
}

}  // namespace zaya::cuda
