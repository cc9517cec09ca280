// Implementation of `zaya bench comm` (see comm_bench.h). Buffers are allocated once per group at
// the largest size; each (op, dtype, reduction, size, placement) runs once on fresh inputs for the
// correctness check, then `warmup` untimed and `iters` timed calls.
#include "bench/comm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/plot.h"

namespace zaya::bench {

namespace {

bool is_reduction(CommOp op) {
  return op == CommOp::AllReduce || op == CommOp::ReduceScatter;
}

// Owns a buffer in the communicator's memory space.
struct CommBuffer {
  Communicator& c;
  void* p = nullptr;
  CommBuffer(Communicator& comm, size_t bytes) : c(comm), p(comm.alloc(bytes)) {}
  ~CommBuffer() { c.free(p); }
  char* bytes() const { return static_cast<char*>(p); }
};

struct Case {
  CommOp op;
  DType dtype;
  RedOp redop;
  bool has_redop;
  uint64_t size;
  bool inplace;
};

void issue(Communicator& c, const Case& k, const OpGeometry& g, const void* s, void* r) {
  const int me = c.rank(), n = c.size();
  switch (k.op) {
    case CommOp::AllReduce: c.all_reduce(s, r, g.call_count, k.dtype, k.redop); break;
    case CommOp::ReduceScatter: c.reduce_scatter(s, r, g.call_count, k.dtype, k.redop); break;
    case CommOp::AllGather: c.all_gather(s, r, g.call_count, k.dtype); break;
    case CommOp::Broadcast: c.broadcast(s, r, g.call_count, k.dtype, 0); break;
    case CommOp::AllToAll: c.all_to_all(s, r, g.call_count, k.dtype); break;
    case CommOp::SendRecv:
      c.sendrecv(s, g.call_count, (me + 1) % n, r, g.call_count, (me + n - 1) % n, k.dtype);
      break;
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void run_group(Communicator& c, const std::string& group, const CommBenchOptions& opt, bool report,
               bool print, std::vector<CommRow>& rows) {
  const int me = c.rank(), n = c.size();
  const uint64_t maxbytes = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  CommBuffer sendb(c, maxbytes), recvb(c, maxbytes);
  std::vector<char> hin(maxbytes), hout(maxbytes);

  std::vector<Case> cases;
  for (CommOp op : opt.ops)
    for (DType t : opt.dtypes)
      for (size_t ri = 0; ri < (is_reduction(op) ? opt.redops.size() : 1); ++ri)
        for (uint64_t size : opt.sizes)
          for (int place = 0; place < 2; ++place) {
            const bool inplace = place == 1;
            if (inplace ? !opt.in_place || !comm_op_has_inplace(op) : !opt.out_of_place) continue;
            cases.push_back({op, t, is_reduction(op) ? opt.redops[ri] : RedOp::Sum,
                             is_reduction(op), size, inplace});
          }

  for (const Case& k : cases) {
    const size_t es = dtype_size(k.dtype);
    const OpGeometry g = op_geometry(k.op, k.size, es, n);
    if (g.count == 0) continue;  // smaller than one element per rank
    const uint64_t cc = g.call_count;
    // Buffer layout: out-of-place reads `send`, writes `recv`; in place everything lives in
    // `recv`, with the input at this rank's block where NCCL's convention puts it.
    char* sbuf = sendb.bytes();
    char* rbuf = recvb.bytes();
    uint64_t in_offset = 0;  // elements, within the buffer holding the input
    if (k.inplace) {
      sbuf = recvb.bytes();
      if (k.op == CommOp::ReduceScatter) rbuf = recvb.bytes() + uint64_t(me) * cc * es;
      if (k.op == CommOp::AllGather) {
        in_offset = uint64_t(me) * cc;
        sbuf = recvb.bytes() + in_offset * es;
      }
    }
    const CheckValues cv = make_check_values(k.dtype, k.redop, n);
    int64_t wrong = -1;
    if (opt.check) {
      for (uint64_t j = 0; j < g.send_elems; ++j)
        store_value(k.dtype, hin.data(), j, cv.input(me, j));
      // Poison the output first (all-ones bytes: -1 or NaN, never an expected value) so an
      // element the operation fails to write counts as wrong.
      std::memset(hout.data(), 0xff, g.count * es);  // count >= recv_elems for every op
      c.copy_to_buffer(recvb.bytes(), hout.data(), (k.inplace ? g.count : g.recv_elems) * es);
      c.copy_to_buffer(sbuf, hin.data(), g.send_elems * es);
      issue(c, k, g, sbuf, rbuf);
      c.synchronize();
      c.copy_from_buffer(hout.data(), rbuf, g.recv_elems * es);
      int64_t bad = 0;
      for (uint64_t j = 0; j < g.recv_elems; ++j)
        if (load_value(k.dtype, hout.data(), j) != cv.expected(k.op, g, me, j)) ++bad;
      double b = double(bad);
      c.host_all_reduce(&b, 1, RedOp::Sum);
      wrong = int64_t(b);
    }
    for (int i = 0; i < opt.warmup; ++i) issue(c, k, g, sbuf, rbuf);
    c.synchronize();
    c.barrier();
    const double t0 = now_s();
    for (int i = 0; i < opt.iters; ++i) issue(c, k, g, sbuf, rbuf);
    c.synchronize();
    double dt = (now_s() - t0) / std::max(1, opt.iters);
    c.host_all_reduce(&dt, 1, RedOp::Max);

    if (!report) continue;
    CommRow row;
    row.op = comm_op_name(k.op);
    row.group = group;
    row.backend = c.backend();
    row.ranks = n;
    row.bytes = g.bytes;
    row.count = g.count;
    row.dtype = bench_dtype_name(k.dtype);
    row.redop = k.has_redop ? redop_name(k.redop) : "none";
    row.inplace = k.inplace;
    row.time_us = dt * 1e6;
    row.algbw_gbs = algbw_gbs(g.bytes, dt);
    row.busbw_gbs = busbw_gbs(k.op, n, g.bytes, dt);
    row.wrong = wrong;
    if (print) {
      fmt::print("{}\n", comm_table_row(row));
      std::fflush(stdout);
    }
    rows.push_back(std::move(row));
  }
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) o += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return o + "\"";
}

}  // namespace

std::vector<CommRow> run_comm_bench(Communicator& world, const CommBenchOptions& opt, bool print) {
  ZAYA_CHECK(!opt.ops.empty() && !opt.sizes.empty() && !opt.dtypes.empty(),
             "bench comm: nothing to run (no ops, sizes or dtypes)");
  ZAYA_CHECK(opt.iters > 0, "--iters must be positive (got {})", opt.iters);
  ZAYA_CHECK(opt.warmup >= 0, "--warmup must not be negative (got {})", opt.warmup);
  const auto hosts = world.host_all_gather(world.host_name());
  const auto groupings = plan_groupings(hosts, opt.sweep_ranks);
  const bool root = world.rank() == 0;
  std::vector<CommRow> rows;
  if (root && print) {
    std::set<std::string> uniq(hosts.begin(), hosts.end());
    fmt::print("# zaya bench comm: backend {}, {} ranks on {} host(s), {} iters, {} warmup\n",
               world.backend(), world.size(), uniq.size(), opt.iters, opt.warmup);
    fmt::print("{}\n", comm_table_header());
  }
  for (const auto& g : groupings) {
    const int color = g.color[size_t(world.rank())];
    // Keyed by world rank, so world rank 0 is rank 0 of its group and reports it.
    auto sub = world.split(color, world.rank());
    if (sub) run_group(*sub, g.name, opt, root, root && print, rows);
    world.barrier();
  }
  return rows;
}

std::string comm_table_header() {
  return fmt::format(
      "{:<15} {:<11} {:>5} {:>12} {:>12} {:>8} {:>5} {:>5} {:>10} {:>11} {:>11} {:>7}", "#op",
      "group", "ranks", "size(B)", "count", "type", "redop", "place", "time(us)", "algbw(GB/s)",
      "busbw(GB/s)", "#wrong");
}

std::string comm_table_row(const CommRow& r) {
  return fmt::format(
      "{:<15} {:<11} {:>5} {:>12} {:>12} {:>8} {:>5} {:>5} {:>10.2f} {:>11.3f} {:>11.3f} {:>7}",
      r.op, r.group, r.ranks, r.bytes, r.count, r.dtype, r.redop, r.inplace ? "in" : "out",
      r.time_us, r.algbw_gbs, r.busbw_gbs,
      r.wrong < 0 ? std::string("N/A") : std::to_string(r.wrong));
}

std::string comm_rows_json(const std::vector<CommRow>& rows, const std::string& backend,
                           int world_size, const std::vector<std::string>& hosts) {
  nlohmann::json j;
  j["schema"] = "zaya.bench.comm/1";
  j["backend"] = backend;
  j["world_size"] = world_size;
  j["hosts"] = hosts;
  j["bandwidth_unit"] = "GB/s (1e9 bytes/s)";
  auto& res = j["results"] = nlohmann::json::array();
  for (const auto& r : rows) {
    res.push_back({{"name", r.op},
                   {"group", r.group},
                   {"ranks", r.ranks},
                   {"backend", r.backend},
                   {"size", r.bytes},
                   {"count", r.count},
                   {"dtype", r.dtype},
                   {"redop", r.redop},
                   {"inplace", r.inplace},
                   {"time_us", r.time_us},
                   {"algbw", r.algbw_gbs},
                   {"busbw", r.busbw_gbs},
                   {"wrong", r.wrong}});
  }
  return j.dump(1) + "\n";
}

std::string comm_rows_csv(const std::vector<CommRow>& rows) {
  std::string o =
      "name,group,ranks,backend,size,count,dtype,redop,inplace,time_us,algbw_gbs,busbw_gbs,wrong\n";
  for (const auto& r : rows)
    o += fmt::format("{},{},{},{},{},{},{},{},{},{:.4f},{:.6f},{:.6f},{}\n", csv_field(r.op),
                     csv_field(r.group), r.ranks, csv_field(r.backend), r.bytes, r.count,
                     csv_field(r.dtype), csv_field(r.redop), r.inplace ? 1 : 0, r.time_us,
                     r.algbw_gbs, r.busbw_gbs, r.wrong);
  return o;
}

std::string comm_rows_svg(const std::vector<CommRow>& rows) {
  std::set<std::string> ops, dtypes, places;
  for (const auto& r : rows) {
    ops.insert(r.op);
    dtypes.insert(r.dtype);
    places.insert(r.inplace ? "in" : "out");
  }
  PlotSpec p;
  p.title = fmt::format("bench comm: bus bandwidth ({})", rows.empty() ? "" : rows[0].backend);
  p.xlabel = "size (bytes)";
  p.ylabel = "busbw (GB/s)";
  p.logx = true;
  p.xbytes = true;
  for (const auto& r : rows) {
    std::string label = fmt::format("{} ranks ({})", r.ranks, r.group);
    if (ops.size() > 1) label = r.op + " " + label;
    if (dtypes.size() > 1) label += " " + r.dtype;
    if (places.size() > 1) label += r.inplace ? " in" : " out";
    auto it = std::find_if(p.series.begin(), p.series.end(),
                           [&](const PlotSeries& s) { return s.label == label; });
    if (it == p.series.end()) {
      p.series.push_back({label, {}, {}});
      it = p.series.end() - 1;
    }
    it->x.push_back(double(r.bytes));
    it->y.push_back(r.busbw_gbs);
  }
  return render_svg(p);
}

}  // namespace zaya::bench
