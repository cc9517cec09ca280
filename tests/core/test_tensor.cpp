#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <thread>

#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"

using namespace zaya;

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even one (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (float v : {0.0f, -2.5f, 3.140625f, 1e30f, -1e-30f})
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(v)),
              v == 1e30f || v == -1e-30f ? bf16_to_f32(f32_to_bf16(v)) : v);
}

TEST(DType, F16RoundTripAndRounding) {
  Rng r(3);
  for (int i = 0; i < 10000; i++) {
    float v = r.normal() * 100.0f;
    float h = f16_to_f32(f32_to_f16(v));
    // relative error of fp16 rounding is at most 2^-11
    EXPECT_LE(std::fabs(h - v), std::fabs(v) * std::ldexp(1.0f, -11) + 6e-8f) << v;
    EXPECT_EQ(f32_to_f16(h), f32_to_f16(v));
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
}

TEST(Tensor, ViewsShareStorageAndSliceOffsets) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F32);
  for (int i = 0; i < 24; i++) t.f32()[i] = float(i);
  Tensor s = t.select(0, 1);
  EXPECT_EQ(s.shape(), (Shape{3, 4}));
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.f32()[0], 12.0f);
  Tensor c = t.slice(2, 1, 3);
  EXPECT_FALSE(c.is_contiguous());
  Tensor cc = c.clone();
  EXPECT_EQ(cc.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(cc.f32()[0], 1.0f);
  EXPECT_EQ(cc.f32()[1], 2.0f);
  EXPECT_EQ(cc.f32()[2], 5.0f);
  EXPECT_EQ(cc.f32()[11], 22.0f);
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.slice(1, 2, 5), Error);
}

TEST(Tensor, DtypeConversions) {
  Tensor t = Tensor::from_vector({1.5f, -2.0f, 3.25f, 1e-3f}, {4});
  Tensor b = t.to(DType::BF16);
  Tensor back = b.to(DType::F32);
  for (int i = 0; i < 4; i++) EXPECT_EQ(back.f32()[i], bf16_to_f32(f32_to_bf16(t.f32()[i])));
  Tensor i32 = Tensor::empty({3}, DType::I32);
  i32.data<int32_t>()[0] = -5;
  i32.data<int32_t>()[1] = 7;
  i32.data<int32_t>()[2] = 1 << 20;
  Tensor u = i32.to(DType::I64);
  EXPECT_EQ(u.data<int64_t>()[0], -5);
  EXPECT_EQ(u.data<int64_t>()[2], 1 << 20);
  EXPECT_THROW(i32.data<float>() == nullptr ? 0 : i32.data<double>()[0], Error);
}

// Conversions of tensors spanning several 64K-element blocks (converted in parallel): every
// element equals its scalar conversion, including the last, partial block; bf16 -> f16 goes
// through fp32.
TEST(Tensor, LargeDtypeConversionsMatchScalarConversions) {
  const int64_t n = 3 * (int64_t(1) << 16) + 7;
  Tensor t = Tensor::empty({n}, DType::F32);
  Rng r(11);
  for (int64_t i = 0; i < n; i++) t.f32()[i] = r.normal() * 100.0f;
  t.f32()[n - 1] = -7.0e4f;  // beyond fp16's range: rounds to -inf there
  const int prev = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    const Tensor b = t.to(DType::BF16), h = b.to(DType::F16), back = h.to(DType::F32);
    const uint16_t* bp = b.data<uint16_t>();
    const uint16_t* hp = h.data<uint16_t>();
    for (int64_t i = 0; i < n; i++) {
      ASSERT_EQ(bp[i], f32_to_bf16(t.f32()[i])) << i;
      ASSERT_EQ(hp[i], f32_to_f16(bf16_to_f32(bp[i]))) << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(back.f32()[i]), std::bit_cast<uint32_t>(f16_to_f32(hp[i])))
          << i;
    }
  }
  set_num_threads(prev);
}

TEST(Parallel, CoversRangeExactlyOnceAndPropagatesErrors) {
  std::vector<int> hits(10007, 0);
  parallel_for(int64_t(hits.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) hits[size_t(i)]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_THROW(parallel_for(100,
                            [](int64_t b, int64_t) {
                              if (b == 0) throw Error("boom");
                            }),
               Error);
}

// zero_bytes: every byte zeroed, none past the end touched, below and above the threaded size
// (64 MiB) and at sizes that do not divide into pages; from a thread outside the pool too.
TEST(Parallel, ZeroBytesClearsExactlyTheRange) {
  const int prev = num_threads();
  set_num_threads(4);
  for (size_t bytes : {size_t(0), size_t(1) << 20, (size_t(80) << 20) + 12345}) {
    std::vector<unsigned char> buf(bytes + 64, 0xab);
    zero_bytes(buf.data(), bytes);
    EXPECT_EQ(std::count(buf.begin(), buf.begin() + std::ptrdiff_t(bytes), 0),
              std::ptrdiff_t(bytes))
        << bytes;
    EXPECT_EQ(std::count(buf.begin() + std::ptrdiff_t(bytes), buf.end(), 0xab), 64) << bytes;
  }
  std::vector<unsigned char> big((size_t(70) << 20) + 1, 0xcd);
  std::thread([&] { zero_bytes(big.data(), big.size() - 1); }).join();
  EXPECT_EQ(std::count(big.begin(), big.end() - 1, 0), std::ptrdiff_t(big.size() - 1));
  EXPECT_EQ(big.back(), 0xcd);
  set_num_threads(prev);
}

TEST(Rng, CounterBasedStreamsAreReproducible) {
  Rng a(42), b(42);
  for (int i = 0; i < 100; i++) ASSERT_EQ(a.next_u32(), b.next_u32());
  Rng c(42, 57);
  Rng d(42);
  for (int i = 0; i < 57; i++) d.next_u32();
  EXPECT_EQ(c.next_u32(), d.next_u32());
  // mean and variance of the normal sampler
  Rng n(1);
  double s = 0, s2 = 0;
  const int N = 200000;
  for (int i = 0; i < N; i++) {
    double x = n.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / N, 0.0, 0.01);
  EXPECT_NEAR(s2 / N, 1.0, 0.02);
}

// fill_normal (the model's initialisation) must give exactly what drawing normal() n times gives,
// whatever the thread count and even from an offset that is not a Philox block boundary.
TEST(Rng, FillNormalEqualsSequentialDrawsOnAnyThreadCount) {
  const int prev = num_threads();
  for (uint64_t start : {uint64_t(0), uint64_t(3), uint64_t(1u << 20) + 2}) {
    const int64_t n = 50001;  // several worker chunks and an odd tail
    Rng seq(7, start);
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) {
      // Box-Muller from two 53-bit uniforms of the sequential stream (normal()'s definition).
      auto uniform53 = [&] {
        const uint64_t a = seq.next_u32() >> 5, b = seq.next_u32() >> 6;
        return double(a * 67108864 + b) / 9007199254740992.0;
      };
      double u1 = uniform53();
      const double u2 = uniform53();
      if (u1 < 1e-300) u1 = 1e-300;
      want[size_t(i)] =
          float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)) * 0.02f;
    }
    for (int threads : {1, 2, 5}) {
      set_num_threads(threads);
      Rng par(7, start);
      std::vector<float> got(static_cast<size_t>(n), -1.0f);
      par.fill_normal(got.data(), n, 0.02f);
      for (int64_t i = 0; i < n; i++)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]), std::bit_cast<uint32_t>(want[size_t(i)]))
            << "element " << i << ", start " << start << ", " << threads << " threads";
      EXPECT_EQ(par.offset(), seq.offset());
      EXPECT_EQ(par.next_u32(), Rng(7, seq.offset()).next_u32());
    }
  }
  set_num_threads(prev);
}
