// Pieces shared by the `zaya bench` commands that need no device: size arguments ("8", "1K",
// "128M", "8G") and geometric/linear size sweeps, comma-separated lists, dtype names as
// nccl-tests spells them, the collective operations with their nccl-tests bus-bandwidth factors
// and per-rank buffer geometry, and the rank groupings (sub-communicator colors) derived from the
// ranks' host names. Everything here is pure, so it is unit-tested without MPI or a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/comm.h"

namespace zaya::bench {

// Parses a byte count: digits with an optional binary suffix K, M, G or T (also KB/KiB forms,
// any case), e.g. "8", "1K" = 1024, "128M", "8G". Throws zaya::Error naming `flag` otherwise.
uint64_t parse_size(const std::string& s, const std::string& flag);
// Short binary form for tables: 8 -> "8", 1024 -> "1K", 3 MiB -> "3M", 1536 -> "1536".
std::string format_size(uint64_t bytes);

// Sizes begin, begin*factor, ... up to end inclusive (factor > 1), or begin, begin+step, ... when
// step > 0 (nccl-tests' -i). Throws zaya::Error for begin > end, begin == 0, factor <= 1 with no
// step, naming the flags.
std::vector<uint64_t> size_sweep(uint64_t begin, uint64_t end, double factor, uint64_t step);

// Lower-case hex of `n` bytes, and back (false for odd length or a non-hex character).
std::string hex_encode(const void* p, size_t n);
bool hex_decode(const std::string& hex, std::vector<uint8_t>& out);

// The median of `v` (the mean of the two middle values for an even count; 0 when empty).
double median(std::vector<double> v);

// The autotuner's final choice among candidates ids[i] with timed samples[i]: the lowest median,
// except that `incumbent` (when among ids) is kept unless that median is lower than the
// incumbent's by more than `margin` (relative). Ties go to the earlier candidate. Throws
// zaya::Error when ids is empty or the sizes differ.
int pick_finalist(const std::vector<int>& ids, const std::vector<std::vector<double>>& samples,
                  int incumbent, double margin = 0.01);

// Splits "a,b,,c" into {"a","b","c"} (empty items and surrounding spaces dropped).
std::vector<std::string> split_list(const std::string& s, char sep = ',');

// nccl-tests dtype names: int8, uint8, int32, uint32, int64, half (float16), float (float32),
// double (float64), bfloat16. Throws zaya::Error naming `flag` for others.
DType parse_bench_dtype(const std::string& s, const std::string& flag);
std::string bench_dtype_name(DType t);

enum class CommOp { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, SendRecv };
const char* comm_op_name(CommOp op);  // all_reduce, reduce_scatter, ...
// A comma-separated list of op names, or "all". Throws zaya::Error naming --ops.
std::vector<CommOp> parse_comm_ops(const std::string& list);
// nccl-tests' busbw/algbw factor: 2(n-1)/n for all_reduce; (n-1)/n for reduce_scatter,
// all_gather and all_to_all (applied to the total size); 1 for broadcast and sendrecv.
double bus_factor(CommOp op, int nranks);
// Whether an op has an in-place form (all_to_all and sendrecv do not).
bool comm_op_has_inplace(CommOp op);

// The buffers one rank uses for an op at a nominal size: element counts of its send and receive
// buffers, the "count" and "bytes" the report shows (nccl-tests: the total over the collective
// for reduce_scatter/all_gather/all_to_all, whose per-rank block is size/n rounded down), and the
// per-rank block count passed to the call. count == 0 means the size is too small: skip it.
struct OpGeometry {
  uint64_t count = 0;       // elements in the report's size
  uint64_t bytes = 0;       // count * element size
  uint64_t call_count = 0;  // the count argument of the Communicator call
  uint64_t send_elems = 0, recv_elems = 0;
};
OpGeometry op_geometry(CommOp op, uint64_t size_bytes, size_t elem_size, int nranks);

// Bandwidths in GB/s (1e9 bytes/s), as nccl-tests reports them.
inline double algbw_gbs(uint64_t bytes, double seconds) {
  return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
}
inline double busbw_gbs(CommOp op, int nranks, uint64_t bytes, double seconds) {
  return algbw_gbs(bytes, seconds) * bus_factor(op, nranks);
}

// A way of splitting the world into sub-communicators: color[r] for each world rank (-1: not a
// member). World rank 0 is always a member; `ranks` is the size of its group, the one reported.
struct Grouping {
  std::string name;  // "world", "first-4", "intra-node", "inter-node"
  std::vector<int> color;
  int ranks = 0;
};
// From the ranks' host names (in world rank order): "world"; with sweep_ranks, "first-k" for
// k = 2, 4, 8, ... below the world size; and when the ranks span several hosts, "intra-node"
// (one group per host, all running at once) and "inter-node" (one group per local rank index,
// i.e. the ranks with the same position on each host). Groupings equal in membership to one
// already listed are dropped.
std::vector<Grouping> plan_groupings(const std::vector<std::string>& hosts, bool sweep_ranks);

// Correctness data for the collectives: rank r's input element i is a small integer chosen so the
// reduction over n ranks is exact in the dtype (bf16 holds integers exactly to 256, fp16 to 2048,
// int8 to 127), hence every output element has one exact expected value.
struct CheckValues {
  DType dtype = DType::F32;
  RedOp op = RedOp::Sum;
  int nranks = 1;
  int maxv = 4;  // inputs are in [0, maxv] (prod: in {1, 2})

  double input(int rank, uint64_t i) const;
  double reduced(uint64_t i) const;  // op over all ranks of input(r, i)
  // The expected value of element j of rank `me`'s output of `op` (geometry g, root 0 for
  // broadcast; sendrecv receives from rank me-1 in a ring).
  double expected(CommOp cop, const OpGeometry& g, int me, uint64_t j) const;
};
CheckValues make_check_values(DType t, RedOp op, int nranks);

// Element access by dtype, for filling and checking buffers of any benchmark dtype.
void store_value(DType t, void* base, uint64_t i, double v);
double load_value(DType t, const void* base, uint64_t i);

}  // namespace zaya::bench
