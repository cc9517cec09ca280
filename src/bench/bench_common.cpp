// Implementation of the device-free benchmark helpers (see bench_common.h).
#include "bench/bench_common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/error.h"

namespace zaya::bench {

uint64_t parse_size(const std::string& s, const std::string& flag) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const std::string digits = s.substr(0, i);
  std::string suf = s.substr(i);
  for (auto& c : suf) c = char(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (suf.empty() || suf == "B") shift = 0;
  for (auto [p, sh] : {std::pair{'K', 10}, {'M', 20}, {'G', 30}, {'T', 40}}) {
    if (suf == std::string(1, p) || suf == std::string(1, p) + "B" ||
        suf == std::string(1, p) + "IB")
      shift = sh;
  }
  if (digits.empty() || shift < 0 || digits.size() > 15)
    fail("{}: '{}' is not a size (expected a byte count like 8, 1K, 128M or 8G)", flag, s);
  const uint64_t v = std::stoull(digits);
  ZAYA_CHECK(shift == 0 || v <= (uint64_t(1) << (63 - shift)), "{}: size '{}' is too large", flag,
             s);
  return v << shift;
}

std::string hex_encode(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  const auto* b = static_cast<const uint8_t*>(p);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[b[i] >> 4];
    s[2 * i + 1] = digits[b[i] & 15];
  }
  return s;
}

bool hex_decode(const std::string& hex, std::vector<uint8_t>& out) {
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2) return false;
  out.assign(hex.size() / 2, 0);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi * 16 + lo);
  }
  return true;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int pick_finalist(const std::vector<int>& ids, const std::vector<std::vector<double>>& samples,
                  int incumbent, double margin) {
  ZAYA_CHECK(!ids.empty() && ids.size() == samples.size(),
             "pick_finalist: {} candidates with {} sample sets", ids.size(), samples.size());
  size_t best = 0, inc = ids.size();
  std::vector<double> med(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    med[i] = median(samples[i]);
    if (med[i] < med[best]) best = i;
    if (ids[i] == incumbent && inc == ids.size()) inc = i;
  }
  if (inc < ids.size() && !(med[best] < med[inc] * (1.0 - margin))) return incumbent;
  return ids[best];
}

std::string format_size(uint64_t bytes) {
  static const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + units[u];
}

std::vector<uint64_t> size_sweep(uint64_t begin, uint64_t end, double factor, uint64_t step) {
  ZAYA_CHECK(begin > 0, "-b/--minbytes must be positive");
  ZAYA_CHECK(begin <= end, "-b/--minbytes ({}) is larger than -e/--maxbytes ({})", begin, end);
  std::vector<uint64_t> out;
  if (step > 0) {
    for (uint64_t s = begin; s <= end; s += step) out.push_back(s);
    return out;
  }
  ZAYA_CHECK(factor > 1.0 && std::isfinite(factor),
             "-f/--stepfactor must be larger than 1 (got {}), or give -i/--stepbytes", factor);
  for (double s = double(begin); s <= double(end) * (1 + 1e-12); s *= factor) {
    const uint64_t v = uint64_t(std::llround(s));
    if (out.empty() || v != out.back()) out.push_back(v);
  }
  return out;
}

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    start = end + 1;
  }
  return out;
}

namespace {
const std::pair<const char*, DType> kDtypeNames[] = {
    {"int8", DType::I8},     {"uint8", DType::U8},      {"int32", DType::I32},
    {"uint32", DType::U32},  {"int64", DType::I64},     {"half", DType::F16},
    {"float16", DType::F16}, {"fp16", DType::F16},      {"float", DType::F32},
    {"float32", DType::F32}, {"fp32", DType::F32},      {"double", DType::F64},
    {"float64", DType::F64}, {"bfloat16", DType::BF16}, {"bf16", DType::BF16}};
}  // namespace

DType parse_bench_dtype(const std::string& s, const std::string& flag) {
  for (auto& [n, t] : kDtypeNames)
    if (s == n) return t;
  fail(
      "{}: unknown dtype '{}' (expected int8, uint8, int32, uint32, int64, half, float, double "
      "or bfloat16)",
      flag, s);
}

std::string bench_dtype_name(DType t) {
  for (auto& [n, d] : kDtypeNames)
    if (d == t) return n;
  return std::string(dtype_name(t));
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce: return "all_reduce";
    case CommOp::ReduceScatter: return "reduce_scatter";
    case CommOp::AllGather: return "all_gather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::AllToAll: return "all_to_all";
    case CommOp::SendRecv: return "sendrecv";
  }
  return "?";
}

std::vector<CommOp> parse_comm_ops(const std::string& list) {
  const CommOp all[] = {CommOp::AllReduce, CommOp::ReduceScatter, CommOp::AllGather,
                        CommOp::Broadcast, CommOp::AllToAll,      CommOp::SendRecv};
  std::vector<CommOp> out;
  for (const auto& name : split_list(list)) {
    if (name == "all") {
      for (CommOp op : all)
        if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
      continue;
    }
    bool found = false;
    for (CommOp op : all) {
      if (name != comm_op_name(op)) continue;
      found = true;
      if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
    }
    ZAYA_CHECK(found,
               "--ops: unknown operation '{}' (expected all_reduce, reduce_scatter, all_gather, "
               "broadcast, all_to_all, sendrecv or all)",
               name);
  }
  ZAYA_CHECK(!out.empty(), "--ops: no operation given");
  return out;
}

double bus_factor(CommOp op, int n) {
  switch (op) {
    case CommOp::AllReduce: return n > 0 ? 2.0 * (n - 1) / n : 0.0;
    case CommOp::ReduceScatter:
    case CommOp::AllGather:
    case CommOp::AllToAll: return n > 0 ? double(n - 1) / n : 0.0;
    case CommOp::Broadcast:
    case CommOp::SendRecv: return 1.0;
  }
  return 1.0;
}

bool comm_op_has_inplace(CommOp op) {
  return op != CommOp::AllToAll && op != CommOp::SendRecv;
}

OpGeometry op_geometry(CommOp op, uint64_t size_bytes, size_t es, int n) {
  OpGeometry g;
  const uint64_t elems = size_bytes / es;
  switch (op) {
    case CommOp::AllReduce:
    case CommOp::Broadcast:
    case CommOp::SendRecv: g.call_count = g.count = g.send_elems = g.recv_elems = elems; break;
    case CommOp::ReduceScatter:
      g.call_count = elems / uint64_t(n);
      g.count = g.send_elems = g.call_count * uint64_t(n);
      g.recv_elems = g.call_count;
      break;
    case CommOp::AllGather:
      g.call_count = elems / uint64_t(n);
      g.count = g.recv_elems = g.call_count * uint64_t(n);
      g.send_elems = g.call_count;
      break;
    case CommOp::AllToAll:
      g.call_count = elems / uint64_t(n);
      g.count = g.send_elems = g.recv_elems = g.call_count * uint64_t(n);
      break;
  }
  if (g.call_count == 0) return OpGeometry{};
  g.bytes = g.count * es;
  return g;
}

std::vector<Grouping> plan_groupings(const std::vector<std::string>& hosts, bool sweep_ranks) {
  const int n = int(hosts.size());
  std::vector<int> node(static_cast<size_t>(n)), local(static_cast<size_t>(n));
  std::map<std::string, int> node_id;
  std::vector<int> per_node;
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = node_id.emplace(hosts[size_t(r)], int(node_id.size()));
    if (fresh) per_node.push_back(0);
    node[size_t(r)] = it->second;
    local[size_t(r)] = per_node[size_t(it->second)]++;
  }
  std::vector<Grouping> out;
  auto add = [&](std::string name, std::vector<int> color) {
    int members = 0;
    for (int c : color) members += c == color[0] ? 1 : 0;
    // A group of one measures nothing; the world is kept even then (a one-rank run).
    if (members < 2 && name != "world") return;
    for (const auto& g : out)
      if (g.color == color) return;
    out.push_back({std::move(name), std::move(color), members});
  };
  if (sweep_ranks) {
    for (int k = 2; k < n; k *= 2) {
      std::vector<int> c(size_t(n), -1);
      for (int r = 0; r < k; ++r) c[size_t(r)] = 0;
      add("first-" + std::to_string(k), std::move(c));
    }
  }
  add("world", std::vector<int>(size_t(n), 0));
  if (node_id.size() > 1) {
    add("intra-node", node);
    add("inter-node", local);
  }
  return out;
}

// ---- correctness values ----

static double exact_limit(DType t) {
  switch (t) {
    case DType::I8: return 127;
    case DType::U8: return 255;
    case DType::BF16: return 256;
    case DType::F16: return 2048;
    default: return double(1 << 20);
  }
}

CheckValues make_check_values(DType t, RedOp op, int nranks) {
  CheckValues cv;
  cv.dtype = t;
  cv.op = op;
  cv.nranks = std::max(1, nranks);
  cv.maxv = int(std::clamp(std::floor(exact_limit(t) / cv.nranks), 1.0, 4.0));
  return cv;
}

double CheckValues::input(int rank, uint64_t i) const {
  if (op == RedOp::Prod) return (i % uint64_t(nranks)) == uint64_t(rank) ? 2.0 : 1.0;
  return double((uint64_t(rank) * 3 + i) % uint64_t(maxv + 1));
}

double CheckValues::reduced(uint64_t i) const {
  double acc = input(0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = input(r, i);
    switch (op) {
      case RedOp::Sum: acc += v; break;
      case RedOp::Prod: acc *= v; break;
      case RedOp::Max: acc = std::max(acc, v); break;
      case RedOp::Min: acc = std::min(acc, v); break;
    }
  }
  return acc;
}

double CheckValues::expected(CommOp cop, const OpGeometry& g, int me, uint64_t j) const {
  const uint64_t c = g.call_count;
  switch (cop) {
    case CommOp::AllReduce: return reduced(j);
    case CommOp::ReduceScatter: return reduced(uint64_t(me) * c + j);
    case CommOp::AllGather: return input(int(j / c), j % c);
    case CommOp::Broadcast: return input(0, j);
    case CommOp::AllToAll: return input(int(j / c), uint64_t(me) * c + j % c);
    case CommOp::SendRecv: return input((me + nranks - 1) % nranks, j);
  }
  return 0;
}

void store_value(DType t, void* base, uint64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = float(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(float(v)); break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(float(v)); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::U32: static_cast<uint32_t*>(base)[i] = uint32_t(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = uint8_t(v); break;
    case DType::I8: static_cast<int8_t*>(base)[i] = int8_t(v); break;
    default: fail("benchmark buffers of dtype {} are not supported", dtype_name(t));
  }
}

double load_value(DType t, const void* base, uint64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::U32: return static_cast<const uint32_t*>(base)[i];
    case DType::I64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
    case DType::I8: return static_cast<const int8_t*>(base)[i];
    default: fail("benchmark buffers of dtype {} are not supported", dtype_name(t));
  }
}

}  // namespace zaya::bench
