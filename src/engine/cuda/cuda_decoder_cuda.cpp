// The CUDA Decoder: CudaInference (batch 1) behind engine/decoder.h's interface. Greedy steps run
// on the device, kGreedyAhead enqueued back to back with one wait (CudaInference::decode_greedy);
// the loss of a sequence comes from all-position prefill logits, in pieces that fit the engine's
// logits buffer, scored on the host by the CPU reference's cross-entropy.
#include "engine/cuda/cuda_decoder.h"

#include <algorithm>
#include <fmt/format.h>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "engine/cuda/infer_cuda.h"

namespace zaya {

namespace {

constexpr int64_t kGreedyAhead = 8;

class CudaDecoder final : public Decoder {
 public:
  // Over an engine of its own, or one the caller keeps (generate_cuda).
  CudaDecoder(std::unique_ptr<cuda::CudaInference> own, int device)
      : own_(std::move(own)), inf_(*own_), device_(device) {}
  CudaDecoder(cuda::CudaInference& inf, int device) : inf_(inf), device_(device) {}

  const ZayaConfig& cfg() const override { return inf_.cfg(); }
  std::string device() const override { return fmt::format("cuda:{}", device_); }
  int64_t max_context() const override { return inf_.max_context(); }
  int64_t length() const override { return inf_.length(); }
  void reset() override { inf_.reset(1); }
  Tensor prefill(const std::vector<int32_t>& ids) override {
    return inf_.prefill(ids, int64_t(ids.size()));
  }
  Tensor decode(int32_t token) override { return inf_.decode({token}); }
  std::vector<int32_t> decode_greedy(int32_t first, int64_t most) override {
    ZAYA_CHECK(most >= 1, "decode_greedy: {} steps", most);
    return inf_.decode_greedy({first}, std::min(kGreedyAhead, most));
  }
  double loss(const std::vector<int32_t>& ids) override {
    const int64_t n = int64_t(ids.size()), V = cfg().vocab_size;
    ZAYA_CHECK(n >= 2, "loss: need at least 2 tokens, got {}", n);
    reset();
    const int64_t piece = inf_.max_logits_rows();
    double total = 0;
    for (int64_t t0 = 0; t0 + 1 < n; t0 += piece) {
      const int64_t len = std::min(piece, n - 1 - t0);  // positions t0.. scored against t0+1..
      const std::vector<int32_t> part(ids.begin() + t0, ids.begin() + t0 + len);
      const Tensor logits = inf_.prefill(part, len, /*all_logits=*/true);
      const std::vector<int32_t> targets(ids.begin() + t0 + 1, ids.begin() + t0 + 1 + len);
      total += cpu::cross_entropy(nullptr, logits.f32(), targets.data(), len, V) * double(len);
    }
    reset();
    return total / double(n - 1);
  }

 private:
  std::unique_ptr<cuda::CudaInference> own_;
  cuda::CudaInference& inf_;
  int device_;
};

}  // namespace

std::unique_ptr<Decoder> make_cuda_decoder(const ZayaModel& model, const DecoderOptions& opt) {
  cuda::CudaInferOptions io;
  io.max_context = opt.max_context;
  io.max_prefill_tokens = std::min<int64_t>(opt.max_context, 8192);
  io.device = opt.device_index;
  auto inf = std::make_unique<cuda::CudaInference>(model, io);
  inf->reset(1);
  return std::make_unique<CudaDecoder>(std::move(inf), opt.device_index);
}

namespace cuda {

std::vector<int32_t> generate_cuda(CudaInference& inf, const std::vector<int32_t>& prompt,
                                   int64_t max_new, const SamplingOptions& opt, int32_t stop_id,
                                   const std::function<void(int32_t)>& on_token) {
  CudaDecoder dec(inf, 0);
  return generate(dec, prompt, max_new, opt, stop_id, on_token);
}

}  // namespace cuda

}  // namespace zaya
