#include "protocol/status_codec.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvp {

// Abseil's code numbers are the wire enum's ordinals (kvpool.capnp); these keep it so.
static_assert(static_cast<int>(wire::StatusCode::INVALID_ARGUMENT) ==
              static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(static_cast<int>(wire::StatusCode::RESOURCE_EXHAUSTED) ==
              static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(static_cast<int>(wire::StatusCode::UNAUTHENTICATED) ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));

void StatusToWire(const absl::Status& status, wire::Error::Builder error) {
  error.setCode(static_cast<wire::StatusCode>(static_cast<int>(status.code())));
  error.setMessage(std::string(status.message()));
}

absl::Status StatusFromWire(wire::Error::Reader error) {
  const int code = static_cast<int>(error.getCode());
  const std::string message = error.getMessage();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat("error with unknown code ", code, ": ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace kvp
