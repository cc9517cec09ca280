// nccl_direct: a plain NCCL all-reduce loop, the peer that `zaya bench comm --backend nccl` is
// checked against (tools/device/bench_h200.sh builds and runs it beside zaya). It follows
// nccl-tests' all_reduce_perf: one process driving -g GPUs through ncclCommInitAll, sizes from -b
// to -e by a factor -f (1024-based K/M/G suffixes), count = size / element size, for each size an
// out-of-place (send != recv) and an in-place (send == recv) run; -w warm-up calls, then -n calls
// issued back to back (each a ncclGroupStart/End over the GPUs), one synchronize of every stream,
// and time = host wall time / n. algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests'
// definitions, the ones src/bench/bench_common.h uses). Before timing, each size and placement is
// checked once: rank r's element i is (i mod 5) + r, so every output element must equal
// ranks * (i mod 5) + ranks(ranks-1)/2 exactly (small integers are exact in bf16/half/float); the
// `wrong` column counts elements that differ (all GPUs together).
//
// Differences from zaya's harness, by design: zaya runs one MPI rank per GPU and reports the
// maximum time over ranks; with one process there is one time. Only all-reduce with sum is
// measured; the other collectives of `zaya bench comm` have no peer here.
//
// This is a stand-alone tool, not part of libzaya: it includes only CUDA, NCCL and the standard
// library, and reports errors itself (the zaya::Error machinery of src/core lives in libzaya).
// Build: nvcc -O2 -std=c++17 -o nccl_direct tools/nccl_direct.cu -lnccl
// Usage: nccl_direct [-g GPUS] [-b 8] [-e 128M] [-f 2] [-d bfloat16|half|float] [-n 20] [-w 5]
//                    [-c 1] [--json FILE]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "nccl_direct: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                                    \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

#define CHECK_NCCL(call)                                                                       \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) {                                                                   \
      std::fprintf(stderr, "nccl_direct: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   ncclGetErrorString(r_));                                                    \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr,
               "nccl_direct: %s\nusage: nccl_direct [-g GPUS] [-b MINBYTES] [-e MAXBYTES] "
               "[-f FACTOR] [-d bfloat16|half|float] [-n ITERS] [-w WARMUP] [-c 0|1] "
               "[--json FILE]\n",
               msg.c_str());
  std::exit(2);
}

// "8", "1K", "128M", "8G" (1024-based), as nccl-tests and `zaya bench comm` read them.
uint64_t parse_size(const std::string& s) {
  if (s.empty()) usage_error("empty size");
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (...) {
    usage_error("bad size '" + s + "'");
  }
  const std::string suf = s.substr(pos);
  uint64_t mul = 1;
  if (suf == "K" || suf == "k")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "m")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "g")
    mul = 1ull << 30;
  else if (!suf.empty())
    usage_error("bad size suffix in '" + s + "'");
  return uint64_t(v) * mul;
}

struct Dtype {
  const char* name;  // nccl-tests' spelling
  ncclDataType_t nccl;
  size_t size;
};

Dtype parse_dtype(const std::string& s) {
  if (s == "bfloat16") return {"bfloat16", ncclBfloat16, 2};
  if (s == "half" || s == "float16") return {"half", ncclHalf, 2};
  if (s == "float" || s == "float32") return {"float", ncclFloat, 4};
  usage_error("unsupported dtype '" + s + "' (bfloat16, half, float)");
}

// Host encode/decode of small integers in the chosen dtype.
void store(const Dtype& t, void* base, uint64_t i, float v) {
  if (t.nccl == ncclBfloat16)
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(v);
  else if (t.nccl == ncclHalf)
    static_cast<__half*>(base)[i] = __float2half(v);
  else
    static_cast<float*>(base)[i] = v;
}
float load(const Dtype& t, const void* base, uint64_t i) {
  if (t.nccl == ncclBfloat16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  if (t.nccl == ncclHalf) return __half2float(static_cast<const __half*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  uint64_t bytes, count;
  bool inplace;
  double time_us, algbw, busbw;
  long long wrong;
};

}  // namespace

int main(int argc, char** argv) {
  int ngpus = 1, iters = 20, warmup = 5, check = 1;
  uint64_t minb = 8, maxb = 128ull << 20;
  double factor = 2;
  Dtype dt = parse_dtype("bfloat16");
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "-g")
      ngpus = std::atoi(val().c_str());
    else if (a == "-b")
      minb = parse_size(val());
    else if (a == "-e")
      maxb = parse_size(val());
    else if (a == "-f")
      factor = std::atof(val().c_str());
    else if (a == "-d")
      dt = parse_dtype(val());
    else if (a == "-n")
      iters = std::atoi(val().c_str());
    else if (a == "-w")
      warmup = std::atoi(val().c_str());
    else if (a == "-c")
      check = std::atoi(val().c_str());
    else if (a == "--json")
      json_path = val();
    else
      usage_error("unknown argument '" + a + "'");
  }
  int visible = 0;
  CHECK_CUDA(cudaGetDeviceCount(&visible));
  if (ngpus < 1 || ngpus > visible)
    usage_error("-g " + std::to_string(ngpus) + ": " + std::to_string(visible) + " GPU(s) visible");
  if (minb == 0 || minb > maxb || !(factor > 1)) usage_error("need 0 < -b <= -e and -f > 1");
  if (iters < 1 || warmup < 0) usage_error("need -n >= 1 and -w >= 0");

  // The same size sweep as `zaya bench comm` (bench::size_sweep with a factor): begin, begin*f,
  // ... up to end inclusive, each rounded to a whole byte count.
  std::vector<uint64_t> sizes;
  for (double s = double(minb); s <= double(maxb) * (1 + 1e-12); s *= factor) {
    const uint64_t v = uint64_t(std::llround(s));
    if (sizes.empty() || v != sizes.back()) sizes.push_back(v);
  }

  const size_t ng = static_cast<size_t>(ngpus);
  std::vector<int> devs(ng);
  for (int g = 0; g < ngpus; ++g) devs[size_t(g)] = g;
  std::vector<ncclComm_t> comms(ng);
  CHECK_NCCL(ncclCommInitAll(comms.data(), ngpus, devs.data()));
  std::vector<cudaStream_t> streams(ng);
  std::vector<void*> sendb(ng), recvb(ng);
  const uint64_t maxbytes = sizes.back();
  for (int g = 0; g < ngpus; ++g) {
    CHECK_CUDA(cudaSetDevice(g));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[size_t(g)], cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&sendb[size_t(g)], maxbytes));
    CHECK_CUDA(cudaMalloc(&recvb[size_t(g)], maxbytes));
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);

  auto all_reduce = [&](bool inplace, uint64_t count) {
    CHECK_NCCL(ncclGroupStart());
    for (int g = 0; g < ngpus; ++g) {
      const void* s = inplace ? recvb[size_t(g)] : sendb[size_t(g)];
      CHECK_NCCL(ncclAllReduce(s, recvb[size_t(g)], count, dt.nccl, ncclSum, comms[size_t(g)],
                               streams[size_t(g)]));
    }
    CHECK_NCCL(ncclGroupEnd());
  };
  auto sync_all = [&]() {
    for (int g = 0; g < ngpus; ++g) {
      CHECK_CUDA(cudaSetDevice(g));
      CHECK_CUDA(cudaStreamSynchronize(streams[size_t(g)]));
    }
  };

  std::printf(
      "# nccl_direct: all_reduce sum, %d GPU(s) in one process, NCCL %d, %s, %d iters, "
      "%d warmup\n",
      ngpus, nccl_version, dt.name, iters, warmup);
  std::printf("%12s %12s %8s %5s %5s %10s %11s %11s %7s\n", "size(B)", "count", "type", "redop",
              "place", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  std::vector<Row> rows;
  std::vector<char> host(maxbytes);
  long long total_wrong = 0;
  for (uint64_t size : sizes) {
    const uint64_t count = size / dt.size;
    if (count == 0) continue;
    const uint64_t bytes = count * dt.size;
    for (int place = 0; place < 2; ++place) {
      const bool inplace = place == 1;
      long long wrong = -1;
      if (check) {
        for (int g = 0; g < ngpus; ++g) {
          for (uint64_t i = 0; i < count; ++i)
            store(dt, host.data(), i, float(i % 5 + uint64_t(g)));
          CHECK_CUDA(cudaSetDevice(g));
          // Poison the output (all-ones bytes: NaN or -1, never an expected value), then the input,
          // on the collective's own stream: the legacy default stream does not order work against
          // a non-blocking stream, and a pageable cudaMemcpy may return before its DMA is done.
          const cudaStream_t s = streams[size_t(g)];
          CHECK_CUDA(cudaMemsetAsync(recvb[size_t(g)], 0xff, bytes, s));
          CHECK_CUDA(cudaMemcpyAsync(inplace ? recvb[size_t(g)] : sendb[size_t(g)], host.data(),
                                     bytes, cudaMemcpyHostToDevice, s));
          CHECK_CUDA(cudaStreamSynchronize(s));  // host.data() is refilled for the next GPU
        }
        all_reduce(inplace, count);
        sync_all();
        wrong = 0;
        for (int g = 0; g < ngpus; ++g) {
          CHECK_CUDA(cudaSetDevice(g));
          CHECK_CUDA(cudaMemcpyAsync(host.data(), recvb[size_t(g)], bytes, cudaMemcpyDeviceToHost,
                                     streams[size_t(g)]));
          CHECK_CUDA(cudaStreamSynchronize(streams[size_t(g)]));
          for (uint64_t i = 0; i < count; ++i) {
            const float want = float(ngpus) * float(i % 5) + float(ngpus * (ngpus - 1) / 2);
            if (load(dt, host.data(), i) != want) ++wrong;
          }
        }
        total_wrong += wrong;
      }
      for (int i = 0; i < warmup; ++i) all_reduce(inplace, count);
      sync_all();
      const double t0 = now_s();
      for (int i = 0; i < iters; ++i) all_reduce(inplace, count);
      sync_all();
      const double dt_s = (now_s() - t0) / iters;
      const double algbw = double(bytes) / dt_s / 1e9;
      const double busbw = algbw * 2.0 * double(ngpus - 1) / double(ngpus);
      rows.push_back({bytes, count, inplace, dt_s * 1e6, algbw, busbw, wrong});
      std::printf("%12llu %12llu %8s %5s %5s %10.2f %11.3f %11.3f %7s\n", (unsigned long long)bytes,
                  (unsigned long long)count, dt.name, "sum", inplace ? "in" : "out", dt_s * 1e6,
                  algbw, busbw, wrong < 0 ? "N/A" : std::to_string(wrong).c_str());
      std::fflush(stdout);
    }
  }

  if (!json_path.empty()) {
    const std::string tmp = json_path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "nccl_direct: cannot write '%s'\n", tmp.c_str());
      return 1;
    }
    // The keys of `zaya bench comm --json` rows, so the two files compare by (size, inplace).
    std::fprintf(f,
                 "{\n \"schema\": \"zaya.bench.nccl_direct/1\",\n \"backend\": \"nccl\",\n"
                 " \"ranks\": %d,\n \"nccl_version\": %d,\n \"iters\": %d,\n \"warmup\": %d,\n"
                 " \"bandwidth_unit\": \"GB/s (1e9 bytes/s)\",\n \"results\": [",
                 ngpus, nccl_version, iters, warmup);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(
          f,
          "%s\n  {\"name\": \"all_reduce\", \"ranks\": %d, \"size\": %llu, \"count\": %llu, "
          "\"dtype\": \"%s\", \"redop\": \"sum\", \"inplace\": %s, \"time_us\": %.6g, "
          "\"algbw\": %.9g, \"busbw\": %.9g, \"wrong\": %lld}",
          i ? "," : "", ngpus, (unsigned long long)r.bytes, (unsigned long long)r.count, dt.name,
          r.inplace ? "true" : "false", r.time_us, r.algbw, r.busbw, r.wrong);
    }
    std::fprintf(f, "\n ]\n}\n");
    const bool ok = std::fclose(f) == 0;
    if (!ok || std::rename(tmp.c_str(), json_path.c_str()) != 0) {
      std::fprintf(stderr, "nccl_direct: cannot write '%s'\n", json_path.c_str());
      return 1;
    }
  }

  for (int g = 0; g < ngpus; ++g) {
    CHECK_CUDA(cudaSetDevice(g));
    CHECK_CUDA(cudaFree(sendb[size_t(g)]));
    CHECK_CUDA(cudaFree(recvb[size_t(g)]));
    CHECK_CUDA(cudaStreamDestroy(streams[size_t(g)]));
    ncclCommDestroy(comms[size_t(g)]);
  }
  std::printf("# %zu rows, %lld wrong element(s)\n", rows.size(), total_wrong);
  return total_wrong > 0 ? 1 : 0;
}
