// Times the CPU reference training step's forward + backward (model/backward.h) on the tiny preset:
// B sequences of S random byte tokens, `iters` calls after one warm-up, and prints ms per step,
// tokens per second (wall) and per CPU-second (process CPU time, which is what a shared machine
// lets one compare), plus a hash of the accumulated gradients (equal for every ZAYA_THREADS value).
// Not part of the build; from the repository root, after building libzaya in build/:
//   g++ -std=gnu++20 -O2 -Isrc tools/bench_cpu_step.cpp build/libzaya.a -lfmt -lxxhash -lpthread
//       -o /tmp/bench_cpu_step
//   ZAYA_THREADS=1 /tmp/bench_cpu_step 8 128 10     # B S iterations
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "core/parallel.h"
#include "model/backward.h"

using namespace zaya;

int main(int argc, char** argv) {
  const int64_t B = argc > 1 ? std::atoi(argv[1]) : 8, S = argc > 2 ? std::atoi(argv[2]) : 128;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 10;
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 5);
  ModelGrads g = make_grads(m);
  std::vector<int32_t> ids(size_t(B * S)), targets(size_t(B * S));
  uint64_t s = 88172645463325252ull;  // xorshift64: the same tokens on every machine
  for (auto& x : ids) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = int32_t(s % 256);
  }
  for (int64_t i = 0; i < B * S; i++) targets[size_t(i)] = i % S == S - 1 ? -1 : ids[size_t(i + 1)];
  StepStats st = forward_backward(m, ids.data(), targets.data(), B, S, g);  // warm-up
  g.zero();
  const std::clock_t c0 = std::clock();
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; it++) st = forward_backward(m, ids.data(), targets.data(), B, S, g);
  const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the gradient bits
  for (auto& [name, t] : g.tensors)
    for (int64_t i = 0; i < t.numel(); i++) {
      uint32_t u;
      std::memcpy(&u, t.f32() + i, 4);
      h = (h ^ u) * 1099511628211ull;
    }
  const double tokens = double(B * S) * iters;
  std::printf(
      "threads %d, B %lld S %lld: %.1f ms/step, %.0f tokens/s, %.0f tokens/CPU-s, loss %.9f, "
      "gradient hash %016llx\n",
      num_threads(), (long long)B, (long long)S, 1e3 * wall / iters, tokens / wall, tokens / cpu,
      st.loss, (unsigned long long)h);
}
