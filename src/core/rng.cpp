#include "core/rng.h"

#include <cmath>

#include "core/parallel.h"

namespace zaya {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = uint64_t(M0) * c[0], p1 = uint64_t(M1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += W0;
    k[1] += W1;
  }
  return c;
}

namespace {

// The Philox block holding offset o of the stream `seed` (offset o is its word o & 3).
std::array<uint32_t, 4> block_at(uint64_t seed, uint64_t o) {
  return philox4x32({uint32_t(o >> 2), uint32_t(o >> 34), 0, 0},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

// A uniform double in [0, 1) with 53 bits from two consecutive words of the stream.
double uniform53(uint32_t hi, uint32_t lo) {
  return double(uint64_t(hi >> 5) * 67108864 + (lo >> 6)) * (1.0 / 9007199254740992.0);
}

float box_muller(double u1, double u2) {
  if (u1 < 1e-300) u1 = 1e-300;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

uint32_t Rng::next_u32() {
  const uint64_t o = offset_++;
  return block_at(seed_, o)[o & 3];
}

float Rng::uniform() {
  return float(next_u32() >> 8) * (1.0f / 16777216.0f);
}

double Rng::uniform_double() {
  const uint32_t a = next_u32(), b = next_u32();
  return uniform53(a, b);
}

float Rng::normal() {
  const double u1 = uniform_double(), u2 = uniform_double();
  return box_muller(u1, u2);
}

void Rng::fill_normal(float* p, int64_t n, float scale) {
  const uint64_t base = offset_;
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        uint64_t have = ~uint64_t(0);  // the block counter held in `block`
        std::array<uint32_t, 4> block{};
        auto word = [&](uint64_t o) {
          if ((o >> 2) != have) {
            have = o >> 2;
            block = block_at(seed_, o);
          }
          return block[o & 3];
        };
        for (int64_t i = begin; i < end; i++) {
          const uint64_t o = base + 4 * uint64_t(i);
          const uint32_t w0 = word(o), w1 = word(o + 1), w2 = word(o + 2), w3 = word(o + 3);
          p[i] = box_muller(uniform53(w0, w1), uniform53(w2, w3)) * scale;
        }
      },
      1 << 14);
  offset_ = base + 4 * uint64_t(n);
}

}  // namespace zaya
