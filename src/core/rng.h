// Counter-based random numbers (Philox-4x32-10). A stream is (seed, offset): the same values come
// out on any thread, in any order, and on the GPU, so runs resume bit-exactly from a saved offset.
#pragma once
#include <array>
#include <cstdint>

namespace zaya {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  uint32_t next_u32();
  // Uniform in [0, 1) with 24 bits.
  float uniform();
  double uniform_double();
  // Standard normal (Box-Muller).
  float normal();
  // p[i] = normal() * scale for i in [0, n): the values n calls of normal() would give, in order
  // (element i from offsets offset() + 4i .. + 4i + 3), computed by the worker threads with one
  // Philox block per element instead of four; the stream then stands 4n further on.
  void fill_normal(float* p, int64_t n, float scale);
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t o) { offset_ = o; }

 private:
  uint64_t seed_, offset_;
};

}  // namespace zaya
