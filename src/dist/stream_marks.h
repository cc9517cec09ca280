// Points in a CUDA stream that other streams wait for later: the Communicator mark() /
// stream_wait() / clear_marks() contract (dist/comm.h) for communicators whose operations run on
// a stream of their own (NCCL). A pool of events, recorded in order and reused after clear().
// Header-only, for CUDA builds.
#pragma once
#include <cstddef>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"

namespace zaya {

class CudaStreamMarks {
 public:
  CudaStreamMarks() = default;
  CudaStreamMarks(const CudaStreamMarks&) = delete;
  CudaStreamMarks& operator=(const CudaStreamMarks&) = delete;
  ~CudaStreamMarks() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  // Records the point after the work enqueued so far on `stream`; returns its index.
  int mark(cudaStream_t stream) {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      ZAYA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    ZAYA_CUDA_CHECK(cudaEventRecord(events_[used_], stream));
    return int(used_++);
  }
  // Work enqueued later on `waiter` waits for point m (the wait captures the recording as of now;
  // re-recording the event after clear() changes nothing for it).
  void wait(cudaStream_t waiter, int m) const {
    ZAYA_CHECK(m >= 0 && size_t(m) < used_,
               "stream marks: mark {} was not recorded ({} since the "
               "last clear)",
               m, used_);
    ZAYA_CUDA_CHECK(cudaStreamWaitEvent(waiter, events_[size_t(m)], 0));
  }
  void clear() { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace zaya
