// MPI implementation of zaya::Communicator on host buffers. bf16/fp16 reductions use user-defined
// MPI ops (MPI has no such types). Counts beyond MPI's int range are split into chunks for
// all_reduce, broadcast and point-to-point; the block collectives reject them instead, since
// chunking those needs strided datatypes the benchmark sizes never require.
// Every call is the "collective" section of dist/heartbeat.h (what the watchdog and the supervisor
// see). In-place reduce_scatter follows NCCL's convention (result at send + rank*recvcount); MPI's
// own in-place form leaves it at the start of the buffer, so that case pays one extra memmove.
#include "dist/comm_mpi.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "dist/heartbeat.h"

namespace zaya::detail {

namespace {

bool g_we_initialized = false;

void finalize_mpi() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), int Kind>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = ToF(a[i]), y = ToF(b[i]);
    float r;
    switch (Kind) {
      case 0: r = x + y; break;
      case 1: r = x * y; break;
      case 2: r = x > y ? x : y; break;
      default: r = x < y ? x : y; break;
    }
    b[i] = FromF(r);
  }
}

struct HalfTypes {
  MPI_Datatype type = MPI_DATATYPE_NULL;  // shared 2-byte type for bf16 and fp16
  MPI_Op bf16[4], f16[4];
};

HalfTypes& half_types() {
  static HalfTypes h;
  static std::once_flag once;
  std::call_once(once, [] {
    ZAYA_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &h.type));
    ZAYA_MPI_CHECK(MPI_Type_commit(&h.type));
    MPI_User_function* bf[4] = {
        half_op<bf16_to_f32, f32_to_bf16, 0>, half_op<bf16_to_f32, f32_to_bf16, 1>,
        half_op<bf16_to_f32, f32_to_bf16, 2>, half_op<bf16_to_f32, f32_to_bf16, 3>};
    MPI_User_function* hf[4] = {
        half_op<f16_to_f32, f32_to_f16, 0>, half_op<f16_to_f32, f32_to_f16, 1>,
        half_op<f16_to_f32, f32_to_f16, 2>, half_op<f16_to_f32, f32_to_f16, 3>};
    for (int i = 0; i < 4; ++i) {
      ZAYA_MPI_CHECK(MPI_Op_create(bf[i], 1, &h.bf16[i]));
      ZAYA_MPI_CHECK(MPI_Op_create(hf[i], 1, &h.f16[i]));
    }
  });
  return h;
}

int as_int(size_t count, const char* what) {
  ZAYA_CHECK(count <= size_t(INT_MAX), "MPI {}: {} elements exceed MPI's int count limit", what,
             count);
  return int(count);
}

constexpr size_t kChunk = size_t(1) << 30;  // elements per MPI call when splitting large counts

}  // namespace

void ensure_mpi_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  ZAYA_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes, so ZAYA_MPI_CHECK can report them instead of MPI aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_we_initialized = true;
  std::atexit(finalize_mpi);
}

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::I8: return MPI_INT8_T;
    case DType::I16: return MPI_INT16_T;
    case DType::U16: return MPI_UINT16_T;
    case DType::BF16:
    case DType::F16: return half_types().type;
    default: fail("MPI communicator: dtype {} is not supported", dtype_name(t));
  }
}

MPI_Op mpi_op(RedOp op, DType t) {
  if (t == DType::BF16) return half_types().bf16[int(op)];
  if (t == DType::F16) return half_types().f16[int(op)];
  switch (op) {
    case RedOp::Sum: return MPI_SUM;
    case RedOp::Prod: return MPI_PROD;
    case RedOp::Max: return MPI_MAX;
    case RedOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  ZAYA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZAYA_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::host_name() const {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  ZAYA_MPI_CHECK(MPI_Get_processor_name(name, &len));
  return std::string(name, size_t(len));
}

void MpiCommunicator::barrier() {
  const auto in_collective = ft::section(ft::kCollective, "barrier");
  ZAYA_MPI_CHECK(MPI_Barrier(comm_));
}

void MpiCommunicator::all_reduce(const void* send, void* recv, size_t count, DType t, RedOp op) {
  const auto in_collective = ft::section(ft::kCollective, "all_reduce");
  const size_t es = dtype_size(t);
  const MPI_Datatype dt = mpi_datatype(t);
  const MPI_Op mop = mpi_op(op, t);
  for (size_t off = 0; off < count || (count == 0 && off == 0); off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    char* r = static_cast<char*>(recv) + off * es;
    const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * es;
    ZAYA_MPI_CHECK(MPI_Allreduce(s, r, n, dt, mop, comm_));
    if (count == 0) break;
  }
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t recvcount, DType t,
                                     RedOp op) {
  const auto in_collective = ft::section(ft::kCollective, "reduce_scatter");
  const int n = as_int(recvcount, "reduce_scatter");
  const size_t es = dtype_size(t);
  char* own = const_cast<char*>(static_cast<const char*>(send)) + size_t(rank_) * recvcount * es;
  if (recv == own) {
    // MPI's in-place form reads the whole input from recvbuf and writes block 0 of it.
    void* base = const_cast<void*>(send);
    ZAYA_MPI_CHECK(
        MPI_Reduce_scatter_block(MPI_IN_PLACE, base, n, mpi_datatype(t), mpi_op(op, t), comm_));
    if (rank_ != 0) std::memmove(own, base, recvcount * es);
    return;
  }
  ZAYA_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, mpi_datatype(t), mpi_op(op, t), comm_));
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t sendcount, DType t) {
  const auto in_collective = ft::section(ft::kCollective, "all_gather");
  const int n = as_int(sendcount, "all_gather");
  const size_t es = dtype_size(t);
  const bool inplace = send == static_cast<char*>(recv) + size_t(rank_) * sendcount * es;
  ZAYA_MPI_CHECK(MPI_Allgather(inplace ? MPI_IN_PLACE : send, n, mpi_datatype(t), recv, n,
                               mpi_datatype(t), comm_));
}

void MpiCommunicator::broadcast(const void* send, void* recv, size_t count, DType t, int root) {
  const auto in_collective = ft::section(ft::kCollective, "broadcast");
  const size_t es = dtype_size(t);
  // MPI_Bcast is in place; the root's out-of-place form copies its input first.
  if (rank_ == root && send != recv) std::memcpy(recv, send, count * es);
  for (size_t off = 0; off < count; off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    ZAYA_MPI_CHECK(MPI_Bcast(static_cast<char*>(recv) + off * es, n, mpi_datatype(t), root, comm_));
  }
}

void MpiCommunicator::reduce(const void* send, void* recv, size_t count, DType t, RedOp op,
                             int root) {
  const auto in_collective = ft::section(ft::kCollective, "reduce");
  const size_t es = dtype_size(t);
  const bool inplace = rank_ == root && send == recv;
  for (size_t off = 0; off < count; off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    const char* s = static_cast<const char*>(send) + off * es;
    char* r = static_cast<char*>(recv) + off * es;
    ZAYA_MPI_CHECK(MPI_Reduce(inplace ? MPI_IN_PLACE : s, rank_ == root ? r : nullptr, n,
                              mpi_datatype(t), mpi_op(op, t), root, comm_));
  }
}

void MpiCommunicator::all_to_all(const void* send, void* recv, size_t count, DType t) {
  const auto in_collective = ft::section(ft::kCollective, "all_to_all");
  ZAYA_CHECK(send != recv, "all_to_all has no in-place form");
  const int n = as_int(count, "all_to_all");
  ZAYA_MPI_CHECK(MPI_Alltoall(send, n, mpi_datatype(t), recv, n, mpi_datatype(t), comm_));
}

void MpiCommunicator::send(const void* buf, size_t count, DType t, int peer) {
  const auto in_collective = ft::section(ft::kCollective, "send");
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < count || (count == 0 && off == 0); off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    ZAYA_MPI_CHECK(
        MPI_Send(static_cast<const char*>(buf) + off * es, n, mpi_datatype(t), peer, 0, comm_));
    if (count == 0) break;
  }
}

void MpiCommunicator::recv(void* buf, size_t count, DType t, int peer) {
  const auto in_collective = ft::section(ft::kCollective, "recv");
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < count || (count == 0 && off == 0); off += kChunk) {
    const int n = int(std::min(kChunk, count - off));
    ZAYA_MPI_CHECK(MPI_Recv(static_cast<char*>(buf) + off * es, n, mpi_datatype(t), peer, 0, comm_,
                            MPI_STATUS_IGNORE));
    if (count == 0) break;
  }
}

void MpiCommunicator::sendrecv(const void* sendbuf, size_t sendcount, int dest, void* recvbuf,
                               size_t recvcount, int src, DType t) {
  const auto in_collective = ft::section(ft::kCollective, "sendrecv");
  const int ns = as_int(sendcount, "sendrecv"), nr = as_int(recvcount, "sendrecv");
  ZAYA_MPI_CHECK(MPI_Sendrecv(sendbuf, ns, mpi_datatype(t), dest, 1, recvbuf, nr, mpi_datatype(t),
                              src, 1, comm_, MPI_STATUS_IGNORE));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_mpi(int color, int key) {
  const auto in_collective = ft::section(ft::kCollective, "split");
  MPI_Comm sub = MPI_COMM_NULL;
  ZAYA_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(sub);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  return split_mpi(color, key);
}

void MpiCommunicator::host_all_reduce(double* values, size_t n, RedOp op) {
  const auto in_collective = ft::section(ft::kCollective, "host_all_reduce");
  ZAYA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, as_int(n, "host_all_reduce"), MPI_DOUBLE,
                               mpi_op(op, DType::F64), comm_));
}

std::vector<std::string> MpiCommunicator::host_all_gather(const std::string& s) {
  const auto in_collective = ft::section(ft::kCollective, "host_all_gather");
  int len = int(s.size());
  std::vector<int> lens(size_t(size_), 0), displs(size_t(size_), 0);
  ZAYA_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_));
  int total = 0;
  for (int i = 0; i < size_; ++i) {
    displs[size_t(i)] = total;
    total += lens[size_t(i)];
  }
  std::string all(size_t(total), '\0');
  ZAYA_MPI_CHECK(MPI_Allgatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                                MPI_CHAR, comm_));
  std::vector<std::string> out;
  for (int i = 0; i < size_; ++i)
    out.push_back(all.substr(size_t(displs[size_t(i)]), size_t(lens[size_t(i)])));
  return out;
}

void* MpiCommunicator::alloc(size_t bytes) {
  // Page-aligned, like device allocations, so in-place offsets never straddle odd alignments.
  void* p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  ZAYA_CHECK(p != nullptr, "cannot allocate {} bytes of host memory for the MPI buffers", bytes);
  return p;
}
void MpiCommunicator::free(void* p) {
  std::free(p);
}
void MpiCommunicator::copy_to_buffer(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}
void MpiCommunicator::copy_from_buffer(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}

std::unique_ptr<Communicator> make_mpi_world() {
  ensure_mpi_initialized();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace zaya::detail
