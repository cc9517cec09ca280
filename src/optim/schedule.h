// Learning-rate schedules as pure functions of the optimizer step (0-based: the step about to be
// taken). W = warmup_steps, T = total_steps, lr_max / lr_min from the optimizer config.
//   warmup (all kinds), s < W:   lr = lr_max · (s+1)/W        (the first step is not wasted at lr
//   0) constant, s >= W:            lr = lr_max cosine, s >= W:              p = clamp((s−W)/(T−W),
//   0, 1);  lr = lr_min + (lr_max−lr_min)·½(1+cos πp) wsd (warmup–stable–decay):   D =
//   round(decay_fraction·T), S = T−D (decay start, at least W)
//       W <= s < S:              lr = lr_max
//       s >= S:                  p = clamp((s−S)/(T−S), 0, 1);
//                                linear: lr = lr_max − (lr_max−lr_min)·p
//                                1-sqrt: lr = lr_min + (lr_max−lr_min)·(1 − √p)
// Steps past T stay at the end value. No restarts, no per-phase schedules (a phase change does
// not reset the schedule).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace zaya {

enum class ScheduleKind { Cosine, WSD, Constant };
enum class DecayShape { Linear, OneMinusSqrt };

std::string_view schedule_kind_name(ScheduleKind k);  // "cosine", "wsd", "constant"
ScheduleKind schedule_kind_from_name(std::string_view s, const std::string& where);
std::string_view decay_shape_name(DecayShape d);  // "linear", "1-sqrt"
DecayShape decay_shape_from_name(std::string_view s, const std::string& where);

struct ScheduleSettings {
  ScheduleKind kind = ScheduleKind::Cosine;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;                      // T; must be > 0 (and > warmup for cosine)
  double decay_fraction = 0.2;                  // wsd only
  DecayShape decay_shape = DecayShape::Linear;  // wsd only
  void validate(const std::string& where = "schedule") const;
};

double schedule_lr(const ScheduleSettings& s, double lr_max, double lr_min, int64_t step);

}  // namespace zaya
