// The launch-timing protocol of TimingPolicy (gemm_bench.h), shared by `zaya bench gemm` and
// `zaya bench kernels`: a stream and a pool of reusable CUDA events (TimedStream), launches
// enqueued behind a spin kernel that holds the stream, one event between consecutive launches,
// the median; optionally the launches' wall-clock window and NVML clock/power samples (Nvml).
// CUDA builds only.
#pragma once
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/gemm_bench.h"
#include "core/cuda_check.h"

namespace zaya::bench {

// CUDA events reused across measurements (creating hundreds per shape would cost host time).
struct EventPool {
  std::vector<cudaEvent_t> ev;
  void ensure(size_t n) {
    while (ev.size() < n) {
      cudaEvent_t e;
      ZAYA_CUDA_CHECK(cudaEventCreate(&e));
      ev.push_back(e);
    }
  }
  ~EventPool() {
    for (auto e : ev) cudaEventDestroy(e);
  }
};

// A non-blocking stream and the events its measurements reuse.
struct TimedStream {
  cudaStream_t st = nullptr;
  EventPool events;
  TimedStream() { ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)); }
  ~TimedStream() { cudaStreamDestroy(st); }
  TimedStream(const TimedStream&) = delete;
  TimedStream& operator=(const TimedStream&) = delete;
};

// The GPU's SM clock, power and temperature through NVML, loaded with dlopen (the driver's
// libnvidia-ml.so.1; no build dependency). Absent library or device: ok() is false and rows carry
// no samples. Used only to attribute a zaya/peer difference to the clock (tools/bench_peer.py
// samples the same way), never to correct a measurement.
class Nvml {
 public:
  explicit Nvml(int cuda_device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
    auto by_pci = reinterpret_cast<int (*)(const char*, void**)>(
        dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"));
    clock_ =
        reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
    temp_ =
        reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetTemperature"));
    void* r = dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!r) r = dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons");
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(r);
    char bus[64] = {0};
    if (!init || !by_pci || !clock_ || init() != 0) {
      close();
      return;
    }
    initialised_ = true;
    if (cudaDeviceGetPCIBusId(bus, int(sizeof(bus)), cuda_device) != cudaSuccess ||
        by_pci(bus, &dev_) != 0) {
      (void)cudaGetLastError();
      close();
    }
  }
  ~Nvml() { close(); }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  bool ok() const { return dev_ != nullptr; }
  // Adds one sample to `w` (a no-op without NVML).
  void sample(GpuWindow& w) const {
    unsigned mhz = 0, mw = 0, c = 0;
    unsigned long long why = 0;
    if (!ok() || clock_(dev_, 1 /* NVML_CLOCK_SM */, &mhz) != 0) return;
    w.samples += 1;
    w.sm_clock_mhz += mhz;
    w.sm_clock_min_mhz = w.samples == 1 ? mhz : std::min<double>(w.sm_clock_min_mhz, mhz);
    if (power_ && power_(dev_, &mw) == 0) w.power_w += mw * 1e-3;
    if (temp_ && temp_(dev_, 0 /* NVML_TEMPERATURE_GPU */, &c) == 0) w.temp_c += c;
    if (reasons_ && reasons_(dev_, &why) == 0) w.clock_reasons |= why;
  }

 private:
  void close() {
    dev_ = nullptr;
    if (initialised_ && shutdown_) shutdown_();
    initialised_ = false;
    if (lib_) dlclose(lib_);
    lib_ = nullptr;
  }
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  bool initialised_ = false;
  int (*shutdown_)() = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*temp_)(void*, int, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
};

using Launch = std::function<void(int)>;  // launch(i): one launch on operand set i

struct Timed {
  double us = 0;
  int iters = 0, warm = 0;
  GpuWindow gpu;  // the timed launches' wall-clock window and NVML samples
};

// One CUDA graph per operand set, each holding what launch(i) enqueues, captured on the
// stream; replay() launches set i's graph. This is how tools/bench_peer.py times torch._scaled_mm
// (whose direct calls synchronise the host): `zaya bench gemm --cuda-graph` times its rows the
// same way, so both sides pay the same per-launch cost on the GPU. When capture or instantiation
// fails, ok() is false and error() says why (the caller times direct launches instead).
class GraphLaunches {
 public:
  GraphLaunches(TimedStream& ctx, int sets, const Launch& launch);
  ~GraphLaunches();
  GraphLaunches(const GraphLaunches&) = delete;
  GraphLaunches& operator=(const GraphLaunches&) = delete;
  bool ok() const { return error_.empty() && !exec_.empty(); }
  const std::string& error() const { return error_; }
  Launch replay() const;

 private:
  cudaStream_t st_;
  std::vector<cudaGraphExec_t> exec_;
  std::string error_;
};

// Enqueues `n` launches (sets next, next+1, ... mod sets) behind a spin kernel holding the stream
// for `hold_us`, each between consecutive events; returns the per-launch times in microseconds.
// With `w`, the host polls the events instead of blocking and records the launches' wall-clock
// window and NVML samples in it.
std::vector<double> sample_launches(TimedStream& ctx, int n, double hold_us, int sets, int& next,
                                    const Launch& launch, GpuWindow* w = nullptr,
                                    const Nvml* nvml = nullptr);
// GPU time of one launch: 3 launches enqueued behind a hold, timed as a batch.
double estimate_us(TimedStream& ctx, const TimingPolicy& p, int sets, int& next,
                   const Launch& launch);
// The measurement protocol of TimingPolicy (gemm_bench.h).
Timed time_policy(TimedStream& ctx, const TimingPolicy& p, int sets, const Launch& launch,
                  const Nvml* nvml = nullptr);

}  // namespace zaya::bench
