// A process-wide pool of worker threads for the CPU reference ops. parallel_for splits [0, n) into
// contiguous chunks, one per worker, so results never depend on scheduling (each index is computed
// by exactly one thread and reductions stay within a thread). ZAYA_THREADS overrides the count.
#pragma once
#include <cstdint>
#include <functional>

namespace zaya {

int num_threads();
void set_num_threads(int n);
// Calls fn(begin, end) over disjoint ranges covering [0, n). Runs inline when n < min_chunk*2.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t min_chunk = 1);

}  // namespace zaya
