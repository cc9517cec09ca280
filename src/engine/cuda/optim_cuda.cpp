// CudaOptimizer: AdamW and Muon with device-resident state; see optim_cuda.h. The per-element work
// is in backend/cuda/ops (adamw_step, muon_momentum, apply_update, sumsq, conversions) and the
// Newton–Schulz products on GemmContext; this file owns the state layout, the parameter rules, the
// Newton–Schulz driver and the host round trips (checkpoint state, norms).
#include "engine/cuda/optim_cuda.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "backend/cuda/ops.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "optim/newton_schulz.h"

namespace zaya::cuda {

namespace {

constexpr size_t kAlignFloats = 64;  // 256-byte alignment of every state tensor (GEMM operands)

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// A device allocation freed with the optimizer.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void alloc(size_t n) {
    bytes = n;
    if (n > 0) ZAYA_CUDA_CHECK(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

}  // namespace

struct CudaOptimizer::Impl {
  struct Entry {
    DeviceParam* p = nullptr;
    ParamAssignment a;
    float* exp_avg = nullptr;  // AdamW
    float* exp_avg_sq = nullptr;
    float* momentum = nullptr;  // Muon
    int64_t mats = 1, rows = 0, cols = 0;
    bool has_state = true;  // options.owned_state (ZeRO-1): this rank keeps and updates it
    // The part this optimizer updates (options.owned_slices): elements [off, off + n) of the
    // parameter, its state of shape `shape` (the parameter's, or [count, ...] for a slice).
    int64_t off = 0, n = 0;
    Shape shape;
  };

  OptimizerSettings settings;
  CudaOptimizerOptions options;
  GemmContext* gemm = nullptr;
  cudaStream_t st = nullptr;
  std::vector<DeviceParam>* params = nullptr;
  std::vector<Entry> entries;
  int64_t steps = 0;

  DeviceBuffer state;                   // every AdamW/Muon state tensor
  DeviceBuffer u_buf;                   // fp32 Muon update of the largest Muon parameter
  DeviceBuffer ns_x, ns_y, ns_a, ns_b;  // Newton–Schulz operands (bf16 or fp32)
  DeviceBuffer ss_dev, ws_buf;          // fp64 sums of squares; sumsq scratch
  double* ss_host = nullptr;            // pinned mirror of ss_dev
  size_t ss_count = 0;
  Workspace ws;
  // Step timing: start, end of the AdamW launches, one Newton–Schulz interval, end of the step.
  enum { kStart, kAdamEnd, kNsBegin, kNsEnd, kEnd, kEvents };
  cudaEvent_t ev[kEvents] = {};
  OptimizerStepTimes times;

  ~Impl() {
    if (ss_host) cudaFreeHost(ss_host);
    for (auto& e : ev)
      if (e) cudaEventDestroy(e);
  }

  size_t ns_elem() const { return options.ns_bf16 ? sizeof(bf16) : sizeof(float); }
  GemmType ns_type() const { return options.ns_bf16 ? GemmType::BF16 : GemmType::F32; }

  // Fills ss_host[i] with Σx² of each (pointer, count) range, then synchronises.
  void sums_of_squares(const std::vector<std::pair<const float*, int64_t>>& xs) {
    ZAYA_ASSERT(xs.size() <= ss_count);
    double* out = static_cast<double*>(ss_dev.ptr);
    for (size_t i = 0; i < xs.size(); i++) {
      ws.reset();
      sumsq(out + i, xs[i].first, xs[i].second, ws, st);
    }
    ZAYA_CUDA_CHECK(
        cudaMemcpyAsync(ss_host, out, xs.size() * sizeof(double), cudaMemcpyDeviceToHost, st));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(st));
  }

  // Quintic Newton–Schulz on the normalised [rows, cols] matrix held in ns_x (ns type); the result
  // ends in the returned buffer (ns_x or ns_y). Same recurrence and coefficients as
  // newton_schulz_orthogonalize: A = X Xᵀ, B = b·A + c·A·A, X = a·X + B·X for a wide X; for a tall
  // X the Gram matrix is XᵀX and the update X = a·X + X·B (B is symmetric), which is the
  // reference's transposed iteration written without the transposes.
  void* newton_schulz(int64_t rows, int64_t cols) {
    const NewtonSchulzCoefficients k;
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows;
    const size_t es = ns_elem();
    const GemmType t = ns_type();
    void* X = ns_x.ptr;
    void* Y = ns_y.ptr;
    void* A = ns_a.ptr;
    void* B = ns_b.ptr;
    for (int s = 0; s < settings.muon.ns_steps; s++) {
      if (tall)  // A[c,c] = Xᵀ X
        gemm->gemm(true, false, m, m, rows, 1.0f, X, cols, X, cols, 0.0f, A, m, t, t, nullptr, st);
      else  // A[r,r] = X Xᵀ
        gemm->gemm(false, true, m, m, cols, 1.0f, X, cols, X, cols, 0.0f, A, m, t, t, nullptr, st);
      ZAYA_CUDA_CHECK(cudaMemcpyAsync(B, A, size_t(m * m) * es, cudaMemcpyDeviceToDevice,
                                      st));  // B = b·A + c·A·A
      gemm->gemm(false, false, m, m, m, k.c, A, m, A, m, k.b, B, m, t, t, nullptr, st);
      ZAYA_CUDA_CHECK(
          cudaMemcpyAsync(Y, X, size_t(rows * cols) * es, cudaMemcpyDeviceToDevice, st));
      if (tall)  // Y = a·X + X·B
        gemm->gemm(false, false, rows, cols, cols, 1.0f, X, cols, B, m, k.a, Y, cols, t, t, nullptr,
                   st);
      else  // Y = a·X + B·X
        gemm->gemm(false, false, rows, cols, rows, 1.0f, B, m, X, cols, k.a, Y, cols, t, t, nullptr,
                   st);
      std::swap(X, Y);
    }
    return X;
  }

  void muon_param(Entry& e, double plr, float gs) {
    const int64_t n = e.n, sz = e.rows * e.cols;
    float* u = static_cast<float*>(u_buf.ptr);
    const auto& ms = settings.muon;
    muon_momentum(e.momentum, u, e.p->grad + e.off, gs, float(ms.momentum), ms.nesterov, n, st);
    // Frobenius norms of every matrix in one round trip (fp64, as the reference's serial sum).
    std::vector<std::pair<const float*, int64_t>> mats;
    for (int64_t k = 0; k < e.mats; k++) mats.emplace_back(u + k * sz, sz);
    sums_of_squares(mats);
    ZAYA_CUDA_CHECK(cudaEventRecord(ev[kNsBegin], st));
    for (int64_t k = 0; k < e.mats; k++) {
      float* uk = u + k * sz;
      const float inv = float(1.0 / (std::sqrt(ss_host[k]) + double(kNewtonSchulzEps)));
      scale_f32(uk, inv, sz, st);
      if (options.ns_bf16)
        f32_to_bf16(static_cast<bf16*>(ns_x.ptr), uk, sz, st);
      else
        ZAYA_CUDA_CHECK(cudaMemcpyAsync(ns_x.ptr, uk, size_t(sz) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, st));
      void* O = newton_schulz(e.rows, e.cols);
      if (options.ns_bf16)
        bf16_to_f32(uk, static_cast<const bf16*>(O), sz, st);
      else
        ZAYA_CUDA_CHECK(
            cudaMemcpyAsync(uk, O, size_t(sz) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    }
    ZAYA_CUDA_CHECK(cudaEventRecord(ev[kNsEnd], st));
    const double scale = ms.rms_scale * std::sqrt(double(std::max(e.rows, e.cols)));
    apply_update(e.p->master + e.off, e.p->copy ? e.p->copy + e.off : nullptr, u, float(plr),
                 float(e.a.weight_decay), float(scale), n, st);
  }

  // Adds the elapsed time between two completed events to *acc.
  void add_elapsed(double* acc, int a, int b) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, ev[a], ev[b]) == cudaSuccess) *acc += double(ms);
  }
};

CudaOptimizer::CudaOptimizer(std::vector<DeviceParam>& params, OptimizerSettings settings,
                             GemmContext& gemm, cudaStream_t stream, CudaOptimizerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.settings = std::move(settings);
  I.settings.validate();
  I.options = options;
  I.gemm = &gemm;
  I.st = stream;
  I.params = &params;
  const auto rules = I.settings.effective_rules();
  const std::vector<bool>& keep = options.owned_state;
  ZAYA_CHECK(keep.empty() || keep.size() == params.size(),
             "optimizer: the owned-state mask has {} entries for {} parameters", keep.size(),
             params.size());
  const auto& slices = options.owned_slices;
  ZAYA_CHECK(slices.empty() || (!keep.empty() && slices.size() == params.size()),
             "optimizer: the owned-slices list has {} entries for {} parameters{}", slices.size(),
             params.size(), keep.empty() ? " (and no owned-state mask)" : "");
  std::set<std::string> seen;
  size_t state_floats = 0, max_muon = 0, max_x = 0, max_gram = 0, max_ws = 0, max_mats = 1;
  for (auto& p : params) {
    ZAYA_CHECK(seen.insert(p.name).second, "optimizer: parameter '{}' appears twice", p.name);
    ZAYA_CHECK(p.master != nullptr && p.numel == shape_numel(p.shape),
               "optimizer: parameter '{}' has no device master of {} elements", p.name,
               shape_numel(p.shape));
    if (is_balancing_bias(p.name)) continue;
    ZAYA_CHECK(p.grad != nullptr, "optimizer: parameter '{}' has no gradient on the device",
               p.name);
    max_ws = std::max(max_ws, sumsq_workspace_bytes(p.numel));
    Impl::Entry e;
    e.p = &p;
    e.a = assign_param(p.name, p.shape, rules, I.settings.weight_decay);
    const size_t pi = size_t(&p - params.data());
    e.has_state = keep.empty() || keep[pi];
    e.n = p.numel;
    e.shape = p.shape;
    if (!slices.empty() && slices[pi].second >= 0 && e.has_state) {
      const auto [first, count] = slices[pi];
      ZAYA_CHECK(p.shape.size() >= 1 && count > 0 && first >= 0 && first + count <= p.shape[0],
                 "optimizer: slice [{}, {}) of '{}' (shape {}) is not a non-empty range of its "
                 "first dimension",
                 first, first + count, p.name, shape_str(p.shape));
      ZAYA_CHECK(e.a.optimizer != OptimizerKind::Muon || p.shape.size() == 3,
                 "optimizer: '{}' (shape {}) is one Muon matrix and cannot be sliced; only a 3-D "
                 "stack of matrices can, by whole matrices",
                 p.name, shape_str(p.shape));
      const int64_t per = p.numel / p.shape[0];
      e.off = first * per;
      e.n = count * per;
      e.shape[0] = count;
    }
    if (e.a.optimizer == OptimizerKind::Muon) {
      const size_t dim = p.shape.size();
      ZAYA_CHECK(dim == 2 || dim == 3,
                 "optimizer: rule '{}' sends '{}' (shape {}) to Muon, which needs a 2-D matrix or "
                 "a 3-D stack of matrices",
                 e.a.rule >= 0 ? rules[size_t(e.a.rule)].pattern : "(by rank)", p.name,
                 shape_str(p.shape));
      e.mats = dim == 3 ? e.shape[0] : 1;
      e.rows = p.shape[dim - 2];
      e.cols = p.shape[dim - 1];
      if (!e.has_state) {  // another rank's: no momentum, no scratch sized for it
        I.entries.push_back(e);
        continue;
      }
      const int64_t m = std::min(e.rows, e.cols);
      state_floats += round_up(size_t(e.n), kAlignFloats);
      max_muon = std::max(max_muon, size_t(e.n));
      max_x = std::max(max_x, size_t(e.rows * e.cols));
      max_gram = std::max(max_gram, size_t(m * m));
      max_mats = std::max(max_mats, size_t(e.mats));
      max_ws = std::max(max_ws, sumsq_workspace_bytes(e.rows * e.cols));
    } else if (e.a.optimizer == OptimizerKind::AdamW && e.has_state) {
      state_floats += 2 * round_up(size_t(e.n), kAlignFloats);
    }
    I.entries.push_back(e);
  }
  // One allocation for every state tensor, carved in entry order (the checkpoint order).
  I.state.alloc(state_floats * sizeof(float));
  if (state_floats > 0) ZAYA_CUDA_CHECK(cudaMemsetAsync(I.state.ptr, 0, I.state.bytes, stream));
  float* next = static_cast<float*>(I.state.ptr);
  auto carve = [&](int64_t n) {
    float* r = next;
    next += round_up(size_t(n), kAlignFloats);
    return r;
  };
  for (auto& e : I.entries) {
    if (!e.has_state) continue;
    if (e.a.optimizer == OptimizerKind::Muon) {
      e.momentum = carve(e.n);
    } else if (e.a.optimizer == OptimizerKind::AdamW) {
      e.exp_avg = carve(e.n);
      e.exp_avg_sq = carve(e.n);
    }
  }
  I.u_buf.alloc(max_muon * sizeof(float));
  I.ns_x.alloc(max_x * I.ns_elem());
  I.ns_y.alloc(max_x * I.ns_elem());
  I.ns_a.alloc(max_gram * I.ns_elem());
  I.ns_b.alloc(max_gram * I.ns_elem());
  I.ss_count = std::max(params.size(), max_mats);
  I.ss_dev.alloc(I.ss_count * sizeof(double));
  ZAYA_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&I.ss_host), I.ss_count * sizeof(double)));
  I.ws_buf.alloc(max_ws + 1024);  // slack for the workspace's 256-byte alignment
  I.ws.base = static_cast<char*>(I.ws_buf.ptr);
  I.ws.capacity = I.ws_buf.bytes;
  for (auto& e : I.ev) ZAYA_CUDA_CHECK(cudaEventCreate(&e));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CudaOptimizer::~CudaOptimizer() = default;

double CudaOptimizer::grad_sq_norm() {
  return grad_sq_norm(std::vector<bool>());
}

double CudaOptimizer::grad_sq_norm(const std::vector<bool>& owned) {
  Impl& I = *impl_;
  ZAYA_CHECK(owned.empty() || owned.size() == I.params->size(),
             "optimizer: the ownership mask has {} entries for {} parameters", owned.size(),
             I.params->size());
  std::vector<std::pair<const float*, int64_t>> xs;
  const auto& slices = I.options.owned_slices;
  for (size_t i = 0; i < I.params->size(); i++) {
    const auto& p = (*I.params)[i];
    if (!p.grad || !(owned.empty() || owned[i])) continue;
    if (owned.empty() || slices.empty() || slices[i].second < 0) {
      xs.emplace_back(p.grad, p.numel);
    } else {  // this rank's dim-0 slice
      const int64_t per = p.numel / p.shape[0];
      xs.emplace_back(p.grad + slices[i].first * per, slices[i].second * per);
    }
  }
  I.sums_of_squares(xs);
  double total = 0;  // fixed order: the parameters' order
  for (size_t i = 0; i < xs.size(); i++) total += I.ss_host[i];
  return total;
}

void CudaOptimizer::step(double lr, float grad_scale) {
  step(lr, grad_scale, std::vector<bool>());
}

void CudaOptimizer::step(double lr, float grad_scale, const std::vector<bool>& owned) {
  Impl& I = *impl_;
  ZAYA_CHECK(std::isfinite(lr) && lr >= 0,
             "optimizer: learning rate must be finite and >= 0, got {}", lr);
  ZAYA_CHECK(owned.empty() || owned.size() == I.params->size(),
             "optimizer: the ownership mask has {} entries for {} parameters", owned.size(),
             I.params->size());
  auto mine = [&](const Impl::Entry& e) {
    const bool m = owned.empty() || owned[size_t(e.p - I.params->data())];
    ZAYA_CHECK(!m || e.has_state || e.a.optimizer == OptimizerKind::None,
               "optimizer: asked to update '{}', whose state this optimizer does not keep",
               e.p->name);
    return m;
  };
  const int64_t t = I.steps + 1;
  const auto& as = I.settings.adamw;
  // Bias corrections formed in double and rounded once, like the CPU reference's scalars.
  const float bc1 = float(1.0 - std::pow(as.beta1, double(t)));
  const float bc2 = float(1.0 - std::pow(as.beta2, double(t)));
  I.times = {};
  ZAYA_CUDA_CHECK(cudaEventRecord(I.ev[Impl::kStart], I.st));
  for (auto& e : I.entries) {
    if (e.a.optimizer != OptimizerKind::AdamW || !mine(e)) continue;
    adamw_step(e.p->master + e.off, e.p->copy ? e.p->copy + e.off : nullptr, e.exp_avg,
               e.exp_avg_sq, e.p->grad + e.off, grad_scale, float(lr * e.a.lr_mult),
               float(as.beta1), float(as.beta2), float(as.eps), float(e.a.weight_decay), bc1, bc2,
               e.n, I.st);
  }
  ZAYA_CUDA_CHECK(cudaEventRecord(I.ev[Impl::kAdamEnd], I.st));
  for (auto& e : I.entries) {
    if (e.a.optimizer != OptimizerKind::Muon || !mine(e)) continue;
    I.muon_param(e, lr * e.a.lr_mult, grad_scale);
    // Wait for this parameter's Newton–Schulz interval before its events are recorded again (the
    // host is then one apply_update ahead of the device, enough to keep it busy).
    ZAYA_CUDA_CHECK(cudaEventSynchronize(I.ev[Impl::kNsEnd]));
    I.add_elapsed(&I.times.newton_schulz, Impl::kNsBegin, Impl::kNsEnd);
  }
  ZAYA_CUDA_CHECK(cudaEventRecord(I.ev[Impl::kEnd], I.st));
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));
  I.add_elapsed(&I.times.adamw, Impl::kStart, Impl::kAdamEnd);
  I.add_elapsed(&I.times.total, Impl::kStart, Impl::kEnd);
  // The rest: momentum, norms (with their host round trips), scaling, conversions, apply_update.
  I.times.muon_elementwise = std::max(0.0, I.times.total - I.times.adamw - I.times.newton_schulz);
  I.steps = t;
}

int64_t CudaOptimizer::steps() const {
  return impl_->steps;
}

const OptimizerSettings& CudaOptimizer::settings() const {
  return impl_->settings;
}

const OptimizerStepTimes& CudaOptimizer::last_times() const {
  return impl_->times;
}

size_t CudaOptimizer::state_bytes() const {
  const Impl& I = *impl_;
  return I.state.bytes + I.u_buf.bytes + I.ns_x.bytes + I.ns_y.bytes + I.ns_a.bytes + I.ns_b.bytes +
         I.ss_dev.bytes + I.ws_buf.bytes;
}

std::string CudaOptimizer::describe() const {
  const Impl& I = *impl_;
  std::string out = fmt::format("{:<64} {:>16} {:>6} {:>7} {:>7}  rule\n", "parameter", "shape",
                                "optim", "lr_mult", "wd");
  const auto rules = I.settings.effective_rules();
  for (const auto& e : I.entries) {
    std::string rule = e.a.rule >= 0 ? rules[size_t(e.a.rule)].pattern : "(by rank)";
    out += fmt::format("{:<64} {:>16} {:>6} {:>7g} {:>7g}  {}\n", e.p->name, shape_str(e.p->shape),
                       optimizer_kind_name(e.a.optimizer), e.a.lr_mult, e.a.weight_decay, rule);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> CudaOptimizer::state_tensors() const {
  const Impl& I = *impl_;
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));
  std::vector<std::pair<std::string, Tensor>> out;
  auto get = [&](const std::string& name, const float* src, const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32);
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(t.f32(), src, t.nbytes(), cudaMemcpyDeviceToHost, I.st));
    out.emplace_back(name, std::move(t));
  };
  for (const auto& e : I.entries) {
    if (e.exp_avg) {
      get("optim.adamw.exp_avg." + e.p->name, e.exp_avg, e.shape);
      get("optim.adamw.exp_avg_sq." + e.p->name, e.exp_avg_sq, e.shape);
    }
    if (e.momentum) get("optim.muon.momentum." + e.p->name, e.momentum, e.shape);
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));
  return out;
}

std::vector<std::pair<std::string, Tensor>> CudaOptimizer::state_views() const {
  const Impl& I = *impl_;
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));
  std::vector<std::pair<std::string, Tensor>> out;
  auto view = [&](const std::string& name, float* src, const Shape& shape) {
    const size_t bytes = size_t(shape_numel(shape)) * sizeof(float);
    auto st = Storage::wrap(src, bytes, Device::CUDA, true, [](void*) {});
    out.emplace_back(name, Tensor::from_storage(st, 0, shape, DType::F32));
  };
  for (const auto& e : I.entries) {
    if (e.exp_avg) {
      view("optim.adamw.exp_avg." + e.p->name, e.exp_avg, e.shape);
      view("optim.adamw.exp_avg_sq." + e.p->name, e.exp_avg_sq, e.shape);
    }
    if (e.momentum) view("optim.muon.momentum." + e.p->name, e.momentum, e.shape);
  }
  return out;
}

void CudaOptimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                               int64_t steps) {
  Impl& I = *impl_;
  ZAYA_CHECK(steps >= 0, "optimizer state: step count must be >= 0, found {}", steps);
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state)
    ZAYA_CHECK(given.emplace(name, &t).second, "optimizer state: '{}' appears twice", name);
  struct Dst {
    std::string name;
    float* ptr;
    const Shape* shape;
  };
  std::vector<Dst> mine;
  for (const auto& e : I.entries) {
    if (e.exp_avg) {
      mine.push_back({"optim.adamw.exp_avg." + e.p->name, e.exp_avg, &e.shape});
      mine.push_back({"optim.adamw.exp_avg_sq." + e.p->name, e.exp_avg_sq, &e.shape});
    }
    if (e.momentum) mine.push_back({"optim.muon.momentum." + e.p->name, e.momentum, &e.shape});
  }
  // Validate everything before copying anything (the CPU Optimizer's messages).
  for (const auto& d : mine) {
    auto it = given.find(d.name);
    ZAYA_CHECK(it != given.end(),
               "optimizer state: '{}' is missing (was the checkpoint written with other "
               "optimizer rules?)",
               d.name);
    const Tensor& src = *it->second;
    ZAYA_CHECK(src.shape() == *d.shape, "optimizer state: '{}' has shape {}, expected {}", d.name,
               shape_str(src.shape()), shape_str(*d.shape));
    ZAYA_CHECK(src.dtype() == DType::F32 && src.device() == Device::CPU,
               "optimizer state: '{}' must be an F32 host tensor, found {}", d.name,
               dtype_name(src.dtype()));
  }
  if (given.size() != mine.size()) {
    std::set<std::string> expected;
    for (const auto& d : mine) expected.insert(d.name);
    for (const auto& kv : given)
      ZAYA_CHECK(expected.count(kv.first), "optimizer state: unexpected tensor '{}'", kv.first);
  }
  ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));
  for (const auto& d : mine) {
    const Tensor& src = *given.at(d.name);
    // Memory-mapped or strided sources are made contiguous first.
    const Tensor c = src.is_contiguous() ? src : src.clone();
    ZAYA_CUDA_CHECK(cudaMemcpyAsync(d.ptr, c.f32(), c.nbytes(), cudaMemcpyHostToDevice, I.st));
    ZAYA_CUDA_CHECK(cudaStreamSynchronize(I.st));  // c may go away at the end of this iteration
  }
  I.steps = steps;
}

}  // namespace zaya::cuda
