// A process-wide pool of worker threads for the CPU reference ops. parallel_for splits [0, n) into
// contiguous chunks, one per worker, so results never depend on scheduling (each index is computed
// by exactly one thread and reductions stay within a thread). One worker per usable CPU;
// ZAYA_THREADS overrides the count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace zaya {

int num_threads();
// The CPUs this process may run on (its affinity mask: a launcher that binds a rank to one core
// leaves it one), at least 1. The pool's default size, unless ZAYA_THREADS says otherwise.
int usable_cpus();
void set_num_threads(int n);
// Calls fn(begin, end) over disjoint ranges covering [0, n). Runs inline when n < min_chunk*2.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t min_chunk = 1);

// memset(p, 0, bytes), by up to num_threads() threads of its own from 64 MiB up. Most of the cost
// of zeroing a fresh multi-GB allocation is the first touch of its pages (a page fault each), which
// one thread pays serially (a 2 GiB buffer took over 3 s on one core). Safe to call from any
// thread: it does not use the parallel_for pool, which is not re-entrant from other threads.
void zero_bytes(void* p, size_t bytes);

}  // namespace zaya
