// The CUDA Decoder (engine/cuda/cuda_decoder_cuda.cpp): the CUDA inference engine (infer_cuda.h)
// behind engine/decoder.h's interface, for one sequence. This header needs no CUDA header, so the
// factory compiles everywhere; a build without the CUDA backend gets engine/decoder.cpp's
// stand-in, which throws a zaya::Error that says so.
#pragma once
#include <memory>

#include "engine/decoder.h"

namespace zaya {

// A decoder on GPU opt.device_index with bf16 copies of `model`'s weights, uploaded here (`model`
// must outlive it, as for make_decoder). Throws zaya::Error when no such CUDA device can be used.
std::unique_ptr<Decoder> make_cuda_decoder(const ZayaModel& model, const DecoderOptions& opt);

}  // namespace zaya
