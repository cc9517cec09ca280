// Gradient clipping and accumulation; learning-rate schedules at their key steps.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/grad_utils.h"
#include "optim/schedule.h"
#include "optim_test_util.h"

using namespace zaya;
using namespace zaya::testing;

TEST(OptimClip, ReturnsPreClipNormAndScalesToMax) {
  std::vector<ParamRef> ps = {
      random_param("a", {100, 300}, 1), random_param("b", {17}, 2),
      ParamRef{"model.layers.0.mlp.gate.balancing_biases", Tensor::zeros({5}), Tensor()}};
  double ss = 0;
  for (int k = 0; k < 2; k++)
    for (int64_t i = 0; i < ps[k].grad.numel(); i++)
      ss += double(ps[k].grad.f32()[i]) * ps[k].grad.f32()[i];
  const double want = std::sqrt(ss);
  Tensor a0 = ps[0].grad.clone();
  const double max_norm = want / 4;
  const double got = clip_grad_norm(ps, max_norm);
  EXPECT_NEAR(got, want, 1e-9 * want);
  EXPECT_NEAR(std::sqrt(grad_sq_norm(ps)), max_norm, 1e-5 * max_norm);
  EXPECT_NEAR(ps[0].grad.f32()[7], a0.f32()[7] * max_norm / want, 1e-6);
  // Under the threshold, or with clipping disabled, gradients are untouched.
  Tensor a1 = ps[0].grad.clone();
  EXPECT_NEAR(clip_grad_norm(ps, 1e9), max_norm, 1e-5 * max_norm);
  EXPECT_TRUE(bitwise_equal(ps[0].grad, a1));
  clip_grad_norm(ps, 0.0);
  EXPECT_TRUE(bitwise_equal(ps[0].grad, a1));
  // A non-finite norm is reported, not "clipped" into NaNs everywhere.
  ps[1].grad.f32()[0] = NAN;
  EXPECT_TRUE(std::isnan(clip_grad_norm(ps, 1.0)));
  EXPECT_TRUE(bitwise_equal(ps[0].grad, a1));
}

TEST(OptimAccumulate, AveragesMicroBatchGradients) {
  std::vector<ParamRef> ps = {random_param("a", {5, 5}, 1)};
  Tensor g1 = random_tensor({5, 5}, 2), g2 = random_tensor({5, 5}, 3),
         g3 = random_tensor({5, 5}, 4);
  zero_grads(ps);
  for (const Tensor* g : {&g1, &g2, &g3})
    for (int i = 0; i < 25; i++) ps[0].grad.f32()[i] += g->f32()[i];
  average_accumulated_grads(ps, 3);
  for (int i = 0; i < 25; i++)
    EXPECT_NEAR(ps[0].grad.f32()[i], (double(g1.f32()[i]) + g2.f32()[i] + g3.f32()[i]) / 3, 1e-6);
  EXPECT_THROW(average_accumulated_grads(ps, 0), Error);
}

TEST(OptimSchedule, WarmupCosine) {
  ScheduleSettings s{ScheduleKind::Cosine, 100, 1100, 0.2, DecayShape::Linear};
  const double hi = 6e-4, lo = 2e-4;
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 0), hi / 100);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 49), hi / 2);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 99), hi);                // warmup end
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 100), hi);               // cosine start
  EXPECT_NEAR(schedule_lr(s, hi, lo, 600), (hi + lo) / 2, 1e-15);  // half-way: cos(π/2) = 0
  EXPECT_NEAR(schedule_lr(s, hi, lo, 350), lo + (hi - lo) * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 1100), lo);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 5000), lo);
  for (int t = 101; t < 1100; t++)
    ASSERT_LE(schedule_lr(s, hi, lo, t), schedule_lr(s, hi, lo, t - 1));
}

TEST(OptimSchedule, WsdPhasesLinearAndOneMinusSqrt) {
  ScheduleSettings s{ScheduleKind::WSD, 10, 100, 0.2, DecayShape::Linear};
  const double hi = 1.0, lo = 0.1;
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 4), 0.5);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 10), hi);  // stable
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 79), hi);  // last stable step: decay starts at 100−20
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 80), hi);  // p = 0
  EXPECT_NEAR(schedule_lr(s, hi, lo, 90), 0.55, 1e-15);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 100), lo);
  s.decay_shape = DecayShape::OneMinusSqrt;
  EXPECT_NEAR(schedule_lr(s, hi, lo, 85), lo + (hi - lo) * (1 - std::sqrt(0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(schedule_lr(s, hi, lo, 100), lo);
}

TEST(OptimSchedule, ConstantAndValidation) {
  ScheduleSettings s{ScheduleKind::Constant, 4, 10, 0.2, DecayShape::Linear};
  EXPECT_DOUBLE_EQ(schedule_lr(s, 2.0, 0.0, 0), 0.5);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 2.0, 0.0, 9), 2.0);
  EXPECT_DOUBLE_EQ(schedule_lr(s, 2.0, 0.0, 1000), 2.0);
  // Warmup longer than the run (a short smoke run of a long recipe) is allowed: it stays in warmup.
  s.kind = ScheduleKind::Cosine;
  s.warmup_steps = 20;
  EXPECT_NO_THROW(s.validate());
  EXPECT_DOUBLE_EQ(schedule_lr(s, 2.0, 0.0, 9), 1.0);
  s.warmup_steps = -1;
  EXPECT_THROW(s.validate(), Error);
  s.warmup_steps = 0;
  s.total_steps = 0;
  EXPECT_THROW(s.validate(), Error);
  s.total_steps = 10;
  s.kind = ScheduleKind::WSD;
  s.decay_fraction = 1.5;
  EXPECT_THROW(s.validate(), Error);
  EXPECT_THROW(schedule_kind_from_name("linear", "schedule.kind"), Error);
  EXPECT_EQ(decay_shape_from_name("1-sqrt", "x"), DecayShape::OneMinusSqrt);
}
