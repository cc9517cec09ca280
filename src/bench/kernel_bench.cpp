// The device-free half of `zaya bench kernels` (kernel_bench.h): from kernel timings to the cost
// model's efficiency rows, the profile update, tables and JSON.
#include "bench/kernel_bench.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sizing/cost_model.h"
#include "sizing/model_shape.h"

namespace zaya::bench {

using sizing::KernelClass;
using sizing::KernelMeasurement;

std::vector<KernelMeasurement> kernel_efficiencies(const ZayaConfig& cfg, int64_t batch,
                                                   int64_t seq,
                                                   const std::vector<KernelTiming>& rows,
                                                   int64_t optimizer_elems, double peak_tflops,
                                                   double copy_gbs) {
  ZAYA_CHECK(peak_tflops > 0 && copy_gbs > 0,
             "kernel efficiencies need a positive bf16 peak and copy bandwidth (found {} TFLOP/s, "
             "{} GB/s)",
             peak_tflops, copy_gbs);
  const int64_t tokens = batch * seq;
  std::vector<KernelMeasurement> out;
  // Attention: one row per timing; its FLOPs are the cost model's (model_shape.cpp).
  for (const auto& r : rows) {
    if (!sizing::kernel_class_is_compute(r.cls) || !(r.us > 0) || !(r.flops > 0)) continue;
    KernelMeasurement k;
    k.cls = r.cls;
    k.shape = r.shape;
    k.work = r.flops * 1e-9;
    k.rate = r.flops / (r.us * 1e-6) / 1e12;
    k.fraction = std::min(1.0, k.rate / peak_tflops);
    k.source = "measured";
    out.push_back(k);
  }
  // Memory-bound classes: the class's kernel time per instance against the bytes the cost model
  // counts for the class's ops per instance (forward + backward).
  std::map<KernelClass, double> seconds;
  for (const auto& r : rows)
    if (r.cls != KernelClass::None && !sizing::kernel_class_is_compute(r.cls) && r.us > 0)
      seconds[r.cls] += r.us * 1e-6 * r.per_instance;
  std::map<KernelClass, double> bytes;
  for (const sizing::Op& o : sizing::forward_ops(cfg, tokens, seq))
    if (o.kind == sizing::OpKind::Memory) bytes[o.cls] += o.bytes + o.bwd_bytes;
  bytes[KernelClass::Optimizer] =
      double(optimizer_elems) *
      (sizing::kOptimizerBytesPerParam + 2 * sizing::kOptimizerBytesPerState);  // AdamW
  for (KernelClass c : sizing::kKernelClasses) {
    if (sizing::kernel_class_is_compute(c) || !seconds.count(c) || !(bytes[c] > 0)) continue;
    KernelMeasurement k;
    k.cls = c;
    k.shape = c == KernelClass::Optimizer
                  ? fmt::format("AdamW n{}", optimizer_elems)
                  : fmt::format("B{} S{} D{} Hq{} Hkv{} d{}", batch, seq, cfg.hidden_size,
                                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    k.work = bytes[c] * 1e-9;
    k.rate = bytes[c] / seconds[c] / 1e9;
    k.fraction = std::min(1.0, k.rate / copy_gbs);
    k.source = "measured";
    out.push_back(k);
  }
  return out;
}

nlohmann::json profile_from_kernels(const std::vector<KernelMeasurement>& eff,
                                    const DeviceInfo& dev) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& k : eff) rows.push_back(sizing::kernel_measurement_json(k));
  return {{"device", dev.name},
          {"sm_count", dev.sm_count},
          {"hbm_capacity_gib", double(dev.global_bytes) / double(1 << 30)},
          {"kernel_efficiency", rows}};
}

std::string kernel_table(const std::vector<KernelTiming>& rows, double peak_tflops,
                         double copy_gbs) {
  std::string o = fmt::format("{:<30} {:<14} {:<34} {:>10} {:>12} {:>9}\n", "kernel", "class",
                              "shape", "ms", "rate", "fraction");
  for (const auto& r : rows) {
    const bool compute = r.flops > 0;
    const double rate = r.us > 0 ? (compute ? r.flops : r.bytes) / (r.us * 1e-6) : 0;
    const std::string rs =
        compute ? fmt::format("{:.1f} TF/s", rate / 1e12) : fmt::format("{:.0f} GB/s", rate / 1e9);
    const double frac = compute ? rate / 1e12 / peak_tflops : rate / 1e9 / copy_gbs;
    o += fmt::format("{:<30} {:<14} {:<34} {:>10.4f} {:>12} {:>9.3f}{}\n", r.name,
                     sizing::kernel_class_name(r.cls), r.shape, r.us * 1e-3, rs, frac,
                     r.below_l2 ? "  (working set < 3x L2)" : "");
  }
  return o;
}

std::string efficiency_table(const std::vector<KernelMeasurement>& eff) {
  std::string o = fmt::format("{:<14} {:<34} {:>12} {:>14} {:>9}\n", "class", "shape", "work",
                              "rate", "fraction");
  for (const auto& k : eff) {
    const bool compute = sizing::kernel_class_is_compute(k.cls);
    o += fmt::format(
        "{:<14} {:<34} {:>12} {:>14} {:>9.3f}\n", sizing::kernel_class_name(k.cls), k.shape,
        compute ? fmt::format("{:.1f} GFLOP", k.work) : fmt::format("{:.3f} GB", k.work),
        compute ? fmt::format("{:.1f} TFLOP/s", k.rate) : fmt::format("{:.0f} GB/s", k.rate),
        k.fraction);
  }
  return o;
}

std::string kernel_results_json(const std::vector<KernelTiming>& rows,
                                const std::vector<KernelMeasurement>& eff, const DeviceInfo& dev,
                                const std::string& model, int64_t batch, int64_t seq,
                                double peak_tflops, double copy_gbs) {
  nlohmann::json ks = nlohmann::json::array();
  for (const auto& r : rows)
    ks.push_back({{"kernel", r.name},
                  {"class", sizing::kernel_class_name(r.cls)},
                  {"shape", r.shape},
                  {"window", r.window},
                  {"time_us", r.us},
                  {"flops", r.flops},
                  {"bytes", r.bytes},
                  {"per_instance", r.per_instance},
                  {"iters", r.iters},
                  {"below_3x_l2", r.below_l2}});
  nlohmann::json es = nlohmann::json::array();
  for (const auto& k : eff) es.push_back(sizing::kernel_measurement_json(k));
  nlohmann::json j = {{"schema", "zaya.bench.kernels/1"},
                      {"device", dev.name},
                      {"sm_count", dev.sm_count},
                      {"model", model},
                      {"batch", batch},
                      {"seq", seq},
                      {"peak_tflops", peak_tflops},
                      {"copy_gbs", copy_gbs},
                      {"kernels", ks},
                      {"efficiency", es}};
  return j.dump(1) + "\n";
}

}  // namespace zaya::bench
