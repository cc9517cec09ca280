// Tests of the device-free benchmark helpers: size parsing and sweeps, dtype/op lists, the
// nccl-tests bandwidth arithmetic, per-op buffer geometry, rank groupings from host names and the
// exactness of the correctness values.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/bench_common.h"
#include "core/error.h"

namespace zaya::bench {
namespace {

TEST(BenchSizes, ParsesSuffixes) {
  EXPECT_EQ(parse_size("8", "-b"), 8u);
  EXPECT_EQ(parse_size("1K", "-b"), 1024u);
  EXPECT_EQ(parse_size("1k", "-b"), 1024u);
  EXPECT_EQ(parse_size("128M", "-e"), 128ull << 20);
  EXPECT_EQ(parse_size("8G", "-e"), 8ull << 30);
  EXPECT_EQ(parse_size("2GiB", "-e"), 2ull << 30);
  EXPECT_EQ(parse_size("4KB", "-e"), 4096u);
  EXPECT_EQ(parse_size("1T", "-e"), 1ull << 40);
}

TEST(BenchSizes, RejectsMalformedNamingTheFlag) {
  for (const char* bad : {"", "K", "1.5M", "-8", "12Q", "8 M", "1MM"}) {
    try {
      parse_size(bad, "-e/--maxbytes");
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("-e/--maxbytes"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchSizes, GeometricAndLinearSweeps) {
  EXPECT_EQ(size_sweep(8, 128, 2, 0), (std::vector<uint64_t>{8, 16, 32, 64, 128}));
  EXPECT_EQ(size_sweep(8, 100, 2, 0), (std::vector<uint64_t>{8, 16, 32, 64}));
  EXPECT_EQ(size_sweep(1, 81, 3, 0), (std::vector<uint64_t>{1, 3, 9, 27, 81}));
  EXPECT_EQ(size_sweep(100, 400, 2, 100), (std::vector<uint64_t>{100, 200, 300, 400}));
  EXPECT_EQ(size_sweep(1 << 20, 1 << 20, 2, 0), (std::vector<uint64_t>{1 << 20}));
  const auto big = size_sweep(8, 8ull << 30, 2, 0);
  EXPECT_EQ(big.size(), 31u);
  EXPECT_EQ(big.back(), 8ull << 30);
  EXPECT_THROW(size_sweep(16, 8, 2, 0), Error);
  EXPECT_THROW(size_sweep(0, 8, 2, 0), Error);
  EXPECT_THROW(size_sweep(8, 16, 1.0, 0), Error);
}

TEST(BenchLists, SplitDtypesOps) {
  EXPECT_EQ(split_list(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(parse_bench_dtype("bfloat16", "--dtype"), DType::BF16);
  EXPECT_EQ(parse_bench_dtype("float", "--dtype"), DType::F32);
  EXPECT_EQ(parse_bench_dtype("half", "--dtype"), DType::F16);
  EXPECT_EQ(bench_dtype_name(DType::BF16), "bfloat16");
  EXPECT_THROW(parse_bench_dtype("float8", "--dtype"), Error);
  EXPECT_EQ(parse_comm_ops("all").size(), 6u);
  EXPECT_EQ(parse_comm_ops("sendrecv,all_reduce,sendrecv"),
            (std::vector<CommOp>{CommOp::SendRecv, CommOp::AllReduce}));
  EXPECT_THROW(parse_comm_ops("allreduce"), Error);
  EXPECT_THROW(parse_comm_ops(","), Error);
}

TEST(BenchBandwidth, NcclTestsDefinitions) {
  // 8 ranks: all_reduce moves 2(n-1)/n of the data per rank over the bus.
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::AllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::ReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::AllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::AllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::SendRecv, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CommOp::AllReduce, 1), 0.0);
  // 1 GB in 10 ms is 100 GB/s algorithm bandwidth; on 4 ranks all_reduce busbw is 150 GB/s.
  EXPECT_DOUBLE_EQ(algbw_gbs(1000000000, 0.01), 100.0);
  EXPECT_DOUBLE_EQ(busbw_gbs(CommOp::AllReduce, 4, 1000000000, 0.01), 150.0);
  EXPECT_DOUBLE_EQ(algbw_gbs(1000, 0), 0.0);
}

TEST(BenchBandwidth, OpGeometryFollowsNcclTests) {
  // 1 MiB of floats on 3 ranks: reduce_scatter's per-rank block is 262144/3 rounded down and the
  // reported size is the total over the ranks.
  const auto rs = op_geometry(CommOp::ReduceScatter, 1 << 20, 4, 3);
  EXPECT_EQ(rs.call_count, 87381u);
  EXPECT_EQ(rs.count, 87381u * 3);
  EXPECT_EQ(rs.bytes, 87381u * 3 * 4);
  EXPECT_EQ(rs.send_elems, 87381u * 3);
  EXPECT_EQ(rs.recv_elems, 87381u);
  const auto ag = op_geometry(CommOp::AllGather, 1 << 20, 4, 3);
  EXPECT_EQ(ag.send_elems, 87381u);
  EXPECT_EQ(ag.recv_elems, 87381u * 3);
  const auto a2a = op_geometry(CommOp::AllToAll, 96, 4, 3);
  EXPECT_EQ(a2a.call_count, 8u);
  EXPECT_EQ(a2a.send_elems, 24u);
  EXPECT_EQ(a2a.recv_elems, 24u);
  const auto ar = op_geometry(CommOp::AllReduce, 10, 4, 3);  // 10 bytes: 2 floats
  EXPECT_EQ(ar.count, 2u);
  EXPECT_EQ(ar.bytes, 8u);
  EXPECT_EQ(op_geometry(CommOp::AllGather, 8, 4, 3).count, 0u);  // under one float per rank
}

TEST(BenchGroupings, SingleNodeSweep) {
  const std::vector<std::string> hosts(8, "node-a");
  const auto g = plan_groupings(hosts, true);
  ASSERT_EQ(g.size(), 3u);  // first-2, first-4, world (intra == world, no inter on one node)
  EXPECT_EQ(g[0].name, "first-2");
  EXPECT_EQ(g[0].ranks, 2);
  EXPECT_EQ(g[0].color, (std::vector<int>{0, 0, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(g[1].name, "first-4");
  EXPECT_EQ(g[1].ranks, 4);
  EXPECT_EQ(g[2].name, "world");
  EXPECT_EQ(g[2].ranks, 8);
  EXPECT_EQ(plan_groupings(hosts, false).size(), 1u);
}

TEST(BenchGroupings, IntraAndInterNodeFromInterleavedHosts) {
  // Ranks placed round-robin over two hosts: node ids follow first appearance and local ranks
  // count within each host.
  const std::vector<std::string> hosts = {"a", "b", "a", "b", "a", "b"};
  const auto g = plan_groupings(hosts, false);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].name, "world");
  EXPECT_EQ(g[1].name, "intra-node");
  EXPECT_EQ(g[1].color, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(g[1].ranks, 3);
  EXPECT_EQ(g[2].name, "inter-node");
  EXPECT_EQ(g[2].color, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(g[2].ranks, 2);
}

TEST(BenchGroupings, DropsDegenerateGroups) {
  // One rank per host: intra-node groups have one member, inter-node equals the world.
  const auto g = plan_groupings({"a", "b", "c", "d"}, true);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "first-2");
  EXPECT_EQ(g[1].name, "world");
  // A one-rank world still measures (a self-communicator).
  const auto one = plan_groupings({"a"}, true);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].ranks, 1);
}

TEST(BenchCheckValues, ReductionsAreExactInTheDtype) {
  for (DType t : {DType::BF16, DType::F16, DType::I8, DType::U8, DType::F32}) {
    for (int n : {1, 2, 3, 8, 31}) {
      const CheckValues cv = make_check_values(t, RedOp::Sum, n);
      std::vector<uint8_t> buf(8);
      for (uint64_t i = 0; i < 64; ++i) {
        const double want = cv.reduced(i);
        store_value(t, buf.data(), 0, want);  // the exact sum survives a round trip
        EXPECT_EQ(load_value(t, buf.data(), 0), want) << dtype_name(t) << " n=" << n;
      }
    }
  }
  const CheckValues prod = make_check_values(DType::BF16, RedOp::Prod, 4);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ(prod.reduced(i), 2.0);
}

TEST(BenchCheckValues, ExpectedOutputsMatchASimulatedCollective) {
  // Simulate all_to_all on 3 ranks directly from the inputs and compare with expected().
  const int n = 3;
  const CheckValues cv = make_check_values(DType::F32, RedOp::Sum, n);
  const auto g = op_geometry(CommOp::AllToAll, 3 * 4 * 4, 4, n);  // 4 floats per peer
  for (int me = 0; me < n; ++me)
    for (uint64_t j = 0; j < g.recv_elems; ++j) {
      const int from = int(j / g.call_count);
      const double sent = cv.input(from, uint64_t(me) * g.call_count + j % g.call_count);
      EXPECT_EQ(cv.expected(CommOp::AllToAll, g, me, j), sent);
    }
  const auto sr = op_geometry(CommOp::SendRecv, 16, 4, n);
  EXPECT_EQ(cv.expected(CommOp::SendRecv, sr, 0, 1), cv.input(2, 1));  // ring: from rank n-1
  const auto rsg = op_geometry(CommOp::ReduceScatter, 48, 4, n);
  double s = 0;
  for (int r = 0; r < n; ++r) s += cv.input(r, 2 * rsg.call_count + 1);
  EXPECT_EQ(cv.expected(CommOp::ReduceScatter, rsg, 2, 1), s);
}

TEST(BenchStats, PickFinalistKeepsTheIncumbentUnlessClearlyBeaten) {
  // Candidate 7 is the incumbent (the heuristic's first choice).
  const std::vector<int> ids{3, 5, 7};
  // 0.5% faster than the incumbent: inside the margin, the incumbent stays.
  EXPECT_EQ(pick_finalist(ids, {{9.95, 9.95, 9.95}, {12.0}, {10.0, 10.0, 10.0}}, 7), 7);
  // 2% faster: the challenger wins.
  EXPECT_EQ(pick_finalist(ids, {{9.8, 9.8, 20.0}, {12.0}, {10.0, 10.0, 10.0}}, 7), 3);
  // The incumbent fastest: kept.
  EXPECT_EQ(pick_finalist(ids, {{11.0}, {12.0}, {10.0}}, 7), 7);
  // A zero margin is the plain lowest median; ties go to the earlier candidate.
  EXPECT_EQ(pick_finalist(ids, {{9.95}, {12.0}, {10.0}}, 7, 0.0), 3);
  EXPECT_EQ(pick_finalist(ids, {{10.0}, {10.0}, {11.0}}, 99), 3);
  // No incumbent among the finalists: the lowest median.
  EXPECT_EQ(pick_finalist(ids, {{10.0}, {9.99}, {11.0}}, 42), 5);
  EXPECT_THROW(pick_finalist({}, {}, 0), Error);
  EXPECT_THROW(pick_finalist(ids, {{1.0}}, 7), Error);
}

TEST(BenchStats, MedianOfOddEvenAndEmpty) {
  EXPECT_DOUBLE_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);  // mean of the middle two
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
}

}  // namespace
}  // namespace zaya::bench
