// NCCL implementation of zaya::Communicator: one GPU per rank, device buffers, operations enqueued
// on the communicator's own stream. Bootstrapped over MPI (rank 0's ncclUniqueId is broadcast)
// and keeps that MPI communicator for host-side bookkeeping (barrier, timings, host names).
// all_to_all and sendrecv are grouped ncclSend/ncclRecv calls (NCCL has no all-to-all primitive).
// Every call (and synchronize, where a hung collective is waited for) is the "collective" section
// of dist/heartbeat.h; the watchdog (dist/watchdog.h) aborts the communicator with ncclCommAbort.
// Sub-communicators come from ncclCommSplit, alongside an MPI split with the same colors.
// after_stream orders the communicator's stream after another (a training step's) by an event.
// Not here: multiple GPUs per rank, CUDA graphs.
#include <cuda_runtime.h>

#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"
#include "dist/comm_backends.h"
#include "dist/heartbeat.h"
#include "dist/stream_marks.h"
#include "dist/watchdog.h"
#ifdef ZAYA_HAVE_MPI
#include "dist/comm_mpi.h"
#endif

namespace zaya::detail {

#ifndef ZAYA_HAVE_MPI
std::unique_ptr<Communicator> make_nccl_world() {
  throw ::zaya::Error("the NCCL communicator needs MPI to bootstrap; this build has no MPI");
}
#else

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::U32: return ncclUint32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::I8: return ncclInt8;
    default:
      throw ::zaya::Error(std::string("NCCL communicator: dtype ") + std::string(dtype_name(t)) +
                          " is not supported");
  }
}

ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::Sum: return ncclSum;
    case RedOp::Prod: return ncclProd;
    case RedOp::Max: return ncclMax;
    case RedOp::Min: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<MpiCommunicator> boot, ncclComm_t comm, int device)
      : boot_(std::move(boot)), comm_(comm), device_(device) {
    ZAYA_CUDA_CHECK(cudaSetDevice(device_));
    ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ZAYA_CUDA_CHECK(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming));
    // A collective the watchdog gives up on: abort the communicator, so its kernels stop waiting
    // for the peers and the device is left usable for the process's exit.
    abort_id_ = ft::on_watchdog_abort([c = comm_] { ncclCommAbort(c); });
  }
  ~NcclCommunicator() override {
    ft::remove_watchdog_abort(abort_id_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (order_) cudaEventDestroy(order_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  std::string backend() const override { return "nccl"; }
  std::string host_name() const override { return boot_->host_name(); }

  void barrier() override {
    const auto in_collective = ft::section(ft::kCollective, "barrier");
    synchronize();
    boot_->barrier();
  }
  void synchronize() override {
    const auto in_collective = ft::section(ft::kCollective, "synchronize");
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void all_reduce(const void* send, void* recv, size_t count, DType t, RedOp op) override {
    const auto in_collective = ft::section(ft::kCollective, "all_reduce");
    ZAYA_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_));
  }
  void reduce_scatter(const void* send, void* recv, size_t recvcount, DType t, RedOp op) override {
    const auto in_collective = ft::section(ft::kCollective, "reduce_scatter");
    ZAYA_NCCL_CHECK(
        ncclReduceScatter(send, recv, recvcount, nccl_type(t), nccl_op(op), comm_, stream_));
  }
  void all_gather(const void* send, void* recv, size_t sendcount, DType t) override {
    const auto in_collective = ft::section(ft::kCollective, "all_gather");
    ZAYA_NCCL_CHECK(ncclAllGather(send, recv, sendcount, nccl_type(t), comm_, stream_));
  }
  void broadcast(const void* send, void* recv, size_t count, DType t, int root) override {
    const auto in_collective = ft::section(ft::kCollective, "broadcast");
    ZAYA_NCCL_CHECK(ncclBroadcast(send, recv, count, nccl_type(t), root, comm_, stream_));
  }
  void group_begin() override { ZAYA_NCCL_CHECK(ncclGroupStart()); }
  void group_end() override {
    const auto in_collective = ft::section(ft::kCollective, "group");
    ZAYA_NCCL_CHECK(ncclGroupEnd());
  }
  void reduce(const void* send, void* recv, size_t count, DType t, RedOp op, int root) override {
    const auto in_collective = ft::section(ft::kCollective, "reduce");
    ZAYA_NCCL_CHECK(ncclReduce(send, recv, count, nccl_type(t), nccl_op(op), root, comm_, stream_));
  }
  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    const auto in_collective = ft::section(ft::kCollective, "all_to_all");
    ZAYA_CHECK(send != recv, "all_to_all has no in-place form");
    const size_t bytes = count * dtype_size(t);
    ZAYA_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size(); ++p) {
      ZAYA_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + size_t(p) * bytes, count,
                               nccl_type(t), p, comm_, stream_));
      ZAYA_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + size_t(p) * bytes, count, nccl_type(t), p,
                               comm_, stream_));
    }
    ZAYA_NCCL_CHECK(ncclGroupEnd());
  }
  void send(const void* buf, size_t count, DType t, int peer) override {
    const auto in_collective = ft::section(ft::kCollective, "send");
    ZAYA_NCCL_CHECK(ncclSend(buf, count, nccl_type(t), peer, comm_, stream_));
  }
  void recv(void* buf, size_t count, DType t, int peer) override {
    const auto in_collective = ft::section(ft::kCollective, "recv");
    ZAYA_NCCL_CHECK(ncclRecv(buf, count, nccl_type(t), peer, comm_, stream_));
  }
  void sendrecv(const void* sendbuf, size_t sendcount, int dest, void* recvbuf, size_t recvcount,
                int src, DType t) override {
    const auto in_collective = ft::section(ft::kCollective, "sendrecv");
    ZAYA_NCCL_CHECK(ncclGroupStart());
    ZAYA_NCCL_CHECK(ncclSend(sendbuf, sendcount, nccl_type(t), dest, comm_, stream_));
    ZAYA_NCCL_CHECK(ncclRecv(recvbuf, recvcount, nccl_type(t), src, comm_, stream_));
    ZAYA_NCCL_CHECK(ncclGroupEnd());
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const auto in_collective = ft::section(ft::kCollective, "split");
    synchronize();
    auto sub_boot = boot_->split_mpi(color, key);
    ncclComm_t sub = nullptr;
    ZAYA_NCCL_CHECK(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    if (color < 0) return nullptr;
    return std::make_unique<NcclCommunicator>(std::move(sub_boot), sub, device_);
  }

  void host_all_reduce(double* values, size_t n, RedOp op) override {
    boot_->host_all_reduce(values, n, op);
  }
  std::vector<std::string> host_all_gather(const std::string& s) override {
    return boot_->host_all_gather(s);
  }

  bool buffer_on_device() const override { return true; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    return p;
  }
  void free(void* p) override { cudaFree(p); }
  void copy_to_buffer(void* dst, const void* host_src, size_t bytes) override {
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    synchronize();
  }
  void copy_from_buffer(void* host_dst, const void* src, size_t bytes) override {
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void after_stream(void* stream) override {
    // The event captures the stream's work enqueued so far; the wait is enqueued, not waited.
    ZAYA_CUDA_CHECK(cudaEventRecord(order_, static_cast<cudaStream_t>(stream)));
    ZAYA_CUDA_CHECK(cudaStreamWaitEvent(stream_, order_, 0));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) ZAYA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  int mark() override { return marks_.mark(stream_); }
  void stream_wait(void* stream, int mark) override {
    marks_.wait(static_cast<cudaStream_t>(stream), mark);
  }
  void clear_marks() override { marks_.clear(); }

 private:
  std::unique_ptr<MpiCommunicator> boot_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t order_ = nullptr;  // after_stream's marker (recorded and waited for at once)
  CudaStreamMarks marks_;        // mark()'s events, reused after clear_marks()
  int device_ = 0;
  int abort_id_ = -1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_world() {
  ensure_mpi_initialized();
  auto boot = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  // The local rank (position among the ranks of this node) picks the GPU.
  MPI_Comm node = MPI_COMM_NULL;
  ZAYA_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, boot->rank(),
                                     MPI_INFO_NULL, &node));
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  int ndev = 0;
  ZAYA_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  ZAYA_CHECK(ndev > 0, "the NCCL communicator needs a CUDA device; none is visible");
  const int device = local % ndev;
  ZAYA_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  if (boot->rank() == 0) ZAYA_NCCL_CHECK(ncclGetUniqueId(&id));
  ZAYA_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
  ncclComm_t comm = nullptr;
  {
    // Collective over the world: a rank that never joins leaves the others here.
    const auto in_collective = ft::section(ft::kCollective, "ncclCommInitRank");
    ZAYA_NCCL_CHECK(ncclCommInitRank(&comm, boot->size(), id, boot->rank()));
  }
  return std::make_unique<NcclCommunicator>(std::move(boot), comm, device);
}

#endif  // ZAYA_HAVE_MPI

}  // namespace zaya::detail
