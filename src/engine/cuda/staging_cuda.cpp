// The CUDA build's byte copies and page-locked staging buffers of train_step.h (the data-parallel
// step moves gradients and weights between the GPU and host MPI buffers through these).
#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "engine/train_step.h"

namespace zaya {

void copy_step_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes) ZAYA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void finish_step_copies() {
  // cudaMemcpy runs on the legacy default stream; waiting for it covers every copy issued.
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

int visible_cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

StagingMemory device_ring_staging() {
  int device = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&device));
  StagingMemory m;
  m.alloc = [device](size_t bytes) {
    ZAYA_CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    return p;
  };
  m.free = [device](void* p) {
    cudaSetDevice(device);
    cudaFree(p);
  };
  // The snapshot: a device-to-device copy (the sources were synchronised by the caller), waited
  // for, so the step may overwrite them when submit returns.
  m.copy = [device](void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
    ZAYA_CUDA_CHECK(cudaSetDevice(device));
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  };
  // The writer thread: its own current device (no context on GPU 0 for a rank on another GPU),
  // into the page-locked bounce buffer, complete on return.
  m.read = [device](void* host_dst, const void* src, size_t bytes) {
    ZAYA_CUDA_CHECK(cudaSetDevice(device));
    ZAYA_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  };
  m.bounce_alloc = [device](size_t bytes) {
    ZAYA_CUDA_CHECK(cudaSetDevice(device));
    return alloc_pinned_host(bytes);
  };
  m.bounce_free = free_pinned_host;
  m.where = "GPU";
  return m;
}

size_t free_device_bytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return free_b;
}

void* alloc_pinned_host(size_t bytes) {
  void* p = nullptr;
  ZAYA_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
  return p;
}

void free_pinned_host(void* p) {
  if (p) cudaFreeHost(p);
}

}  // namespace zaya
