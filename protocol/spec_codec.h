// PoolSpec and ModelConfig <-> wire: the one place the pool's shape and the decode model cross the
// protocol boundary.
#pragma once

#include "absl/status/statusor.h"
#include "kvpool/layout/pool_spec.h"
#include "kvpool/model/model_config.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

// KvFormat <-> wire: the one place the two enums meet (static_asserts keep them in step).
wire::KvFormat KvFormatToWire(KvFormat f);
absl::StatusOr<KvFormat> KvFormatFromWire(wire::KvFormat f);  // INVALID_ARGUMENT if unknown

void ModelConfigToWire(const ModelConfig& model, wire::Model::Builder out);
ModelConfig ModelConfigFromWire(wire::Model::Reader in);

void PoolSpecToWire(const PoolSpec& spec, wire::PoolSpec::Builder out);

// INVALID_ARGUMENT (or UNIMPLEMENTED) when the spec is not one ValidatePoolSpec accepts.
absl::StatusOr<PoolSpec> PoolSpecFromWire(wire::PoolSpec::Reader in);

}  // namespace kvp
