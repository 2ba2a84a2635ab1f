#include "protocol/guard.h"

#include <kj/exception.h>

#include "absl/strings/str_cat.h"

namespace kvp {

absl::Status RunGuarded(absl::FunctionRef<absl::Status()> handler) {
  absl::Status status;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&] { status = handler(); });
  KJ_IF_MAYBE (e, failure) {
    return absl::InternalError(
        absl::StrCat("the handler failed unexpectedly: ", e->getDescription().cStr()));
  }
  return status;
}

}  // namespace kvp
