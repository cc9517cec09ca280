// Communicator: the collective and point-to-point operations zaya's data/expert parallelism and
// `zaya bench comm` need, behind one interface with two implementations: MPI (host buffers,
// comm_mpi.cpp, built with ZAYA_HAVE_MPI) and NCCL (device buffers on one GPU per rank,
// bootstrapped over MPI, comm_nccl.cpp, built with ZAYA_HAVE_NCCL). Buffers are raw pointers plus a
// DType and an element count, in the memory space the communicator works in (buffer_on_device());
// alloc() and the copy helpers let backend-agnostic code (the benchmark) fill and read them.
//
// Semantics follow NCCL, so code is portable between the two:
//  - operations are issued in order on the communicator's stream (MPI: they complete on return);
//    synchronize() waits for all issued work;
//  - in-place reduce_scatter means recv == send + rank*recvcount, in-place all_gather means
//    send == recv + rank*sendcount, in-place all_reduce/reduce/broadcast means send == recv;
//  - all_to_all has no in-place form (NCCL has none).
// Not here: non-blocking handles, communicator-specific streams exposed to callers, and
// reductions other than sum/prod/max/min.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zaya {

enum class RedOp { Sum, Prod, Max, Min };
const char* redop_name(RedOp op);
// "sum", "prod", "max", "min"; throws zaya::Error naming `what` otherwise.
RedOp redop_from_name(const std::string& s, const std::string& what = "reduction");

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi" or "nccl"
  // The processor (host) name of this rank, as MPI_Get_processor_name reports it.
  virtual std::string host_name() const = 0;

  virtual void barrier() = 0;
  virtual void synchronize() = 0;  // waits for issued operations to complete on this rank

  // Collectives. Counts are elements. reduce_scatter: send holds size()*recvcount elements;
  // all_gather: recv holds size()*sendcount; all_to_all: both hold size()*count, block j of send
  // goes to rank j and block i of recv came from rank i.
  virtual void all_reduce(const void* send, void* recv, size_t count, DType t, RedOp op) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t recvcount, DType t,
                              RedOp op) = 0;
  virtual void all_gather(const void* send, void* recv, size_t sendcount, DType t) = 0;
  virtual void broadcast(const void* send, void* recv, size_t count, DType t, int root) = 0;
  // The reduction of every rank's send into root's recv (recv is not written on the others).
  virtual void reduce(const void* send, void* recv, size_t count, DType t, RedOp op, int root) = 0;
  virtual void all_to_all(const void* send, void* recv, size_t count, DType t) = 0;
  // Point to point. sendrecv issues both at once, so a ring exchange cannot deadlock.
  virtual void send(const void* buf, size_t count, DType t, int peer) = 0;
  virtual void recv(void* buf, size_t count, DType t, int peer) = 0;
  virtual void sendrecv(const void* sendbuf, size_t sendcount, int dest, void* recvbuf,
                        size_t recvcount, int src, DType t) = 0;

  // Splits into sub-communicators: ranks with the same color form one, ordered by key. Collective
  // over this communicator. A negative color means "not a member": the rank gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Small host-side reductions for bookkeeping (timings, error counts), whatever the backend.
  virtual void host_all_reduce(double* values, size_t n, RedOp op) = 0;
  // Gathers one string per rank (e.g. host names) to every rank, in rank order.
  virtual std::vector<std::string> host_all_gather(const std::string& s) = 0;

  // Memory in the communicator's space (host for MPI, the rank's GPU for NCCL).
  virtual bool buffer_on_device() const = 0;
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_buffer(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_from_buffer(void* host_dst, const void* src, size_t bytes) = 0;
  // Stream order for device buffers (NCCL): after_stream makes the communicator's later
  // operations wait for the work enqueued so far on `stream` (a cudaStream_t of this rank's GPU,
  // e.g. a training step's), without blocking the host; copy enqueues a copy between device
  // buffers in order with the communicator's operations (synchronize() waits for it). MPI: host
  // memory, nothing to order, and copy is memcpy.
  virtual void after_stream(void* stream) { (void)stream; }
  virtual void copy(void* dst, const void* src, size_t bytes);
  // The other direction, for work issued ahead of its readers: mark() records the point after
  // the operations issued so far and returns its index (0, 1, ... since the last clear_marks());
  // stream_wait(stream, m) makes work enqueued later on `stream` wait for point m, without
  // blocking the host. Marks stay valid until clear_marks(), which may be called once nothing
  // waits for them any more. MPI: operations complete on return, so there is nothing to wait for.
  virtual int mark() { return 0; }
  virtual void stream_wait(void* stream, int mark) {
    (void)stream;
    (void)mark;
  }
  virtual void clear_marks() {}
  // Operations issued between group_begin() and group_end() may run at once (NCCL's group:
  // e.g. several reductions to different roots); MPI: nothing (each completes on return).
  virtual void group_begin() {}
  virtual void group_end() {}

  // Typed conveniences for the common host types.
  template <typename T>
  void all_reduce(const T* send, T* recv, size_t count, RedOp op) {
    all_reduce(send, recv, count, dtype_of<T>(), op);
  }

 private:
  template <typename T>
  static DType dtype_of();
};

template <>
inline DType Communicator::dtype_of<float>() {
  return DType::F32;
}
template <>
inline DType Communicator::dtype_of<double>() {
  return DType::F64;
}
template <>
inline DType Communicator::dtype_of<int32_t>() {
  return DType::I32;
}
template <>
inline DType Communicator::dtype_of<int64_t>() {
  return DType::I64;
}

// Creates the world communicator of a backend: "mpi" or "nccl". MPI is initialised on first use
// (and finalised at exit); NCCL picks the GPU local_rank % device_count, where the local rank comes
// from the ranks sharing this node. Throws zaya::Error when the backend was not compiled in.
std::unique_ptr<Communicator> make_world_communicator(const std::string& backend);
// Whether a backend is compiled into this build.
bool communicator_available(const std::string& backend);

}  // namespace zaya
