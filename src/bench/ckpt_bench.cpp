// `zaya bench ckpt`. See ckpt_bench.h.
#include "bench/ckpt_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/bench_common.h"
#include "bench/bench_model.h"
#include "ckpt/checkpoint.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "engine/train_step.h"
#include "io/atomic.h"

namespace zaya::bench {

namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Plain sequential writes of `bytes` (16 MiB blocks) and an fsync, as `dd conv=fsync` does: the
// disk's own bandwidth, in bytes per second.
double disk_write_bandwidth(const std::string& path, uint64_t bytes) {
  std::vector<char> block(size_t(16) << 20);
  for (size_t i = 0; i < block.size(); i++) block[i] = char(i * 2654435761u >> 24);
  const double t0 = now_s();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create {}: {}", path, std::strerror(errno));
  uint64_t done = 0;
  while (done < bytes) {
    const size_t n = size_t(std::min<uint64_t>(block.size(), bytes - done));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      fail("writing {} failed: {}", path, std::strerror(errno));
    }
    done += uint64_t(w);
  }
  if (::fsync(fd) != 0) fail("fsync of {} failed: {}", path, std::strerror(errno));
  ::close(fd);
  const double s = now_s() - t0;
  fs::remove(path);
  return double(bytes) / std::max(s, 1e-9);
}

}  // namespace

int run_ckpt_bench(const CkptBenchOptions& o) {
  ZAYA_CHECK(o.layers > 0 && o.saves > 0 && o.staging_mb >= 0,
             "zaya bench ckpt: --layers and --saves must be positive, --staging-mb >= 0");
  ZAYA_CHECK(!fs::exists(o.dir),
             "zaya bench ckpt: --dir {} exists; give a new directory (it is "
             "removed afterwards)",
             o.dir);
  ZayaConfig cfg = ZayaConfig::preset(o.preset);
  cfg.num_hidden_layers = o.layers;
  cfg.validate();
  ZayaModel model = random_model(cfg, o.seed);
  TrainStepOptions so;
  so.device = o.device;
  so.max_tokens = 64;
  so.max_seq = 64;
  check_train_device(so);
  auto step = make_train_step(model, OptimizerSettings{}, BalancingSettings{}, so);
  // One update, so that every moment and momentum buffer exists and holds numbers.
  step->zero_grads();
  step->optimizer_step(1e-4, 1.0f);
  step->sync();
  fs::create_directories(o.dir);
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{o.dir};

  const uint64_t save_bytes = contribution_bytes(checkpoint_contribution(*step, 0, 1));
  fmt::print(
      "# zaya bench ckpt: {} with {} layers on {} ({}): one save = {:.1f} MiB ({} saves into {})\n",
      o.preset, o.layers, o.device, step->name(), double(save_bytes) / (1 << 20), o.saves, o.dir);
  const double disk_bps = disk_write_bandwidth(o.dir + "/baseline.bin", save_bytes);

  const size_t budget = size_t(o.staging_mb) << 20;
  StagingMemory staging = checkpoint_staging(
      *step, o.snapshot, budget ? std::min<size_t>(budget, save_bytes) : size_t(save_bytes));
  const std::string where = staging.where;
  fmt::print("# snapshot into {} memory ({})\n", where,
             o.device == "cpu" ? std::string("the step is on the CPU")
                               : fmt::format("--snapshot {}", o.snapshot));
  Checkpointer ck(o.dir + "/checkpoints", 1, budget, std::move(staging), nullptr, "bench");
  ck.reserve(save_bytes);  // as the trainer does before its loop
  std::vector<double> write_bps;
  for (int64_t k = 1; k <= o.saves; k++) {
    const double t0 = now_s();
    step->sync();
    RankContribution c = checkpoint_contribution(*step, 0, 1);
    c.config_json = hf_config_text(model.cfg, DType::F32);
    TrainerState ts;
    ts.step = k;
    ts.save_id = Checkpointer::new_save_id(k);
    c.trainer_json = ts.to_file_text();
    ck.begin(k, c, ts.save_id);
    ck.record_blocking((now_s() - t0) * 1e3);
    ck.finish();
    const SaveStats& st = ck.stats();
    write_bps.push_back(double(st.bytes.back()) / std::max(st.write_s.back(), 1e-9));
  }
  const SaveStats& st = ck.stats();
  const double w50 = median(write_bps);
  fmt::print("{:<34} {:>12}\n", "loop stall per save, p50",
             fmt::format("{:.1f} ms", st.percentile_ms(50)));
  fmt::print("{:<34} {:>12}\n", "loop stall per save, p99",
             fmt::format("{:.1f} ms", st.percentile_ms(99)));
  fmt::print("{:<34} {:>12}\n", "checkpoint write, median",
             fmt::format("{:.0f} MiB/s", w50 / (1 << 20)));
  fmt::print("{:<34} {:>12}\n", "disk sequential write (dd-like)",
             fmt::format("{:.0f} MiB/s", disk_bps / (1 << 20)));
  fmt::print("{:<34} {:>12}\n", "checkpoint / disk",
             fmt::format("{:.0f}%", 100.0 * w50 / disk_bps));
  if (!o.json.empty()) {
    nlohmann::json j = {{"preset", o.preset},
                        {"layers", o.layers},
                        {"device", step->name()},
                        {"save_bytes", save_bytes},
                        {"saves", o.saves},
                        {"staging_mb", o.staging_mb},
                        {"snapshot", o.snapshot},
                        {"staging_memory", where},
                        {"blocking_ms", st.blocking_ms},
                        {"blocking_ms_p50", st.percentile_ms(50)},
                        {"blocking_ms_p99", st.percentile_ms(99)},
                        {"write_bytes_per_s", write_bps},
                        {"disk_bytes_per_s", disk_bps},
                        {"write_fraction_of_disk", w50 / disk_bps}};
    write_file_atomic(o.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace zaya::bench
