// Carver: aligned sub-ranges of one device allocation, for the objects that size their whole
// working set once at construction (CudaModel, CudaInference). Run the same layout code twice:
// first over a null base to measure the total, then over the allocation; because one piece of code
// decides both, the sizes and the pointers cannot disagree. Host-only pointer arithmetic.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zaya::cuda {

class Carver {
 public:
  static constexpr size_t kAlign = 256;  // cuBLASLt's operand alignment; covers 16-byte vectors
  explicit Carver(char* base = nullptr) : base_(base) {}
  // n elements of T (at least one, so every piece has its own address), 256-byte aligned.
  template <typename T>
  T* take(int64_t n) {
    off_ = (off_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += size_t(std::max<int64_t>(n, 1)) * sizeof(T);
    return p;
  }
  size_t used() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

}  // namespace zaya::cuda
