// Built-in hardware profiles (vendor datasheet figures, each with its source) and the reader for
// measured "zaya.hardware/1" profiles. Bandwidths are stored one-way in GB/s (1e9 bytes/s); vendors
// quote NVLink and Infinity Fabric as bidirectional totals, so those are halved here. HBM capacity
// is in GiB: vendors' "GB" for HBM is the stack size in GiB (nvidia-smi shows 81559 MiB on an
// H100).
#include "sizing/hardware.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"

namespace zaya::sizing {

using nlohmann::json;

namespace {

std::string lower_alnum(const std::string& s) {
  std::string r;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      r += char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

HardwareProfile mi300x() {
  HardwareProfile h;
  h.key = "mi300x";
  h.device = "AMD Instinct MI300X";
  h.compute_units = 304;  // AMD Instinct MI300X datasheet: 304 compute units
  h.cu_name = "CU";
  // CDNA3 ISA: v_mfma_f32_32x32x8_bf16. hipBLASLt's large bf16 GEMMs on MI300X mostly use 256x256
  // macro tiles (one per CU), which is what wave quantization counts.
  h.mma_m = 32, h.mma_n = 32, h.mma_k = 8;
  h.tile_m = 256, h.tile_n = 256;
  h.peak_bf16_tflops = 1307.4;  // MI300X datasheet: 1307.4 TFLOPS bf16 dense (2614.9 with sparsity)
  h.peak_fp8_tflops = 2614.9;   // MI300X datasheet: 2614.9 TFLOPS fp8 dense
  h.hbm_gib = 192;              // MI300X datasheet: 192 GB HBM3
  h.hbm_peak_gbs = 5300;        // MI300X datasheet: 5.3 TB/s peak (ZAYA1 measured ~4.33 TB/s)
  h.h2d_gbs = 64;               // PCIe Gen5 x16, one way
  h.topology = Topology::FullyConnected;
  h.gpus_per_node = 8;
  h.links_per_gpu = 7;  // MI300X datasheet: 7 Infinity Fabric links, 128 GB/s peak each (both ways)
  h.link_gbs = 64;
  h.nic_gbs = 50;  // ZAYA1 cluster: one AMD Pollara 400 Gb/s NIC per GPU
  return h;
}

HardwareProfile mi325x() {
  HardwareProfile h = mi300x();
  h.key = "mi325x";
  h.device = "AMD Instinct MI325X";
  // AMD Instinct MI325X datasheet: same CDNA3 die and compute as MI300X (304 CUs, 1307.4 TFLOPS
  // bf16 dense, 2614.9 fp8 dense), 256 GB HBM3E at 6 TB/s, 7 Infinity Fabric links at 128 GB/s.
  h.hbm_gib = 256;
  h.hbm_peak_gbs = 6000;
  h.nic_gbs = 50;  // 400 Gb/s per GPU, as on MI300X platforms
  return h;
}

HardwareProfile hopper(const std::string& key, const std::string& device, double hbm_gib,
                       double hbm_gbs) {
  HardwareProfile h;
  h.key = key;
  h.device = device;
  h.compute_units = 132;  // H100/H200 SXM datasheets: 132 SMs
  h.cu_name = "SM";
  // Hopper wgmma.m64nNk16 (N up to 256); cuBLAS/CUTLASS large bf16 GEMMs use 128x256 CTA tiles.
  h.mma_m = 64, h.mma_n = 256, h.mma_k = 16;
  h.tile_m = 128, h.tile_n = 256;
  h.peak_bf16_tflops = 989.4;  // H100/H200 SXM datasheets: 1979 TFLOPS bf16 with sparsity, /2 dense
  h.peak_fp8_tflops = 1978.9;  // 3958 TFLOPS fp8 with sparsity, /2 dense
  h.hbm_gib = hbm_gib;
  h.hbm_peak_gbs = hbm_gbs;
  h.h2d_gbs = 64;  // PCIe Gen5 x16, one way
  h.topology = Topology::Switch;
  h.gpus_per_node = 8;
  h.gpu_fabric_gbs = 450;  // NVLink 4: 900 GB/s per GPU both ways (18 links), via NVSwitch
  h.nic_gbs = 50;          // DGX/HGX H100/H200: one ConnectX-7 400 Gb/s per GPU
  return h;
}

HardwareProfile b200() {
  HardwareProfile h;
  h.key = "b200";
  h.device = "NVIDIA B200";
  h.compute_units = 148;  // Blackwell B200: 148 SMs (2 dies x 74)
  h.cu_name = "SM";
  // tcgen05.mma m128n256k16 per SM; CUTLASS's large bf16 GEMMs use 128x256 tiles per SM.
  h.mma_m = 128, h.mma_n = 256, h.mma_k = 16;
  h.tile_m = 128, h.tile_n = 256;
  h.peak_bf16_tflops = 2250;  // NVIDIA HGX B200 datasheet: 36 PFLOPS bf16 per 8 GPUs with sparsity
  h.peak_fp8_tflops = 4500;   // HGX B200: 72 PFLOPS fp8 per 8 GPUs with sparsity -> 4.5 dense
  h.hbm_gib = 180;            // DGX B200 datasheet: 1,440 GB per 8 GPUs
  h.hbm_peak_gbs = 8000;      // HGX B200: 64 TB/s per 8 GPUs
  h.h2d_gbs = 64;             // PCIe Gen5 x16, one way
  h.topology = Topology::Switch;
  h.gpus_per_node = 8;
  h.gpu_fabric_gbs = 900;  // NVLink 5: 1.8 TB/s per GPU both ways
  h.nic_gbs = 50;          // DGX B200: 8x ConnectX-7 400 Gb/s
  return h;
}

HardwareProfile a100() {
  HardwareProfile h;
  h.key = "a100";
  h.device = "NVIDIA A100 SXM4 80GB";
  h.compute_units = 108;  // NVIDIA A100 datasheet / Ampere whitepaper: 108 SMs
  h.cu_name = "SM";
  // mma.sync.m16n8k16 bf16; cuBLAS large GEMMs on Ampere use 256x128 (here 128x256) CTA tiles.
  h.mma_m = 16, h.mma_n = 8, h.mma_k = 16;
  h.tile_m = 128, h.tile_n = 256;
  h.peak_bf16_tflops = 312;  // A100 datasheet: 312 TFLOPS bf16 dense (624 with sparsity)
  h.peak_fp8_tflops = 0;     // no fp8 tensor cores on Ampere
  h.hbm_gib = 80;            // A100 80GB datasheet: 80 GB HBM2e
  h.hbm_peak_gbs = 2039;     // A100 80GB SXM datasheet: 2,039 GB/s
  h.h2d_gbs = 32;            // PCIe Gen4 x16, one way
  h.topology = Topology::Switch;
  h.gpus_per_node = 8;
  h.gpu_fabric_gbs = 300;  // NVLink 3: 600 GB/s per GPU both ways
  h.nic_gbs = 25;          // DGX A100: ConnectX-6 200 Gb/s per GPU
  return h;
}

struct Builtin {
  const char* name;
  HardwareProfile (*make)();
};
HardwareProfile h100() {
  return hopper("h100", "NVIDIA H100 SXM5 80GB", 80, 3350);
}  // 3.35 TB/s
HardwareProfile h200() {
  return hopper("h200", "NVIDIA H200 SXM 141GB", 141, 4800);
}  // 4.8 TB/s

const Builtin kBuiltins[] = {{"mi300x", mi300x}, {"mi325x", mi325x}, {"h100", h100},
                             {"h200", h200},     {"b200", b200},     {"a100", a100}};

// Default kernel efficiencies of a built-in profile, stored as achieved rates (fraction × the
// datasheet figure) so that a measured profile that replaces the peak or the copy bandwidth but
// measures no kernels keeps the same absolute rates. One row per class: it applies at any work.
void add_default_kernels(HardwareProfile& h) {
  using KC = KernelClass;
  // ZAYA1-base's attention at 4 x 4096 tokens: 137 GFLOP forward, 2.5x that backward; with a
  // single row per class the work only labels it.
  const double fwd_gflop = 4.0 * 16384 * 2048 * 8 * 128 * 1e-9;
  auto att = [&](double f_fwd, double f_bwd, const std::string& src) {
    h.kernels.push_back(
        {KC::AttentionFwd, "default", fwd_gflop, f_fwd * h.peak_bf16_tflops, f_fwd, src});
    h.kernels.push_back({KC::AttentionBwd, "default", kAttentionBwdFlopFactor * fwd_gflop,
                         f_bwd * h.peak_bf16_tflops, f_bwd, src});
  };
  if (h.key == "h100" || h.key == "h200") {
    // FlashAttention-3 (Shah et al. 2024), H100 SXM5, bf16/fp16, head dim 128: forward up to
    // 740 TFLOP/s (75%) without a mask, less with the causal mask; backward 542 TFLOP/s (55%) at
    // 4K tokens. Taken as 0.60 forward (causal) and 0.55 backward; the H200 has the same SMs.
    att(0.60, 0.55,
        "FlashAttention-3 paper, H100 SXM5, head dim 128 (causal forward rounded down)");
  } else if (h.key == "a100") {
    // FlashAttention-2 (Dao 2023): forward 50-73% of the A100's peak; its backward runs below
    // its forward. Taken as 0.60 forward, 0.50 backward (the backward figure is an assumption).
    att(0.60, 0.50, "FlashAttention-2 paper, A100 (forward 50-73% of peak; backward assumed 0.50)");
  } else if (h.key == "b200") {
    att(0.60, 0.55,
        "assumption: the Hopper (FlashAttention-3) fractions; no Blackwell figure here");
  } else {
    // MI300X / MI325X: no vendor attention figure is recorded here. Dense bf16 GEMMs reach a
    // smaller fraction of the MI300X datasheet than of Hopper's, so attention is assumed lower.
    att(0.40, 0.30, "assumption: no vendor attention figure recorded for CDNA3");
  }
  // Memory-bound classes, as fractions of the datasheet bandwidth (the built-in copy rate): an
  // assumption. A device copy reaches 82% (MI300X, ZAYA1.md §5) to 89% (H200, measured
  // 2026-12-03) of the datasheet, and a fused elementwise kernel most of a copy; the loss and the
  // optimizer stream long contiguous rows, the norms reduce over rows, CCA's grouped convolution
  // runs on CUDA cores / vector ALUs.
  const std::string mem_src = "assumption: fraction of the datasheet HBM bandwidth";
  for (auto [c, f] : {std::pair{KC::NormResidual, 0.70},
                      {KC::Elementwise, 0.70},
                      {KC::Cca, 0.50},
                      {KC::Loss, 0.80},
                      {KC::Optimizer, 0.80}})
    h.kernels.push_back({c, "default", 1.0, f * h.hbm_peak_gbs, f, mem_src});
}

void finish_builtin(HardwareProfile& h) {
  h.origin = "built-in";
  h.datasheet_bf16_tflops = h.peak_bf16_tflops;
  // Without measurements the datasheet bandwidth stands in for the copy and read rates.
  h.copy_gbs = h.hbm_peak_gbs;
  h.read_gbs = h.hbm_peak_gbs;
  h.knee_gflop = 200;  // ZAYA1.md §5: ~200 GFLOP of work per GEMM to approach peak (MI300X)
  add_default_kernels(h);
}

double interp_log(double x, double x0, double x1, double y0, double y1) {
  if (x1 <= x0) return y0;
  double t = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
  return y0 + std::clamp(t, 0.0, 1.0) * (y1 - y0);
}

// Piecewise-linear in log(x) through sorted (x, y) points, clamped at the ends.
double interp_table(std::vector<std::pair<double, double>> pts, double x) {
  std::sort(pts.begin(), pts.end());
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  for (size_t i = 1; i < pts.size(); ++i)
    if (x <= pts[i].first)
      return interp_log(x, pts[i - 1].first, pts[i].first, pts[i - 1].second, pts[i].second);
  return pts.back().second;
}

}  // namespace

double HardwareProfile::gemm_flops_per_s(double gflop) const {
  std::vector<std::pair<double, double>> pts;
  for (auto& g : gemm) {
    if (g.dtype != "bf16") continue;
    double tf = g.tflops > 0 ? g.tflops : g.fraction * peak_bf16_tflops;
    if (tf > 0 && g.work_gflop() > 0) pts.push_back({g.work_gflop(), tf});
  }
  if (pts.empty() || gflop <= 0) return peak_bf16_tflops * 1e12;
  return interp_table(pts, gflop) * 1e12;
}

double HardwareProfile::kernel_rate(KernelClass c, double work) const {
  const bool compute = kernel_class_is_compute(c);
  const double ref = compute ? peak_bf16_tflops : copy_gbs;  // TFLOP/s or GB/s
  const double unit = compute ? 1e12 : 1e9;
  std::vector<std::pair<double, double>> pts;
  for (const auto& k : kernels) {
    if (k.cls != c) continue;
    const double r = k.rate > 0 ? k.rate : k.fraction * ref;
    if (r > 0 && k.work > 0) pts.push_back({k.work, r});
  }
  if (pts.empty()) return ref * unit;
  if (!(work > 0)) work = pts.front().first;
  return interp_table(pts, work) * unit;
}

double HardwareProfile::kernel_fraction(KernelClass c, double work) const {
  const bool compute = kernel_class_is_compute(c);
  const double ref = compute ? peak_bf16_tflops * 1e12 : copy_gbs * 1e9;
  return ref > 0 ? kernel_rate(c, work) / ref : 0.0;
}

HardwareProfile HardwareProfile::roofline() const {
  HardwareProfile h = *this;
  h.kernels.clear();
  return h;
}

double HardwareProfile::intra_node_busbw(int n) const {
  if (n <= 1) return std::numeric_limits<double>::infinity();
  if (topology == Topology::FullyConnected)
    return double(std::min(n - 1, links_per_gpu)) * link_gbs * 1e9;
  return gpu_fabric_gbs * 1e9;
}

double HardwareProfile::busbw_bytes_per_s(const std::string& op, int ranks, double bytes) const {
  if (ranks <= 1) return std::numeric_limits<double>::infinity();
  const bool multi_node = ranks > gpus_per_node;
  // Measured rows count only from the same side of the node boundary: an 8-GPU measurement says
  // nothing about the NIC that a 1024-rank collective crosses.
  std::vector<const CollectiveMeasurement*> rows;
  for (auto& c : collectives)
    if (c.op == op && c.busbw_gbs > 0 && c.bytes > 0 && (c.ranks > gpus_per_node) == multi_node)
      rows.push_back(&c);
  if (!rows.empty()) {
    double best = std::numeric_limits<double>::infinity();
    for (auto* r : rows) best = std::min(best, std::abs(std::log(double(r->ranks) / ranks)));
    std::vector<std::pair<double, double>> pts;
    for (auto* r : rows)
      if (std::abs(std::log(double(r->ranks) / ranks)) <= best + 1e-12)
        pts.push_back({r->bytes, r->busbw_gbs});
    return interp_table(pts, bytes) * 1e9;
  }
  double intra = intra_node_busbw(std::min(ranks, gpus_per_node));
  if (!multi_node) return intra;
  return std::min(intra, nic_gbs * 1e9);
}

json HardwareProfile::to_json() const {
  json j = {{"key", key},
            {"device", device},
            {"origin", origin},
            {"measured", measured},
            {"compute_units", compute_units},
            {"cu_name", cu_name},
            {"mma_tile", {mma_m, mma_n, mma_k}},
            {"gemm_tile", {tile_m, tile_n}},
            {"peak_bf16_tflops", peak_bf16_tflops},
            {"peak_fp8_tflops", peak_fp8_tflops},
            {"datasheet_bf16_tflops", datasheet_bf16_tflops},
            {"hbm_gib", hbm_gib},
            {"hbm_peak_gbs", hbm_peak_gbs},
            {"copy_gbs", copy_gbs},
            {"read_gbs", read_gbs},
            {"h2d_gbs", h2d_gbs},
            {"knee_gflop", knee_gflop},
            {"topology", topology == Topology::FullyConnected ? "fully_connected" : "switch"},
            {"gpus_per_node", gpus_per_node},
            {"nic_gbs", nic_gbs},
            {"gemm_measurements", gemm.size()},
            {"collective_measurements", collectives.size()}};
  json ke = json::array();
  for (const auto& k : kernels) {
    json r = kernel_measurement_json(k);
    // The fraction the cost model uses now (a rate row against this profile's peak or copy).
    r["fraction"] = kernel_fraction(k.cls, k.work);
    ke.push_back(r);
  }
  j["kernel_efficiency"] = ke;
  if (topology == Topology::FullyConnected) {
    j["links_per_gpu"] = links_per_gpu;
    j["link_gbs"] = link_gbs;
  } else {
    j["gpu_fabric_gbs"] = gpu_fabric_gbs;
  }
  return j;
}

const char* kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::AttentionFwd: return "attention_fwd";
    case KernelClass::AttentionBwd: return "attention_bwd";
    case KernelClass::NormResidual: return "norm_residual";
    case KernelClass::Elementwise: return "elementwise";
    case KernelClass::Cca: return "cca";
    case KernelClass::Loss: return "loss";
    case KernelClass::Optimizer: return "optimizer";
    case KernelClass::None: break;
  }
  return "";
}

bool kernel_class_from_name(const std::string& name, KernelClass* out) {
  for (KernelClass c : kKernelClasses)
    if (name == kernel_class_name(c)) {
      *out = c;
      return true;
    }
  return false;
}

json kernel_measurement_json(const KernelMeasurement& k) {
  json r = {{"class", kernel_class_name(k.cls)}, {"shape", k.shape}, {"work", k.work}};
  if (k.rate > 0) r[kernel_class_is_compute(k.cls) ? "tflops" : "gbs"] = k.rate;
  if (k.fraction > 0) r["fraction"] = k.fraction;
  if (!k.source.empty()) r["source"] = k.source;
  return r;
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> n;
  for (auto& b : kBuiltins) n.push_back(b.name);
  return n;
}

static std::string known_list() {
  std::string s;
  for (auto& b : kBuiltins) s += std::string(s.empty() ? "" : ", ") + b.name;
  return s;
}

std::string match_builtin_device(const std::string& device_name) {
  const std::string n = lower_alnum(device_name);
  // Longer, more specific names first is not needed: no built-in name contains another.
  for (auto& b : kBuiltins)
    if (n.find(b.name) != std::string::npos) return b.name;
  return "";
}

HardwareProfile builtin_hardware(const std::string& name) {
  std::string n = lower_alnum(name);
  for (const char* suffix : {"sxm5", "sxm4", "sxm"})
    if (n.size() > std::strlen(suffix) && n.ends_with(suffix))
      n.resize(n.size() - std::strlen(suffix));
  for (auto& b : kBuiltins) {
    if (n == b.name) {
      HardwareProfile h = b.make();
      finish_builtin(h);
      return h;
    }
  }
  fail(
      "unknown hardware '{}' (known: {}; or the path of a measured profile JSON from `zaya bench`)",
      name, known_list());
}

namespace {

double num(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  ZAYA_CHECK(v.is_number(), "{}: field '{}' must be a number, found {}", where, key, v.dump());
  return v.get<double>();
}

// Reads j[key] into *out when present and not null; checks it is a positive number.
bool opt_pos(const json& j, const char* key, double* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  ZAYA_CHECK(it->is_number(), "{}: field '{}' must be a number, found {}", where, key, it->dump());
  double v = it->get<double>();
  ZAYA_CHECK(v > 0 && std::isfinite(v), "{}: field '{}' must be positive, found {}", where, key, v);
  *out = v;
  return true;
}

}  // namespace

HardwareProfile hardware_from_json(const json& j, const std::string& where) {
  ZAYA_CHECK(j.is_object(), "{}: expected a JSON object (a \"zaya.hardware/1\" profile)", where);
  ZAYA_CHECK(j.contains("schema") && j["schema"].is_string(),
             "{}: missing field 'schema' (expected \"zaya.hardware/1\")", where);
  ZAYA_CHECK(j["schema"] == "zaya.hardware/1", "{}: schema is {}, expected \"zaya.hardware/1\"",
             where, j["schema"].dump());
  ZAYA_CHECK(
      j.contains("device") && j["device"].is_string() && !j["device"].get<std::string>().empty(),
      "{}: missing field 'device' (the device name, e.g. \"NVIDIA H200\")", where);
  const std::string device = j["device"].get<std::string>();
  const std::string key = match_builtin_device(device);

  HardwareProfile h;
  if (!key.empty()) {
    h = builtin_hardware(key);
  } else {
    // An unknown device has no datasheet to fall back on: the fields that every rule needs must be
    // measured. Tiles default to the common 128x128, and the interconnect stays unknown unless
    // the profile carries collective measurements.
    for (const char* f : {"sm_count", "hbm_capacity_gib", "copy_bandwidth_gbs"})
      ZAYA_CHECK(j.contains(f),
                 "{}: device '{}' is not a built-in profile (known: {}), so field "
                 "'{}' is required",
                 where, device, known_list(), f);
    ZAYA_CHECK(j.contains("peak_tflops") && j["peak_tflops"].contains("bf16"),
               "{}: device '{}' is not a built-in profile (known: {}), so field 'peak_tflops.bf16' "
               "is required",
               where, device, known_list());
    h.mma_m = h.mma_n = h.mma_k = 16;
    h.tile_m = h.tile_n = 128;
    h.gpus_per_node = 8;
    h.knee_gflop = 200;
  }
  h.device = device;
  h.origin = where;
  h.measured = true;

  double v = 0;
  if (opt_pos(j, "sm_count", &v, where)) h.compute_units = int(v);
  if (j.contains("peak_tflops") && !j["peak_tflops"].is_null()) {
    const json& p = j["peak_tflops"];
    ZAYA_CHECK(p.is_object(), "{}: field 'peak_tflops' must be an object {{\"bf16\", \"fp8\"}}",
               where);
    opt_pos(p, "bf16", &h.peak_bf16_tflops, where + " peak_tflops");
    opt_pos(p, "fp8", &h.peak_fp8_tflops, where + " peak_tflops");
  }
  opt_pos(j, "hbm_capacity_gib", &h.hbm_gib, where);
  bool have_copy = opt_pos(j, "copy_bandwidth_gbs", &h.copy_gbs, where);
  bool have_read = opt_pos(j, "read_bandwidth_gbs", &h.read_gbs, where);
  // A measured copy rate without a read rate: reads stream at least as fast as copies.
  if (have_copy && !have_read) h.read_gbs = std::max(h.read_gbs, h.copy_gbs);
  if (have_read && !have_copy && h.copy_gbs == 0) h.copy_gbs = h.read_gbs;
  if (h.hbm_peak_gbs == 0) h.hbm_peak_gbs = std::max(h.copy_gbs, h.read_gbs);
  opt_pos(j, "h2d_pinned_gbs", &h.h2d_gbs, where);
  if (j.contains("knee_gflop") && !j["knee_gflop"].is_null()) {
    const json& k = j["knee_gflop"];
    ZAYA_CHECK(k.is_object(), "{}: field 'knee_gflop' must be an object {{\"p80\", \"p90\"}}",
               where);
    opt_pos(k, "p80", &h.knee_p80_gflop, where + " knee_gflop");
    if (!opt_pos(k, "p90", &h.knee_gflop, where + " knee_gflop") && h.knee_p80_gflop > 0)
      h.knee_gflop = h.knee_p80_gflop;  // p80 is the only measured knee: better than the default
  }
  if (j.contains("gemm_efficiency") && !j["gemm_efficiency"].is_null()) {
    ZAYA_CHECK(j["gemm_efficiency"].is_array(), "{}: field 'gemm_efficiency' must be an array",
               where);
    size_t i = 0;
    for (const json& r : j["gemm_efficiency"]) {
      std::string w = fmt::format("{} gemm_efficiency[{}]", where, i++);
      ZAYA_CHECK(r.is_object(), "{}: expected an object", w);
      for (const char* f : {"m", "n", "k"})
        ZAYA_CHECK(r.contains(f) && r[f].is_number() && r[f].get<double>() > 0,
                   "{}: field '{}' must be a positive number", w, f);
      GemmMeasurement g;
      g.m = r["m"].get<int64_t>(), g.n = r["n"].get<int64_t>(), g.k = r["k"].get<int64_t>();
      if (r.contains("dtype")) g.dtype = r["dtype"].get<std::string>();
      if (r.contains("tflops")) g.tflops = num(r, "tflops", w);
      if (r.contains("fraction")) g.fraction = num(r, "fraction", w);
      ZAYA_CHECK(g.tflops > 0 || g.fraction > 0, "{}: needs a positive 'tflops' or 'fraction'", w);
      h.gemm.push_back(g);
    }
  }
  if (j.contains("collectives") && !j["collectives"].is_null()) {
    ZAYA_CHECK(j["collectives"].is_array(), "{}: field 'collectives' must be an array", where);
    size_t i = 0;
    for (const json& r : j["collectives"]) {
      std::string w = fmt::format("{} collectives[{}]", where, i++);
      ZAYA_CHECK(r.is_object() && r.contains("op") && r["op"].is_string(),
                 "{}: expected an object with a string 'op'", w);
      CollectiveMeasurement c;
      c.op = r["op"].get<std::string>();
      for (const char* f : {"ranks", "bytes", "busbw_gbs"})
        ZAYA_CHECK(r.contains(f) && r[f].is_number() && r[f].get<double>() > 0,
                   "{}: field '{}' must be a positive number", w, f);
      c.ranks = r["ranks"].get<int>();
      c.bytes = r["bytes"].get<double>();
      c.busbw_gbs = r["busbw_gbs"].get<double>();
      if (r.contains("backend") && r["backend"].is_string())
        c.backend = r["backend"].get<std::string>();
      h.collectives.push_back(c);
    }
  }
  if (j.contains("kernel_efficiency") && !j["kernel_efficiency"].is_null()) {
    ZAYA_CHECK(j["kernel_efficiency"].is_array(),
               "{}: field 'kernel_efficiency' must be an array of rows {{\"class\", \"work\", "
               "\"tflops\" or \"gbs\", \"fraction\"}}",
               where);
    std::vector<KernelMeasurement> rows;
    size_t i = 0;
    for (const json& r : j["kernel_efficiency"]) {
      const std::string w = fmt::format("{} kernel_efficiency[{}]", where, i++);
      ZAYA_CHECK(r.is_object(), "{}: expected an object, found {}", w, r.dump());
      ZAYA_CHECK(r.contains("class") && r["class"].is_string(),
                 "{}: field 'class' must be a string (one of attention_fwd, attention_bwd, "
                 "norm_residual, elementwise, cca, loss, optimizer)",
                 w);
      KernelMeasurement k;
      const std::string cname = r["class"].get<std::string>();
      ZAYA_CHECK(kernel_class_from_name(cname, &k.cls),
                 "{}: field 'class' is '{}', expected one of attention_fwd, attention_bwd, "
                 "norm_residual, elementwise, cca, loss, optimizer",
                 w, cname);
      const bool compute = kernel_class_is_compute(k.cls);
      ZAYA_CHECK(r.contains("work"), "{}: field 'work' ({} of the measurement) is required", w,
                 compute ? "GFLOP" : "GB");
      ZAYA_CHECK(opt_pos(r, "work", &k.work, w), "{}: field 'work' must be a positive number", w);
      const char* rate_key = compute ? "tflops" : "gbs";
      const char* other_key = compute ? "gbs" : "tflops";
      ZAYA_CHECK(!r.contains(other_key),
                 "{}: field '{}' does not apply to class '{}' (its rate is '{}')", w, other_key,
                 cname, rate_key);
      opt_pos(r, rate_key, &k.rate, w);
      if (r.contains("fraction") && !r["fraction"].is_null()) {
        ZAYA_CHECK(r["fraction"].is_number(), "{}: field 'fraction' must be a number, found {}", w,
                   r["fraction"].dump());
        k.fraction = r["fraction"].get<double>();
        ZAYA_CHECK(k.fraction > 0 && k.fraction <= 1 && std::isfinite(k.fraction),
                   "{}: field 'fraction' must be in (0, 1] (a share of the {}), found {}", w,
                   compute ? "bf16 peak" : "copy bandwidth", k.fraction);
      }
      ZAYA_CHECK(k.rate > 0 || k.fraction > 0, "{}: needs a positive '{}' or a 'fraction'", w,
                 rate_key);
      for (const char* f : {"shape", "source"})
        if (r.contains(f) && !r[f].is_null()) {
          ZAYA_CHECK(r[f].is_string(), "{}: field '{}' must be a string, found {}", w, f,
                     r[f].dump());
          (std::string(f) == "shape" ? k.shape : k.source) = r[f].get<std::string>();
        }
      if (k.source.empty()) k.source = "measured";
      rows.push_back(k);
    }
    // A measured class replaces the built-in's defaults of that class; others keep them.
    std::erase_if(h.kernels, [&](const KernelMeasurement& d) {
      return std::any_of(rows.begin(), rows.end(),
                         [&](const KernelMeasurement& m) { return m.cls == d.cls; });
    });
    h.kernels.insert(h.kernels.end(), rows.begin(), rows.end());
  }
  ZAYA_CHECK(h.compute_units > 0, "{}: sm_count must be positive", where);
  ZAYA_CHECK(h.peak_bf16_tflops > 0, "{}: peak_tflops.bf16 must be positive", where);
  if (h.datasheet_bf16_tflops == 0) h.datasheet_bf16_tflops = h.peak_bf16_tflops;  // unknown device
  return h;
}

HardwareProfile load_hardware(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               name_or_path.ends_with(".json") || fs::is_regular_file(name_or_path);
  if (!looks_like_path) return builtin_hardware(name_or_path);
  std::ifstream in(name_or_path);
  ZAYA_CHECK(in.good(), "--hardware: cannot open profile '{}' (known built-in names: {})",
             name_or_path, known_list());
  return hardware_from_json(read_json_file(name_or_path, "malformed JSON"), name_or_path);
}

}  // namespace zaya::sizing
