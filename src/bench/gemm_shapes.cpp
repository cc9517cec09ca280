// The device-free half of `zaya bench gemm` (see gemm_bench.h): dimension ranges, the GEMM list
// of a ZAYA training step, the timing policy's arithmetic, the measured peak and the knee, and the
// report writers.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "bench/gemm_bench.h"
#include "core/error.h"
#include "core/json.h"

namespace zaya::bench {

namespace {

int64_t parse_dim(const std::string& v, const std::string& flag) {
  const uint64_t d = parse_size(v, flag);
  ZAYA_CHECK(d > 0 && d <= (uint64_t(1) << 31), "{}: dimension '{}' must be in 1..2^31", flag, v);
  return int64_t(d);
}

}  // namespace

std::vector<int64_t> parse_dim_range(const std::string& s, const std::string& flag) {
  auto dim = [&](const std::string& v) { return parse_dim(v, flag); };
  std::vector<int64_t> out;
  if (s.find(':') != std::string::npos) {
    const auto parts = split_list(s, ':');
    ZAYA_CHECK(
        parts.size() == 3 && parts[2].size() > 1 && (parts[2][0] == 'x' || parts[2][0] == '+'),
        "{}: '{}' is not a range (expected LO:HI:xFACTOR or LO:HI:+STEP, e.g. 256:8192:x2)", flag,
        s);
    const int64_t lo = dim(parts[0]), hi = dim(parts[1]);
    ZAYA_CHECK(lo <= hi, "{}: range '{}' has LO > HI", flag, s);
    if (parts[2][0] == '+') {
      const int64_t step = dim(parts[2].substr(1));
      for (int64_t v = lo; v <= hi; v += step) out.push_back(v);
    } else {
      double f = 0;
      try {
        f = std::stod(parts[2].substr(1));
      } catch (const std::exception&) {
        fail("{}: '{}' has a bad factor '{}'", flag, s, parts[2]);
      }
      ZAYA_CHECK(f > 1.0 && std::isfinite(f), "{}: factor in '{}' must be > 1", flag, s);
      for (double v = double(lo); v <= double(hi) + 0.5; v *= f) {
        const int64_t iv = int64_t(std::llround(v));
        if (out.empty() || iv != out.back()) out.push_back(iv);
      }
    }
    return out;
  }
  for (const auto& v : split_list(s)) out.push_back(dim(v));
  ZAYA_CHECK(!out.empty(), "{}: no dimension given", flag);
  return out;
}

GemmShape parse_gemm_shape(const std::string& s, const std::string& flag) {
  GemmShape g;
  g.name = "shape";
  std::string dims = s;
  if (const auto eq = s.find('='); eq != std::string::npos) {
    g.name = s.substr(0, eq);
    dims = s.substr(eq + 1);
    ZAYA_CHECK(!g.name.empty(), "{}: '{}' has an empty name before '='", flag, s);
  }
  const auto parts = split_list(dims, 'x');
  ZAYA_CHECK(parts.size() == 3 || parts.size() == 4,
             "{}: '{}' is not a shape (expected MxNxK or MxNxKxGROUPS, e.g. 8192x1024x2048)", flag,
             s);
  g.m = parse_dim(parts[0], flag), g.n = parse_dim(parts[1], flag), g.k = parse_dim(parts[2], flag);
  if (parts.size() == 4) g.groups = parse_dim(parts[3], flag);
  return g;
}

std::vector<GemmShape> cartesian_shapes(const std::vector<int64_t>& ms,
                                        const std::vector<int64_t>& ns,
                                        const std::vector<int64_t>& ks) {
  std::vector<GemmShape> out;
  for (int64_t m : ms)
    for (int64_t n : ns)
      for (int64_t k : ks) out.push_back({"sweep", m, n, k});
  return out;
}

std::vector<GemmShape> knee_shapes(int64_t max_dim) {
  std::vector<GemmShape> out;
  for (double d = 256; d <= double(max_dim) + 0.5; d *= std::sqrt(2.0)) {
    const int64_t v = (int64_t(std::llround(d)) + 63) / 64 * 64;  // keep multiples of 64
    if (out.empty() || out.back().m != v) out.push_back({"square", v, v, v});
  }
  return out;
}

std::vector<GemmShape> wave_shapes(int64_t lo, int64_t hi, int64_t step, int64_t k) {
  ZAYA_CHECK(lo > 0 && hi >= lo && step > 0, "wave sweep: need 0 < lo <= hi and step > 0");
  std::vector<GemmShape> out;
  for (int64_t v = lo; v <= hi; v += step) out.push_back({"wave", v, v, k});
  return out;
}

std::vector<GemmShape> model_gemm_shapes(const ZayaConfig& c, int64_t T) {
  ZAYA_CHECK(T > 0, "--tokens must be positive (got {})", T);
  const int64_t D = c.hidden_size, d = c.head_dim, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, R = c.router_hidden_size, E = c.num_experts,
                I = c.moe_intermediate_size, L = c.num_hidden_layers, V = c.vocab_size;
  const int64_t Te = std::max<int64_t>(1, T / std::max<int64_t>(1, E));
  std::vector<GemmShape> raw;
  // One linear layer y = x W^T with W [out, in], run `count` times per step: three GEMMs.
  auto linear = [&](const std::string& name, int64_t tokens, int64_t out, int64_t in,
                    int64_t groups, int64_t count) {
    raw.push_back({name + ".fwd", tokens, out, in, groups, count});
    raw.push_back({name + ".dgrad", tokens, in, out, groups, count});
    raw.push_back({name + ".wgrad", out, in, tokens, groups, count});
  };
  linear("attn.q_proj", T, Hq * d, D, 1, L);
  linear("attn.k_proj", T, Hkv * d, D, 1, L);
  linear("attn.v_proj", T, Hkv * d / 2, D, 1, 2 * L);  // v_proj_current and v_proj_delayed
  linear("attn.o_proj", T, D, Hq * d, 1, L);
  linear("router.down_proj", T, R, D, 1, L);
  linear("router.fc", T, R, R, 1, 2 * L);  // fc1 and fc2
  linear("router.out_proj", T, E + 1, R, 1, L);
  linear("experts.gate_up", Te, 2 * I, D, E, L);
  linear("experts.down", Te, D, I, E, L);
  linear("lm_head", T, V, D, 1, 1);
  // Merge identical problems (e.g. q_proj and o_proj when Hq*d == D), keeping the first name.
  std::vector<GemmShape> out;
  for (auto& s : raw) {
    auto it = std::find_if(out.begin(), out.end(), [&](const GemmShape& o) {
      return o.m == s.m && o.n == s.n && o.k == s.k && o.groups == s.groups;
    });
    if (it == out.end()) {
      out.push_back(s);
    } else {
      it->count += s.count;
      if (it->name.find('+') == std::string::npos) it->name += "+";  // marks a merged entry
    }
  }
  return out;
}

int warm_launches(const TimingPolicy& p, double est_us) {
  if (!(est_us > 0) || !(p.warm_ms > 0)) return 0;
  return int(std::min(1000.0, std::ceil(p.warm_ms * 1e3 / est_us)));
}

int timed_iters(const TimingPolicy& p, double est_us) {
  const int lo = std::max(1, p.min_iters), hi = std::max(lo, p.max_iters);
  if (!(est_us > 0)) return hi;  // nothing measurable: as many as allowed
  const double want = std::ceil(p.min_time_ms * 1e3 / est_us);
  return int(std::clamp(want, double(lo), double(hi)));
}

double block_us(const TimingPolicy& p, int iters) {
  return std::min(p.block_max_us, p.block_base_us + p.block_per_iter_us * double(iters));
}

double measured_peak_tflops(const std::vector<GemmResult>& results, const std::string& dtype) {
  double best = 0;
  for (const auto& r : results)
    if (r.dtype == dtype && (r.method == "lt" || r.method == "lt-batched"))
      best = std::max(best, r.tflops);
  return best;
}

double knee_gflop(const std::vector<GemmResult>& results, double peak, double fraction) {
  if (!(peak > 0)) return -1;
  std::vector<const GemmResult*> rs;
  for (const auto& r : results) rs.push_back(&r);
  std::stable_sort(rs.begin(), rs.end(),
                   [](auto* a, auto* b) { return a->shape.gflop() < b->shape.gflop(); });
  const double thr = fraction * peak;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i]->tflops < thr) continue;
    const double w1 = rs[i]->shape.gflop();
    if (i == 0) return w1;
    const double w0 = rs[i - 1]->shape.gflop(), t0 = rs[i - 1]->tflops, t1 = rs[i]->tflops;
    // t0 < thr <= t1 here; equal works (two rows of one shape) leave nothing to interpolate.
    if (!(w0 > 0) || !(w1 > w0)) return w1;
    const double u = (thr - t0) / (t1 - t0);
    return std::exp(std::log(w0) + u * (std::log(w1) - std::log(w0)));
  }
  return -1;
}

std::string gemm_table_header() {
  return fmt::format(
      "{:<24} {:>6} {:>6} {:>6} {:>4} {:>5} {:>10} {:>9} {:>10} {:>9} {:>6} {:>6} {:>9}", "#name",
      "m", "n", "k", "grp", "dtype", "method", "GFLOP", "time(us)", "TFLOP/s", "%peak", "waves",
      "wrong");
}

std::string gemm_table_row(const GemmResult& r) {
  return fmt::format(
      "{:<24} {:>6} {:>6} {:>6} {:>4} {:>5} {:>10} {:>9.3f} {:>10.2f} {:>9.1f} {:>6.1f} {:>6.2f} "
      "{:>9}",
      r.shape.name, r.shape.m, r.shape.n, r.shape.k, r.shape.groups, r.dtype, r.method,
      r.shape.gflop(), r.time_us, r.tflops, 100 * r.fraction, r.waves,
      r.checked > 0 ? fmt::format("{}/{}", r.wrong, r.checked) : std::string("N/A"));
}

std::string gemm_results_json(const std::vector<GemmResult>& rs, const DeviceInfo& dev,
                              double peak_bf16, double peak_fp8, const GemmBenchOptions& opt) {
  nlohmann::json j;
  j["schema"] = "zaya.bench.gemm/1";
  j["device"] = dev.name;
  j["sm_count"] = dev.sm_count;
  j["peak_tflops"] = {{"bf16", peak_bf16}, {"fp8", peak_fp8}};
  j["peak_source"] = dev.peak_source;
  j["measured_peak_tflops"] = {{"bf16", measured_peak_tflops(rs, "bf16")},
                               {"fp8", measured_peak_tflops(rs, "fp8")}};
  j["workspace_bytes"] = opt.workspace_bytes;
  j["autotune"] = opt.autotune;
  j["search_per_algo"] = opt.search_per_algo;
  // The protocol's numbers, for the peer (tools/bench_peer.py) to time PyTorch identically.
  const TimingPolicy& t = opt.timing;
  j["timing"] = {{"warmup", t.warmup},
                 {"min_iters", t.min_iters},
                 {"max_iters", t.max_iters},
                 {"warm_ms", t.warm_ms},
                 {"min_time_ms", t.min_time_ms},
                 {"block_base_us", t.block_base_us},
                 {"block_per_iter_us", t.block_per_iter_us},
                 {"block_max_us", t.block_max_us}};
  auto& res = j["results"] = nlohmann::json::array();
  for (const auto& r : rs) {
    res.push_back({{"name", r.shape.name},
                   {"m", r.shape.m},
                   {"n", r.shape.n},
                   {"k", r.shape.k},
                   {"groups", r.shape.groups},
                   {"count", r.shape.count},
                   {"dtype", r.dtype},
                   {"method", r.method},
                   {"gflop", r.shape.gflop()},
                   {"time_us", r.time_us},
                   {"tflops", r.tflops},
                   {"fraction", r.fraction},
                   {"tiles_128x128", r.tiles},
                   {"waves", r.waves},
                   {"checked", r.checked},
                   {"wrong", r.wrong},
                   {"max_rel_err", r.max_rel_err},
                   {"sets", r.sets},
                   {"iters", r.iters},
                   {"warm", r.warm},
                   {"algo", r.algo},
                   {"candidates", r.candidates}});
    auto& row = res.back();
    row["launch"] = r.launch;
    if (!r.algo_config.empty()) {
      row["algo_config"] = r.algo_config;
      row["algo_reused"] = r.algo_reused;
    }
    if (!r.algo_fields.empty()) {
      nlohmann::json f = nlohmann::json::object();
      for (const auto& [name, v] : r.algo_fields) f[name] = v;
      row["algo_fields"] = f;
    }
    if (r.gpu.t_end > 0) {
      row["t_start"] = r.gpu.t_start;
      row["t_end"] = r.gpu.t_end;
    }
    if (r.gpu.samples > 0) {
      row["clock_samples"] = r.gpu.samples;
      row["sm_clock_mhz"] = r.gpu.sm_clock_mhz;
      row["sm_clock_min_mhz"] = r.gpu.sm_clock_min_mhz;
      row["power_w"] = r.gpu.power_w;
      row["temp_c"] = r.gpu.temp_c;
      row["clock_reasons"] = r.gpu.clock_reasons;
    }
  }
  return j.dump(1) + "\n";
}

std::string gemm_results_csv(const std::vector<GemmResult>& rs) {
  std::string o =
      "name,m,n,k,groups,count,dtype,method,gflop,time_us,tflops,fraction,tiles,waves,checked,"
      "wrong,max_rel_err,sets,iters,algo,candidates\n";
  for (const auto& r : rs)
    o += fmt::format(
        "{},{},{},{},{},{},{},{},{:.6f},{:.3f},{:.3f},{:.4f},{},{:.3f},{},{},{:.3g},{},{},{},{}\n",
        r.shape.name, r.shape.m, r.shape.n, r.shape.k, r.shape.groups, r.shape.count, r.dtype,
        r.method, r.shape.gflop(), r.time_us, r.tflops, r.fraction, r.tiles, r.waves, r.checked,
        r.wrong, r.max_rel_err, r.sets, r.iters, r.algo, r.candidates);
  return o;
}

std::string gemm_algo_key(const std::string& dtype, const GemmShape& s) {
  return fmt::format("{} {} {} {} {}", dtype, s.m, s.n, s.k, s.groups);
}

std::map<std::string, std::string> load_gemm_algos(const std::string& path) {
  std::ifstream in(path);
  ZAYA_CHECK(in.good(), "--algos-from: cannot read '{}'", path);
  const nlohmann::json j = read_json_file(path, "is not JSON");
  ZAYA_CHECK(j.is_object() && j.value("schema", "") == "zaya.bench.gemm/1" &&
                 j.contains("results") && j["results"].is_array(),
             "--algos-from: '{}' is not a `zaya bench gemm --json` file (schema "
             "zaya.bench.gemm/1 with a results array)",
             path);
  std::map<std::string, std::string> out;
  for (const auto& r : j["results"]) {
    const std::string method = r.value("method", "");
    if ((method != "lt" && method != "lt-batched") || !r.contains("algo_config")) continue;
    GemmShape s;
    s.m = r.at("m").get<int64_t>();
    s.n = r.at("n").get<int64_t>();
    s.k = r.at("k").get<int64_t>();
    s.groups = r.value("groups", int64_t(1));
    const std::string hex = r.at("algo_config").get<std::string>();
    std::vector<uint8_t> bytes;
    ZAYA_CHECK(hex_decode(hex, bytes) && !bytes.empty(),
               "--algos-from: '{}': algo_config of {} m={} n={} k={} is not hex", path,
               r.value("dtype", "?"), s.m, s.n, s.k);
    out[gemm_algo_key(r.value("dtype", ""), s)] = hex;
  }
  return out;
}

}  // namespace zaya::bench
