// The data-parallel step's overlapped weight all-gather on one GPU (label gpu; skipped without a
// CUDA device). NCCL refuses two ranks on one card, so rank 0 of a two-rank world runs against an
// in-process peer: a device communicator whose collectives are stream-ordered copies on its own
// stream (the peer's gradients equal this rank's; its updated weights are a fixed pattern that
// changes every step), and whose first all-gather of each step is held back 50 ms on the stream.
// With the overlap on, the next forward must wait layer by layer for what the gather brings; the
// same steps with the overlap off (the whole gather waited for before the next step) are the
// reference. A forward that read a layer before its part of the gather had landed would see the
// previous step's pattern and give other losses.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/stream_marks.h"
#include "engine/data_parallel_step.h"
#include "gpu_test_util.h"
#include "model/zaya.h"

namespace zaya {
namespace {

using test_util::have_gpu;

// Rank 0 of a two-rank world in this process: the operations the data-parallel step does not
// use throw.
class PeerBase : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string host_name() const override { return "local"; }
  void all_to_all(const void*, void*, size_t, DType) override { unused("all_to_all"); }
  void send(const void*, size_t, DType, int) override { unused("send"); }
  void recv(void*, size_t, DType, int) override { unused("recv"); }
  void sendrecv(const void*, size_t, int, void*, size_t, int, DType) override {
    unused("sendrecv");
  }
  std::unique_ptr<Communicator> split(int, int) override {
    unused("split");
    return nullptr;
  }
  std::vector<std::string> host_all_gather(const std::string& s) override { return {s, s}; }

 protected:
  void unused(const char* what) const {
    throw Error(fmt::format("{} peer: {} is not used here", backend(), what));
  }
};

// The host side: the peer's numbers equal this rank's (sums double).
class PeerHost final : public PeerBase {
 public:
  std::string backend() const override { return "mpi"; }
  void barrier() override {}
  void synchronize() override {}
  void all_reduce(const void*, void*, size_t, DType, RedOp) override { unused("all_reduce"); }
  void reduce_scatter(const void*, void*, size_t, DType, RedOp) override {
    unused("reduce_scatter");
  }
  void all_gather(const void*, void*, size_t, DType) override { unused("all_gather"); }
  void broadcast(const void*, void*, size_t, DType, int) override { unused("broadcast"); }
  void reduce(const void*, void*, size_t, DType, RedOp, int) override { unused("reduce"); }
  void host_all_reduce(double* v, size_t n, RedOp op) override {
    if (op == RedOp::Sum)
      for (size_t i = 0; i < n; i++) v[i] *= 2;
  }
  bool buffer_on_device() const override { return false; }
  void* alloc(size_t bytes) override { return std::malloc(std::max<size_t>(bytes, 16)); }
  void free(void* p) override { std::free(p); }
  void copy_to_buffer(void* d, const void* s, size_t b) override { std::memcpy(d, s, b); }
  void copy_from_buffer(void* d, const void* s, size_t b) override { std::memcpy(d, s, b); }
};

// The GPU side, every operation on its own stream (NCCL's semantics).
class PeerDevice final : public PeerBase {
 public:
  std::string backend() const override { return "nccl-like"; }
  PeerDevice() {
    ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    ZAYA_CUDA_CHECK(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming));
  }
  ~PeerDevice() override {
    cudaStreamSynchronize(st_);
    cudaEventDestroy(order_);
    cudaFree(pattern_);
    cudaStreamDestroy(st_);
  }
  void barrier() override { synchronize(); }
  void synchronize() override { ZAYA_CUDA_CHECK(cudaStreamSynchronize(st_)); }
  void all_reduce(const void* s, void* r, size_t n, DType t, RedOp op) override {
    ZAYA_CHECK(t == DType::F32 && op == RedOp::Sum, "PeerDevice: all_reduce of f32 sums only");
    if (r != s) copy(r, s, n * sizeof(float));  // in place: r == s
    cuda::scale_f32(static_cast<float*>(r), 2.0f, int64_t(n), st_);
  }
  // Block 0 of the peer's send equals this rank's (same gradients): twice this rank's block 0.
  void reduce_scatter(const void* s, void* r, size_t n, DType t, RedOp op) override {
    ZAYA_CHECK(t == DType::F32 && op == RedOp::Sum, "PeerDevice: reduce_scatter of f32 sums only");
    if (r != s) copy(r, s, n * sizeof(float));  // in place (rank 0): r == s
    cuda::scale_f32(static_cast<float*>(r), 2.0f, int64_t(n), st_);
  }
  // Root 0 (this rank): twice its own; root 1: nothing lands here.
  void reduce(const void* s, void* r, size_t n, DType t, RedOp op, int root) override {
    ZAYA_CHECK(t == DType::F32 && op == RedOp::Sum, "PeerDevice: reduce of f32 sums only");
    if (root != 0) return;
    if (r != s) copy(r, s, n * sizeof(float));
    cuda::scale_f32(static_cast<float*>(r), 2.0f, int64_t(n), st_);
  }
  // Block 0: this rank's part; block 1: the peer's, a pattern scaled by the step. The first of a
  // step waits 50 ms on the stream first.
  void all_gather(const void* s, void* r, size_t n, DType t) override {
    ZAYA_CHECK(t == DType::F32, "PeerDevice: all_gather of f32 only");
    float* rf = static_cast<float*>(r);
    if (rf != s) copy(rf, s, n * sizeof(float));  // rank 0 in place: s == r
    peer_part(rf + n, n);
  }
  // Root 1 (the peer): its pattern; root 0: this rank's own, in place.
  void broadcast(const void* s, void* r, size_t n, DType t, int root) override {
    ZAYA_CHECK(t == DType::F32, "PeerDevice: broadcast of f32 only");
    if (root == 0) {
      if (r != s) copy(r, s, n * sizeof(float));
      return;
    }
    peer_part(static_cast<float*>(r), n);
  }
  void host_all_reduce(double*, size_t, RedOp) override { unused("host_all_reduce"); }
  bool buffer_on_device() const override { return true; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    return p;
  }
  void free(void* p) override { cudaFree(p); }
  void copy_to_buffer(void* d, const void* s, size_t b) override {
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(d, s, b, cudaMemcpyHostToDevice, st_));
    synchronize();
  }
  void copy_from_buffer(void* d, const void* s, size_t b) override {
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(d, s, b, cudaMemcpyDeviceToHost, st_));
    synchronize();
  }
  void after_stream(void* stream) override {
    ZAYA_CUDA_CHECK(cudaEventRecord(order_, static_cast<cudaStream_t>(stream)));
    ZAYA_CUDA_CHECK(cudaStreamWaitEvent(st_, order_, 0));
  }
  void copy(void* d, const void* s, size_t b) override {
    if (b) ZAYA_CUDA_CHECK(cudaMemcpyAsync(d, s, b, cudaMemcpyDefault, st_));
  }
  int mark() override { return marks_.mark(st_); }
  void peer_part(float* dst, size_t n) {
    if (!delayed_) {
      ZAYA_CUDA_CHECK(cudaLaunchHostFunc(
          st_, [](void*) { usleep(50000); }, nullptr));
      delayed_ = true;
    }
    if (int64_t(n) > n_) {  // the pattern, grown to the largest part asked for
      ZAYA_CUDA_CHECK(cudaStreamSynchronize(st_));
      std::vector<float> p(n);
      for (size_t i = 0; i < n; i++) p[i] = 0.02f * std::sin(0.37f * float(i));
      cudaFree(pattern_);
      ZAYA_CUDA_CHECK(cudaMalloc(&pattern_, n * sizeof(float)));
      ZAYA_CUDA_CHECK(cudaMemcpy(pattern_, p.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      n_ = int64_t(n);
    }
    copy(dst, pattern_, n * sizeof(float));
    cuda::scale_f32(dst, 1.0f + 0.1f * float(phase_), int64_t(n), st_);
  }
  void stream_wait(void* stream, int m) override {
    marks_.wait(static_cast<cudaStream_t>(stream), m);
  }
  void clear_marks() override {
    marks_.clear();
    phase_++;
    delayed_ = false;
  }

 private:
  int64_t n_ = 0;
  cudaStream_t st_ = nullptr;
  cudaEvent_t order_ = nullptr;
  CudaStreamMarks marks_;
  float* pattern_ = nullptr;
  int phase_ = 0;
  bool delayed_ = false;
};

struct Trained {
  std::vector<double> losses;
  std::vector<float> weights;  // every tensor after the last step, in tensor_slots() order
  double waited = 0;           // the overlapped gather's wait in the last forward
};

Trained train(bool overlap) {
  const ZayaConfig c = test_util::small_gpu_config(3);
  ZayaModel model = ZayaModel::init(c, 5);
  const int64_t B = 2, S = 64, bucket = 2048;
  TrainStepOptions o;
  o.device = "cuda";
  o.max_tokens = B * S;
  o.max_seq = S;
  PeerDevice dev;
  PeerHost host;
  auto step = make_data_parallel_step(model, OptimizerSettings{}, BalancingSettings{}, o, dev, host,
                                      bucket, overlap);
  Rng r(9);
  std::vector<int32_t> ids(size_t(B * S)), tgt(size_t(B * S));
  Trained out;
  for (int s = 0; s < 5; s++) {
    for (auto& x : ids) x = int32_t(r.next_u32() % uint32_t(c.vocab_size));
    for (int64_t i = 0; i < B * S; i++) tgt[size_t(i)] = (i + 1) % S ? ids[size_t(i + 1)] : -1;
    step->zero_grads();
    step->begin_accumulation(1);
    const StepStats st = step->forward_backward(ids.data(), tgt.data(), B, S, 0.5f);
    out.losses.push_back(st.loss);
    const double norm = std::sqrt(step->grad_sq_norm());
    step->optimizer_step(1e-3, norm > 1.0 ? float(1.0 / (norm + 1e-6)) : 1.0f);
    out.waited = step->last_times().all_gather_wait;  // of this step's forward
  }
  step->export_weights(model);
  for (auto& [name, t] : model.tensor_slots()) {
    const Tensor f = t->to(DType::F32);
    out.weights.insert(out.weights.end(), f.f32(), f.f32() + f.numel());
  }
  return out;
}

TEST(DataParallelCuda, OverlappedGatherGivesTheBlockingGathersBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Trained blocking = train(false), overlapped = train(true);
  ASSERT_EQ(blocking.losses.size(), overlapped.losses.size());
  for (size_t i = 0; i < blocking.losses.size(); i++)
    EXPECT_EQ(blocking.losses[i], overlapped.losses[i]) << "step " << i;
  ASSERT_EQ(blocking.weights.size(), overlapped.weights.size());
  EXPECT_EQ(0, std::memcmp(blocking.weights.data(), overlapped.weights.data(),
                           blocking.weights.size() * sizeof(float)));
  EXPECT_EQ(blocking.waited, 0.0) << "the blocking gather has nothing left for the forward";
  EXPECT_GT(overlapped.waited, 0.0) << "the forward did not wait for the overlapped gather";
}

}  // namespace
}  // namespace zaya
