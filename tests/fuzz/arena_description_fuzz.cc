// Fuzz target: any bytes as the arena description a worker receives with the arena's fds.
// Findings: a crash, or a description accepted whose blocks do not fit its chunks, or that does
// not survive encoding again.
#include "kvpool/arena/arena_description.h"
#include "kvpool/layout/block_layout.h"
#include "tests/fuzz/fuzz_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;
  absl::StatusOr<ArenaDescription> d = DecodeArenaDescription(absl::MakeConstSpan(data, size));
  if (!d.ok()) return 0;
  const int64_t stride = BlockLayout::Create(d->spec).value().block_stride();
  if (d->num_blocks <= 0 ||
      static_cast<uint64_t>(d->num_blocks) > d->total_bytes() / static_cast<uint64_t>(stride)) {
    fuzz::CheckOrDie(absl::InternalError("accepted blocks outside the chunks"), "description");
  }
  const std::string again = EncodeArenaDescription(*d);
  absl::StatusOr<ArenaDescription> back = DecodeArenaDescription(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(again.data()), again.size()));
  fuzz::CheckOrDie(back.status(), "a decoded description does not decode again");
  if (EncodeArenaDescription(*back) != again) {
    fuzz::CheckOrDie(absl::InternalError("encoding is not stable"), "description");
  }
  return 0;
}
