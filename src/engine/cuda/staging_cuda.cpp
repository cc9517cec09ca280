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

void* alloc_pinned_host(size_t bytes) {
  void* p = nullptr;
  ZAYA_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
  return p;
}

void free_pinned_host(void* p) {
  if (p) cudaFreeHost(p);
}

}  // namespace zaya
