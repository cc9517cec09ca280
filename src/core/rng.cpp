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

uint32_t Rng::next_u32() {
  uint64_t o = offset_++;
  auto r = philox4x32({uint32_t(o >> 2), uint32_t(o >> 34), 0, 0},
                      {uint32_t(seed_), uint32_t(seed_ >> 32)});
  return r[o & 3];
}

float Rng::uniform() {
  return float(next_u32() >> 8) * (1.0f / 16777216.0f);
}

double Rng::uniform_double() {
  uint64_t a = next_u32() >> 5, b = next_u32() >> 6;
  return double(a * 67108864 + b) * (1.0 / 9007199254740992.0);
}

namespace {

float box_muller(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  // uniform_double() twice, as normal() draws them.
  double u1 = double(uint64_t(w0 >> 5) * 67108864 + (w1 >> 6)) * (1.0 / 9007199254740992.0);
  const double u2 = double(uint64_t(w2 >> 5) * 67108864 + (w3 >> 6)) * (1.0 / 9007199254740992.0);
  if (u1 < 1e-300) u1 = 1e-300;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

float Rng::normal() {
  const uint32_t a = next_u32(), b = next_u32(), c = next_u32(), d = next_u32();
  return box_muller(a, b, c, d);
}

void Rng::fill_normal(float* p, int64_t n, float scale) {
  const uint64_t base = offset_;
  const std::array<uint32_t, 2> key = {uint32_t(seed_), uint32_t(seed_ >> 32)};
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        uint64_t have = ~uint64_t(0);  // the block counter held in `block`
        std::array<uint32_t, 4> block{};
        auto word = [&](uint64_t o) {
          if ((o >> 2) != have) {
            have = o >> 2;
            block = philox4x32({uint32_t(o >> 2), uint32_t(o >> 34), 0, 0}, key);
          }
          return block[o & 3];
        };
        for (int64_t i = begin; i < end; i++) {
          const uint64_t o = base + 4 * uint64_t(i);
          const uint32_t w0 = word(o), w1 = word(o + 1), w2 = word(o + 2), w3 = word(o + 3);
          p[i] = box_muller(w0, w1, w2, w3) * scale;
        }
      },
      1 << 14);
  offset_ = base + 4 * uint64_t(n);
}

}  // namespace zaya
