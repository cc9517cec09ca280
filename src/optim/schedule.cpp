// Learning-rate schedules; formulas in schedule.h.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace zaya {

std::string_view schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Cosine: return "cosine";
    case ScheduleKind::WSD: return "wsd";
    case ScheduleKind::Constant: return "constant";
  }
  return "?";
}

ScheduleKind schedule_kind_from_name(std::string_view s, const std::string& where) {
  if (s == "cosine") return ScheduleKind::Cosine;
  if (s == "wsd") return ScheduleKind::WSD;
  if (s == "constant") return ScheduleKind::Constant;
  fail("{}: unknown schedule '{}' (expected cosine, wsd or constant)", where, s);
}

std::string_view decay_shape_name(DecayShape d) {
  return d == DecayShape::Linear ? "linear" : "1-sqrt";
}

DecayShape decay_shape_from_name(std::string_view s, const std::string& where) {
  if (s == "linear") return DecayShape::Linear;
  if (s == "1-sqrt") return DecayShape::OneMinusSqrt;
  fail("{}: unknown decay shape '{}' (expected linear or 1-sqrt)", where, s);
}

void ScheduleSettings::validate(const std::string& where) const {
  ZAYA_CHECK(warmup_steps >= 0, "{}.warmup_steps must be >= 0, found {}", where, warmup_steps);
  ZAYA_CHECK(total_steps > 0, "{}.total_steps must be > 0, found {}", where, total_steps);
  if (kind == ScheduleKind::WSD)
    ZAYA_CHECK(decay_fraction > 0 && decay_fraction <= 1,
               "{}.decay_fraction must be in (0, 1], found {}", where, decay_fraction);
}

double schedule_lr(const ScheduleSettings& s, double lr_max, double lr_min, int64_t step) {
  const int64_t W = s.warmup_steps, T = s.total_steps;
  if (step < W) return lr_max * double(step + 1) / double(W);
  switch (s.kind) {
    case ScheduleKind::Constant: return lr_max;
    case ScheduleKind::Cosine: {
      const double p = std::clamp(double(step - W) / double(std::max<int64_t>(1, T - W)), 0.0, 1.0);
      return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    }
    case ScheduleKind::WSD: {
      const int64_t D = std::max<int64_t>(1, std::llround(s.decay_fraction * double(T)));
      const int64_t S = std::max(W, T - D);
      if (step < S) return lr_max;
      const double p = std::clamp(double(step - S) / double(std::max<int64_t>(1, T - S)), 0.0, 1.0);
      return s.decay_shape == DecayShape::Linear
                 ? lr_max - (lr_max - lr_min) * p
                 : lr_min + (lr_max - lr_min) * (1.0 - std::sqrt(p));
    }
  }
  return lr_max;
}

}  // namespace zaya
