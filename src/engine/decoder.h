// One interface for running a model over a growing sequence on any device, and the one generation
// loop over it. A Decoder holds one sequence's inference cache: prefill appends tokens and returns
// the logits of the last one, decode appends one token, reset empties the cache; loss scores a
// whole sequence (eval). Implementations: the CPU reference (this folder's decoder.cpp, over
// ZayaModel's InferenceCache: the model's own forward, so its numbers are the CPU reference's)
// and the CUDA inference engine (engine/cuda/cuda_decoder.h, bf16 on one GPU). make_decoder picks
// one by device name at run time; a build without CUDA gets a zaya::Error for "cuda".
//
// Deliberately not here: batches of sequences (the CUDA engine decodes up to 8 together; the
// benchmarks use it directly), beam search, speculative decoding.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/sampling.h"
#include "model/zaya.h"

namespace zaya {

struct DecoderOptions {
  std::string device = "cpu";  // "cpu" (fp32 reference) or "cuda" (bf16 on GPU `device_index`)
  int device_index = 0;
  int64_t max_context = 4096;  // tokens the cache holds: prompt plus generated tokens
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual const ZayaConfig& cfg() const = 0;
  virtual std::string device() const = 0;  // "cpu", "cuda:0"
  virtual int64_t max_context() const = 0;
  virtual int64_t length() const = 0;  // tokens already in the cache

  // Empties the cache.
  virtual void reset() = 0;
  // Appends ids (at least one) to the cache; returns the fp32 logits of the last position [1,1,V].
  virtual Tensor prefill(const std::vector<int32_t>& ids) = 0;
  // Appends one token (after a prefill); returns the logits of its position [1,1,V].
  virtual Tensor decode(int32_t token) = 0;
  // Greedy steps: appends `first`, then each chosen token but the last; returns the chosen tokens,
  // between 1 and `most` of them (as many as the backend takes at once: the CPU one, the GPU up to
  // 8 enqueued back to back). Each is the argmax of decode()'s logits, ties to the lowest id.
  virtual std::vector<int32_t> decode_greedy(int32_t first, int64_t most);
  // Mean next-token cross-entropy of ids (at least 2) scored as one sequence from an empty cache,
  // as ZayaModel::loss(ids, 1, ids.size()); the cache is left empty.
  virtual double loss(const std::vector<int32_t>& ids) = 0;
};

// The decoder of `model` on opt.device; `model` must outlive it. Throws zaya::Error for an unknown
// device, and for "cuda" in a build without the CUDA backend or on a machine without the device.
std::unique_ptr<Decoder> make_decoder(const ZayaModel& model, const DecoderOptions& opt);

// Generates up to max_new tokens after `prompt` from an empty cache (the decoder is reset first);
// stops early at `stop_id` (>= 0) and includes it. on_token (optional) is called with each new
// token as it is produced (streaming output). Greedy decoding (opt.greedy or temperature <= 0)
// uses decode_greedy: a backend that takes several steps at once may decode up to 7 steps past a
// stop token, unused. Sampling draws from one Rng(opt.seed), one draw per sampled token.
std::vector<int32_t> generate(Decoder& decoder, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SamplingOptions& opt, int32_t stop_id = -1,
                              const std::function<void(int32_t)>& on_token = nullptr);
// The same on the CPU reference decoder, with a cache of prompt + max_new tokens.
std::vector<int32_t> generate(const ZayaModel& model, const std::vector<int32_t>& prompt,
                              int64_t max_new, const SamplingOptions& opt, int32_t stop_id = -1,
                              const std::function<void(int32_t)>& on_token = nullptr);

// Mean next-token cross-entropy of ids in consecutive windows of `window` tokens (0: one window),
// each scored from an empty cache; a last window of one token is dropped. Returns the loss and
// the number of scored positions.
struct EvalResult {
  double loss = 0;
  int64_t scored = 0;
};
EvalResult evaluate(Decoder& decoder, const std::vector<int32_t>& ids, int64_t window);

}  // namespace zaya
