// launch_timing_cuda.h: the TimingPolicy measurement protocol on a TimedStream.
#include "bench/launch_timing_cuda.h"

#include <chrono>
#include <thread>

#include "bench/bench_common.h"
#include "bench/bench_kernels.h"

namespace zaya::bench {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Whether `e` has completed; a not-ready query leaves cudaErrorNotReady as the last error, which
// is cleared here (as PyTorch's CUDAEvent::query does) so it cannot surface in a later check.
bool event_done(cudaEvent_t e) {
  const cudaError_t rc = cudaEventQuery(e);
  if (rc == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  ZAYA_CUDA_CHECK(rc);
  return true;
}

}  // namespace

// Enqueues `n` launches (sets next, next+1, ... mod sets) behind a spin kernel holding the stream
// for `hold_us`, each between consecutive events; returns the per-launch times in microseconds.
// With `w`, the host instead of blocking polls the events: it notes the wall-clock time at which
// it sees the first event (the end of the hold) and the last complete, and samples NVML about
// every millisecond in between. Polling changes nothing on the GPU (all launches are enqueued).
std::vector<double> sample_launches(TimedStream& ctx, int n, double hold_us, int sets, int& next,
                                    const Launch& launch, GpuWindow* w, const Nvml* nvml) {
  ctx.events.ensure(size_t(n) + 1);
  if (hold_us > 0) kernels::spin(uint64_t(hold_us * 1e3), ctx.st);
  ZAYA_CUDA_CHECK(cudaEventRecord(ctx.events.ev[0], ctx.st));
  for (int i = 0; i < n; ++i) {
    launch(next++ % sets);
    ZAYA_CUDA_CHECK(cudaEventRecord(ctx.events.ev[size_t(i) + 1], ctx.st));
  }
  if (w) {
    const auto nap = std::chrono::microseconds(nvml && nvml->ok() ? 1000 : 200);
    while (!event_done(ctx.events.ev[0])) std::this_thread::sleep_for(nap);
    *w = GpuWindow{};
    w->t_start = unix_seconds();
    while (true) {
      const bool done = event_done(ctx.events.ev[size_t(n)]);
      if (nvml && (!done || w->samples == 0)) nvml->sample(*w);
      if (done) break;
      std::this_thread::sleep_for(nap);
    }
    w->t_end = unix_seconds();
    if (w->samples > 0) {
      w->sm_clock_mhz /= w->samples;
      w->power_w /= w->samples;
      w->temp_c /= w->samples;
    }
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(ctx.st));
  std::vector<double> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    float ms = 0;
    ZAYA_CUDA_CHECK(
        cudaEventElapsedTime(&ms, ctx.events.ev[size_t(i)], ctx.events.ev[size_t(i) + 1]));
    t[size_t(i)] = double(ms) * 1e3;
  }
  return t;
}

// GPU time of one launch: 3 launches enqueued behind a hold, timed as a batch.
double estimate_us(TimedStream& ctx, const TimingPolicy& p, int sets, int& next,
                   const Launch& launch) {
  ctx.events.ensure(2);
  kernels::spin(uint64_t(block_us(p, 3) * 1e3), ctx.st);
  ZAYA_CUDA_CHECK(cudaEventRecord(ctx.events.ev[0], ctx.st));
  for (int i = 0; i < 3; ++i) launch(next++ % sets);
  ZAYA_CUDA_CHECK(cudaEventRecord(ctx.events.ev[1], ctx.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(ctx.st));
  float ms = 0;
  ZAYA_CUDA_CHECK(cudaEventElapsedTime(&ms, ctx.events.ev[0], ctx.events.ev[1]));
  return double(ms) * 1e3 / 3;
}

// The measurement protocol of TimingPolicy (gemm_bench.h).
Timed time_policy(TimedStream& ctx, const TimingPolicy& p, int sets, const Launch& launch,
                  const Nvml* nvml) {
  int next = 0;
  for (int i = 0; i < p.warmup; ++i) launch(next++ % sets);
  const double est = estimate_us(ctx, p, sets, next, launch);
  Timed r;
  r.warm = warm_launches(p, est);
  for (int i = 0; i < r.warm; ++i) launch(next++ % sets);
  r.iters = timed_iters(p, est);
  r.us =
      median(sample_launches(ctx, r.iters, block_us(p, r.iters), sets, next, launch, &r.gpu, nvml));
  return r;
}

GraphLaunches::GraphLaunches(TimedStream& ctx, int sets, const Launch& launch) : st_(ctx.st) {
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st_));
  for (int i = 0; i < sets && error_.empty(); ++i) {
    cudaGraph_t g = nullptr;
    cudaError_t rc = cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal);
    if (rc == cudaSuccess) {
      try {
        launch(i);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
      // Ends the capture whatever happened inside it (a failed launch invalidates it).
      const cudaError_t end = cudaStreamEndCapture(st_, &g);
      if (error_.empty() && end != cudaSuccess) rc = end;
    }
    cudaGraphExec_t x = nullptr;
    if (error_.empty() && rc == cudaSuccess) rc = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (error_.empty() && rc != cudaSuccess) error_ = cudaGetErrorString(rc);
    if (x) exec_.push_back(x);
  }
  if (!error_.empty()) (void)cudaGetLastError();  // the error a failed capture left
}

GraphLaunches::~GraphLaunches() {
  for (auto x : exec_) cudaGraphExecDestroy(x);
}

Launch GraphLaunches::replay() const {
  return [this](int i) { ZAYA_CUDA_CHECK(cudaGraphLaunch(exec_[size_t(i)], st_)); };
}

}  // namespace zaya::bench
