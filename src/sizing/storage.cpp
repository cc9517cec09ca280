// The storage-sizing formulas of ZAYA1.md §5 (see storage.h).
#include "sizing/storage.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zaya::sizing {

void IoInput::validate() const {
  auto pos = [](const char* flag, double v) {
    ZAYA_CHECK(v > 0 && std::isfinite(v), "{} must be positive, found {}", flag, v);
  };
  pos("--global-batch", global_batch);
  pos("--seq", seq);
  pos("--bytes-per-token", bytes_per_token);
  pos("--page", page);
  pos("--step-time", step_time);
  pos("--iops", iops);
  ZAYA_CHECK(scatter >= 1 && std::isfinite(scatter),
             "--scatter must be at least 1 (a page's tokens touch at least one page), found {}",
             scatter);
}

IoSizing size_io(const IoInput& in) {
  in.validate();
  IoSizing r;
  r.bytes_per_step = in.global_batch * in.seq * in.bytes_per_token;
  r.pages_per_step = in.scatter * r.bytes_per_step / in.page;
  r.required_iops = r.pages_per_step / in.step_time;
  r.break_even_step_s = r.pages_per_step / in.iops;
  r.headroom = in.iops / r.required_iops;
  return r;
}

nlohmann::json IoSizing::to_json() const {
  return {{"bytes_per_step", bytes_per_step},
          {"pages_per_step", pages_per_step},
          {"required_iops", required_iops},
          {"break_even_step_s", break_even_step_s},
          {"headroom", headroom}};
}

}  // namespace zaya::sizing
