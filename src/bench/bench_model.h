// Random-weight models for the throughput benchmarks (`zaya bench train`, `zaya bench infer`):
// a freshly initialised model of any preset and depth, built in seconds rather than minutes.
// ZayaModel::init (one serial RNG stream) runs on a two-layer, one-expert, small-vocabulary copy
// of the config; layers 2.. are deep copies of layer 1 (layer 0 differs: it has no router state
// scale); the embedding and every layer's experts and router output are filled in parallel from
// counter-based streams. The values are those of a
// fresh model in distribution only; benchmarks measure speed, not quality.
#pragma once
#include <cstdint>

#include "model/zaya.h"

namespace zaya::bench {

ZayaModel random_model(const ZayaConfig& cfg, uint64_t seed);

}  // namespace zaya::bench
