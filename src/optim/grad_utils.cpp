// Gradient zeroing, averaging and global-norm clipping; see grad_utils.h.
#include "optim/grad_utils.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace zaya {

namespace {

constexpr int64_t kBlock =
    1 << 14;  // fixed reduction block: the sum order never depends on threads

template <typename F>
void for_each_grad(const std::vector<ParamRef>& params, const char* who, F&& f) {
  for (const auto& p : params) {
    if (!p.grad.defined()) continue;
    ZAYA_CHECK(
        p.grad.dtype() == DType::F32 && p.grad.device() == Device::CPU && p.grad.is_contiguous(),
        "{}: gradient of '{}' must be a contiguous F32 host tensor", who, p.name);
    f(p.grad.f32(), p.grad.numel());
  }
}

}  // namespace

void zero_grads(const std::vector<ParamRef>& params) {
  for_each_grad(params, "zero_grads", [](float* g, int64_t n) { std::fill(g, g + n, 0.0f); });
}

void scale_grads(const std::vector<ParamRef>& params, float factor) {
  for_each_grad(params, "scale_grads", [&](float* g, int64_t n) {
    parallel_for(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; i++) g[i] *= factor;
        },
        kBlock);
  });
}

void average_accumulated_grads(const std::vector<ParamRef>& params, int64_t micro_batches) {
  ZAYA_CHECK(micro_batches >= 1, "average_accumulated_grads: micro_batches must be >= 1, got {}",
             micro_batches);
  if (micro_batches > 1) scale_grads(params, float(1.0 / double(micro_batches)));
}

double grad_sq_norm(const std::vector<ParamRef>& params) {
  double total = 0.0;
  std::vector<double> partial;
  for_each_grad(params, "grad_sq_norm", [&](float* g, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    partial.assign(size_t(blocks), 0.0);
    parallel_for(blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b++) {
        double s = 0.0;
        for (int64_t i = b * kBlock, e = std::min(n, (b + 1) * kBlock); i < e; i++)
          s += double(g[i]) * double(g[i]);
        partial[size_t(b)] = s;
      }
    });
    for (double s : partial) total += s;
  });
  return total;
}

void clip_grads_to_norm(const std::vector<ParamRef>& params, double max_norm, double norm) {
  if (max_norm <= 0 || !std::isfinite(norm) || norm <= max_norm) return;
  scale_grads(params, float(max_norm / (norm + 1e-6)));
}

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm) {
  const double norm = std::sqrt(grad_sq_norm(params));
  clip_grads_to_norm(params, max_norm, norm);
  return norm;
}

}  // namespace zaya
