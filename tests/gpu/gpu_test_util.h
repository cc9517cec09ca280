// Helpers shared by the GPU tests (tests/gpu/*.cpp, the zaya_gpu_tests binary): the device check
// that every test skips on, owning device buffers, host<->device copies that are complete when they
// return, bf16 rounding and conversions, seeded random inputs, and the max-abs / relative-error
// comparisons against a CPU reference. Header-only; host C++ that needs the CUDA runtime.
//
// Copies. A plain cudaMemcpy from pageable host memory may return once the data is staged, before
// its DMA has landed, and it is ordered only against the legacy default stream: a kernel on a
// non-blocking stream (the GEMM tests', CudaModel's) can then read stale data or have its result
// overwritten by the late copy. upload/download therefore go through cudaMemcpyAsync on the stream
// the test uses and synchronise that stream, or, without a stream, wait for the whole device before
// and after the copy. They are for test inputs and results, not for timed loops.
//
// Deliberately not here: tolerances (each test states its own), the CPU references, and anything
// that needs backend/cuda/ops.h (Workspace); tests that need an arena with a workspace wrap
// DeviceArena.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace zaya::test_util {

// True when the CUDA runtime reports at least one device; tests GTEST_SKIP() otherwise.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The tiny preset cut to `layers` layers of hidden 64, in shapes the CUDA kernels take (head dim
// 32: the attention kernels support 32, 64 and 128), three experts.
inline ZayaConfig small_gpu_config(int64_t layers) {
  ZayaConfig c = ZayaConfig::preset("tiny");
  c.hidden_size = 64;
  c.num_hidden_layers = layers;
  c.head_dim = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.moe_intermediate_size = 64;
  c.num_experts = 3;
  c.router_hidden_size = 16;
  return c;
}

}  // namespace zaya::test_util

// Fatal gtest assertion that a CUDA runtime call succeeded, naming the call.
#define ASSERT_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
// Skips the current test on a machine without a CUDA device.
#define SKIP_WITHOUT_GPU() \
  if (!::zaya::test_util::have_gpu()) GTEST_SKIP() << "no CUDA device"

namespace zaya::test_util {

// ---- copies ------------------------------------------------------------------------------------

// Copies `bytes` and returns once they have landed, after all work queued before it (see the file
// comment): on `st` when one is given, else on the legacy stream with the device idle before and
// after.
inline cudaError_t copy_synced(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                               cudaStream_t st = nullptr) {
  if (bytes == 0) return cudaSuccess;
  cudaError_t e = st ? cudaSuccess : cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, st);
  if (e == cudaSuccess) e = st ? cudaStreamSynchronize(st) : cudaDeviceSynchronize();
  return e;
}

inline cudaError_t to_device(void* dst, const void* src, size_t bytes, cudaStream_t st = nullptr) {
  return copy_synced(dst, src, bytes, cudaMemcpyHostToDevice, st);
}

inline cudaError_t to_host(void* dst, const void* src, size_t bytes, cudaStream_t st = nullptr) {
  return copy_synced(dst, src, bytes, cudaMemcpyDeviceToHost, st);
}

// Host vector to device memory of the same element type; a failed copy is a test failure.
template <typename T>
void upload(T* dst, const std::vector<T>& src, cudaStream_t st = nullptr) {
  const cudaError_t e = to_device(dst, src.data(), src.size() * sizeof(T), st);
  EXPECT_EQ(e, cudaSuccess) << "upload of " << src.size() << " elements: " << cudaGetErrorString(e);
}

// n elements of device memory to a host vector; a failed copy is a test failure.
template <typename T>
std::vector<T> download(const T* src, size_t n, cudaStream_t st = nullptr) {
  std::vector<T> v(n);
  const cudaError_t e = to_host(v.data(), src, n * sizeof(T), st);
  EXPECT_EQ(e, cudaSuccess) << "download of " << n << " elements: " << cudaGetErrorString(e);
  return v;
}

// ---- bf16
// ----------------------------------------------------------------------------------------

// x rounded to the nearest bf16 (ties to even), as an fp32 value.
inline float round_bf16(float x) {
  return zaya::bf16_to_f32(zaya::f32_to_bf16(x));
}

// bf16 bit patterns to their exact fp32 values.
inline std::vector<float> bf16_bits_to_f32(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); i++) f[i] = zaya::bf16_to_f32(h[i]);
  return f;
}

// fp32 values to bf16 bit patterns (exact for values that are bf16-representable).
inline std::vector<uint16_t> f32_to_bf16_bits(const std::vector<float>& f) {
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); i++) h[i] = zaya::f32_to_bf16(f[i]);
  return h;
}

// Host floats (bf16-representable) to a device bf16 array of the same length.
inline void upload_bf16(__nv_bfloat16* dst, const std::vector<float>& src,
                        cudaStream_t st = nullptr) {
  upload(reinterpret_cast<uint16_t*>(dst), f32_to_bf16_bits(src), st);
}

// n device bf16 values as fp32.
inline std::vector<float> download_bf16(const __nv_bfloat16* src, size_t n,
                                        cudaStream_t st = nullptr) {
  return bf16_bits_to_f32(download(reinterpret_cast<const uint16_t*>(src), n, st));
}

// ---- device memory ---------------------------------------------------------------------------

// One device allocation of n elements of T (at least one), freed on scope exit, also when an
// ASSERT returns early. A failed cudaMalloc is a test failure and leaves p null.
template <typename T = std::byte>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;

  explicit DeviceBuffer(size_t count) : n(count) {
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << count * sizeof(T) << " bytes: " << cudaGetErrorString(e);
    }
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t bytes() const { return n * sizeof(T); }
  template <typename U>
  U* as() const {
    return reinterpret_cast<U*>(p);
  }
};

// Any number of device allocations, all freed when the arena goes out of scope. Each one has 16
// bytes of slack past its end, so that tests may offset a pointer by one element to exercise the
// misaligned (scalar) paths of vectorised kernels. A failed cudaMalloc returns null (tests ASSERT
// on the pointers they need).
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }

  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T) + 16) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // A new allocation holding a copy of v.
  template <typename T>
  T* up(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    if (p) upload(p, v);
    return p;
  }
  // bf16 values live on the host as floats that are exactly bf16-representable.
  __nv_bfloat16* up_bf16(const std::vector<float>& v) {
    return reinterpret_cast<__nv_bfloat16*>(up(f32_to_bf16_bits(v)));
  }

 private:
  std::vector<void*> ptrs_;
};

// ---- random inputs ---------------------------------------------------------------------------

// n values uniform in [lo, hi), optionally rounded to bf16 so that host reference and device see
// the same inputs. One draw per value, in order: the sequence depends only on the seed.
inline std::vector<float> random_uniform(std::mt19937_64& g, size_t n, float lo, float hi,
                                         bool bf16_exact = false) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_exact ? round_bf16(d(g)) : d(g);
  return v;
}

// ---- comparisons -----------------------------------------------------------------------------

// max |x_i| (0 for an empty vector).
inline float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// max |a_i − b_i| over a's length; *nonfinite tells whether any a_i is not finite.
inline float max_diff(const std::vector<float>& a, const std::vector<float>& b, bool* nonfinite) {
  float m = 0;
  *nonfinite = false;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i])) *nonfinite = true;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

// Expects max|got − ref| <= rel · max|ref| + abs_floor; a non-finite value fails at once. The
// message names the worst element.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& ref, double rel, double abs_floor = 1e-6) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double mx = 0, md = 0;
  size_t worst = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " [" << i << "] = " << got[i];
    mx = std::max(mx, double(std::fabs(ref[i])));
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (d > md) {
      md = d;
      worst = i;
    }
  }
  EXPECT_LE(md, rel * mx + abs_floor) << what << ": worst at " << worst << " got " << got[worst]
                                      << " ref " << ref[worst] << " (max|ref| " << mx << ")";
}

}  // namespace zaya::test_util
