#include "kernels/synthetic/synthetic_model.h"

namespace kvp {

SyntheticConfig SyntheticConfigOf(const ModelConfig& model) {
  SyntheticConfig cfg;
  cfg.seed = model.synthetic_seed;
  return cfg;
}

SyntheticShape SyntheticShapeOf(const PoolSpec& spec, const ModelConfig& model) {
  // An MLA pool's token is one "kv head" of 576 values (its latent then RoPE part), and so is
  // each absorbed query head.
  return SyntheticShape{spec.num_kv_heads, model.num_q_heads, spec.InputDim()};
}

uint64_t SyntheticStepSeed(const SyntheticConfig& cfg, int32_t token, int64_t position) {
  return SyntheticMix(TokenSeed(cfg, token) ^ (static_cast<uint64_t>(position) << 20));
}

}  // namespace kvp
