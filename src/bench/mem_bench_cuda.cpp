// The measurement half of `zaya bench mem` (see mem_bench.h). Device kernels and device-to-device
// cudaMemcpy are timed per iteration with CUDA events (median); host<->device copies from pinned
// memory likewise; copies from pageable memory with the host clock around a synchronous
// cudaMemcpy, since the driver stages them through its own pinned buffers on the host thread.
// copy, memcpy_d2d and the host<->device copies check their destination against the source
// pattern once per size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "bench/bench_common.h"
#include "bench/bench_kernels.h"
#include "bench/mem_bench.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace zaya::bench {

namespace {

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t b) { ZAYA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(b, 16))); }
  ~Dev() { cudaFree(p); }
};
struct Pinned {
  void* p = nullptr;
  explicit Pinned(size_t b) { ZAYA_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(b, 16))); }
  ~Pinned() { cudaFreeHost(p); }
};

double time_events(cudaStream_t st, int warmup, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<cudaEvent_t> a(static_cast<size_t>(iters)), b(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    ZAYA_CUDA_CHECK(cudaEventCreate(&a[size_t(i)]));
    ZAYA_CUDA_CHECK(cudaEventCreate(&b[size_t(i)]));
  }
  for (int i = 0; i < iters; ++i) {
    ZAYA_CUDA_CHECK(cudaEventRecord(a[size_t(i)], st));
    f();
    ZAYA_CUDA_CHECK(cudaEventRecord(b[size_t(i)], st));
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    ZAYA_CUDA_CHECK(cudaEventElapsedTime(&ms, a[size_t(i)], b[size_t(i)]));
    t.push_back(ms * 1e3);
    cudaEventDestroy(a[size_t(i)]);
    cudaEventDestroy(b[size_t(i)]);
  }
  return median(t);
}

double time_host(int warmup, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

int64_t host_mismatches(const void* p, uint64_t bytes, uint32_t seed) {
  const auto* w = static_cast<const uint32_t*>(p);
  int64_t bad = 0;
  for (uint64_t i = 0; i < bytes / 4; ++i) bad += w[i] != kernels::pattern_word(i, seed);
  return bad;
}
void host_fill(void* p, uint64_t bytes, uint32_t seed) {
  auto* w = static_cast<uint32_t*>(p);
  for (uint64_t i = 0; i < bytes / 4; ++i) w[i] = kernels::pattern_word(i, seed);
}

}  // namespace

std::vector<MemResult> run_mem_bench(const MemBenchOptions& opt, double peak_gbs) {
  ZAYA_CUDA_CHECK(cudaSetDevice(opt.device));
  cudaStream_t st;
  ZAYA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> st_guard(
      st, [](cudaStream_t s) { cudaStreamDestroy(s); });
  Dev sink(16), counter(16);
  std::vector<MemResult> out;
  auto has = [&](const char* t) {
    return std::find(opt.tests.begin(), opt.tests.end(), t) != opt.tests.end();
  };
  auto device_count = [&](const void* p, uint64_t bytes, uint32_t seed) {
    kernels::count_pattern_mismatch(p, bytes, seed, static_cast<unsigned long long*>(counter.p),
                                    st);
    unsigned long long bad = 0;
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(&bad, counter.p, sizeof(bad), cudaMemcpyDeviceToHost, st));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
    return int64_t(bad);
  };
  for (uint64_t size : opt.sizes) {
    const uint64_t bytes = std::max<uint64_t>(16, size / 16 * 16);
    size_t free_b = 0, total_b = 0;
    ZAYA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (3 * bytes + (64u << 20) > free_b) {
      std::fprintf(stderr,
                   "zaya bench mem: %llu bytes x 3 buffers do not fit in %zu MiB free; "
                   "skipped\n",
                   (unsigned long long)bytes, free_b >> 20);
      continue;
    }
    Dev a(bytes), b(bytes), c(bytes);
    kernels::fill_pattern(b.p, bytes, 7, st);
    kernels::fill_pattern(c.p, bytes, 9, st);
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
    auto add = [&](const std::string& test, double us, bool device_side, int64_t wrong) {
      MemResult r;
      r.test = test;
      r.bytes = bytes;
      r.moved = mem_bytes_moved(test, bytes);
      r.time_us = us;
      r.gbs = us > 0 ? double(r.moved) / (us * 1e-6) / 1e9 : 0;
      r.fraction = device_side && peak_gbs > 0 ? r.gbs / peak_gbs : 0;
      r.wrong = wrong;
      out.push_back(r);
      std::printf("%s\n", mem_table_row(r).c_str());
      std::fflush(stdout);
    };
    for (const auto& t : opt.tests) {
      if (t == "read") {
        add(t,
            time_events(st, opt.warmup, opt.iters,
                        [&] { kernels::mem_read(b.p, bytes, static_cast<float*>(sink.p), st); }),
            true, -1);
      } else if (t == "write") {
        add(t, time_events(st, opt.warmup, opt.iters, [&] { kernels::mem_write(a.p, bytes, st); }),
            true, -1);
      } else if (t == "copy") {
        const double us =
            time_events(st, opt.warmup, opt.iters, [&] { kernels::mem_copy(a.p, b.p, bytes, st); });
        add(t, us, true, device_count(a.p, bytes, 7));
      } else if (t == "triad") {
        add(t,
            time_events(st, opt.warmup, opt.iters,
                        [&] { kernels::mem_triad(a.p, b.p, c.p, bytes, 3.0f, st); }),
            true, -1);
      } else if (t == "memcpy_d2d") {
        const double us = time_events(st, opt.warmup, opt.iters, [&] {
          ZAYA_CUDA_CHECK(cudaMemcpyAsync(a.p, b.p, bytes, cudaMemcpyDeviceToDevice, st));
        });
        add(t, us, true, device_count(a.p, bytes, 7));
      }
    }
    // Host tests are capped at 2 GiB: beyond that they only measure the same PCIe plateau.
    const bool host_tests =
        has("h2d_pinned") || has("d2h_pinned") || has("h2d_pageable") || has("d2h_pageable");
    if (!host_tests || bytes > (uint64_t(2) << 30)) continue;
    if (has("h2d_pinned") || has("d2h_pinned")) {
      Pinned h(bytes);
      host_fill(h.p, bytes, 11);
      if (has("h2d_pinned")) {
        const double us = time_events(st, opt.warmup, opt.iters, [&] {
          ZAYA_CUDA_CHECK(cudaMemcpyAsync(a.p, h.p, bytes, cudaMemcpyHostToDevice, st));
        });
        add("h2d_pinned", us, false, device_count(a.p, bytes, 11));
      }
      if (has("d2h_pinned")) {
        const double us = time_events(st, opt.warmup, opt.iters, [&] {
          ZAYA_CUDA_CHECK(cudaMemcpyAsync(h.p, b.p, bytes, cudaMemcpyDeviceToHost, st));
        });
        add("d2h_pinned", us, false, host_mismatches(h.p, bytes, 7));
      }
    }
    if (has("h2d_pageable") || has("d2h_pageable")) {
      std::unique_ptr<void, void (*)(void*)> h(std::malloc(bytes), std::free);
      ZAYA_CHECK(h != nullptr, "cannot allocate {} bytes of host memory", bytes);
      host_fill(h.get(), bytes, 13);  // also faults every page in before timing
      if (has("h2d_pageable")) {
        const double us = time_host(opt.warmup, opt.iters, [&] {
          ZAYA_CUDA_CHECK(cudaMemcpy(a.p, h.get(), bytes, cudaMemcpyHostToDevice));
        });
        add("h2d_pageable", us, false, device_count(a.p, bytes, 13));
      }
      if (has("d2h_pageable")) {
        const double us = time_host(opt.warmup, opt.iters, [&] {
          ZAYA_CUDA_CHECK(cudaMemcpy(h.get(), b.p, bytes, cudaMemcpyDeviceToHost));
        });
        add("d2h_pageable", us, false, host_mismatches(h.get(), bytes, 7));
      }
    }
  }
  return out;
}

}  // namespace zaya::bench
