// Internal: the MPI communicator class, shared by comm_mpi.cpp and the NCCL communicator (which
// bootstraps over MPI and keeps an MPI communicator alongside for host-side bookkeeping). Only
// files built with MPI include this.
#pragma once
#include <memory>
#include <string>

#include "core/cuda_check.h"
#include "dist/comm.h"

namespace zaya::detail {

// Initialises MPI once per process (MPI_THREAD_FUNNELED) and finalises it at exit, unless the
// program had initialised it itself.
void ensure_mpi_initialized();
// MPI datatype and reduction for a zaya dtype; bf16 and fp16 use zaya's own 2-byte type and
// user-defined reductions that accumulate in fp32 and round once, as the GPU libraries do.
MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_op(RedOp op, DType t);

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;

  MPI_Comm handle() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string host_name() const override;

  void barrier() override;
  void synchronize() override {}

  void all_reduce(const void* send, void* recv, size_t count, DType t, RedOp op) override;
  void reduce_scatter(const void* send, void* recv, size_t recvcount, DType t, RedOp op) override;
  void all_gather(const void* send, void* recv, size_t sendcount, DType t) override;
  void broadcast(const void* send, void* recv, size_t count, DType t, int root) override;
  void reduce(const void* send, void* recv, size_t count, DType t, RedOp op, int root) override;
  void all_to_all(const void* send, void* recv, size_t count, DType t) override;
  void send(const void* buf, size_t count, DType t, int peer) override;
  void recv(void* buf, size_t count, DType t, int peer) override;
  void sendrecv(const void* sendbuf, size_t sendcount, int dest, void* recvbuf, size_t recvcount,
                int src, DType t) override;

  std::unique_ptr<Communicator> split(int color, int key) override;
  // As split, but returning the concrete type (the NCCL communicator splits its bootstrap too).
  std::unique_ptr<MpiCommunicator> split_mpi(int color, int key);

  void host_all_reduce(double* values, size_t n, RedOp op) override;
  std::vector<std::string> host_all_gather(const std::string& s) override;

  bool buffer_on_device() const override { return false; }
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void copy_to_buffer(void* dst, const void* host_src, size_t bytes) override;
  void copy_from_buffer(void* host_dst, const void* src, size_t bytes) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace zaya::detail
