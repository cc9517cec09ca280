// Workspace::take (backend/cuda/ops.h): the bump allocator that hands kernels their scratch out of
// one device arena. It only does pointer arithmetic on the host; it never allocates, frees or
// touches device memory, and it does not track lifetimes (the owner resets it once per step).
#include <cstdint>

#include "backend/cuda/ops.h"
#include "core/error.h"

namespace zaya::cuda {

namespace {
// 256 bytes: cuBLASLt's default operand alignment and a multiple of every vector width the kernels
// load (16 bytes), so any carve-out can feed either.
constexpr size_t kAlign = 256;
}  // namespace

void* Workspace::take(size_t bytes) {
  // Align the start relative to the address, not to `used`: base itself need not be 256-aligned
  // (an owner may hand out a sub-range of a larger buffer).
  const uintptr_t start = reinterpret_cast<uintptr_t>(base) + used;
  const size_t pad = size_t((kAlign - start % kAlign) % kAlign);
  // Written so that no intermediate sum can overflow size_t for absurd requests.
  if (used > capacity || pad > capacity - used || bytes > capacity - used - pad)
    fail(
        "CUDA workspace too small: a request of {} bytes (plus {} bytes of alignment) does not fit "
        "in the {} bytes left of a {}-byte arena ({} bytes in use)",
        bytes, pad, used <= capacity ? capacity - used : 0, capacity, used);
  used += pad;
  void* p = base + used;
  used += bytes;
  return p;
}

}  // namespace zaya::cuda
