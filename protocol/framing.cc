#include "protocol/framing.h"

#include <capnp/schema.h>

#include <string>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "protocol/message_check.h"

namespace kvp {

EnvelopeBuilder::EnvelopeBuilder(uint64_t request_id)
    : message_(std::make_shared<capnp::MallocMessageBuilder>()),
      root_(message_->initRoot<wire::Envelope>()) {
  root_.setSchemaVersion(wire::SCHEMA_VERSION);
  root_.setRequestId(request_id);
}

std::vector<zmq::message_t> EnvelopeBuilder::Frame() const {
  // Every frame holds a reference to the builder; the last one released frees it.
  const auto segments = message_->getSegmentsForOutput();
  std::vector<zmq::message_t> frames;
  frames.reserve(segments.size());
  for (const auto& segment : segments) {
    auto* ref = new std::shared_ptr<capnp::MallocMessageBuilder>(message_);
    frames.emplace_back(
        const_cast<capnp::word*>(segment.begin()), segment.size() * sizeof(capnp::word),
        [](void*, void* hint) {
          delete static_cast<std::shared_ptr<capnp::MallocMessageBuilder>*>(hint);
        },
        ref);
  }
  return frames;
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> ParseEnvelope(std::vector<zmq::message_t> frames,
                                                              const WireLimits& limits,
                                                              uint64_t* request_id) {
  if (request_id != nullptr) *request_id = 0;
  if (frames.empty()) return absl::InvalidArgumentError("empty message");
  if (frames.size() > limits.max_segments) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", frames.size(), " frames; at most ", limits.max_segments));
  }
  size_t total = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const size_t size = frames[i].size();
    if (size == 0 || size % sizeof(capnp::word) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame ", i, " has ", size, " bytes, not a whole number of 8-byte words"));
    }
    total += size;
  }
  if (total > limits.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message of ", total, " bytes exceeds the limit of ", limits.max_message_bytes));
  }
  std::unique_ptr<ParsedEnvelope> parsed(new ParsedEnvelope());
  parsed->frames_ = std::move(frames);
  for (zmq::message_t& frame : parsed->frames_) {
    const size_t words = frame.size() / sizeof(capnp::word);
    const auto* data = static_cast<const capnp::word*>(frame.data());
    if (reinterpret_cast<uintptr_t>(data) % alignof(capnp::word) != 0) {
      auto copy = std::make_unique<capnp::word[]>(words);
      std::memcpy(copy.get(), frame.data(), frame.size());
      data = copy.get();
      parsed->copies_.push_back(std::move(copy));
    }
    parsed->segments_.emplace_back(data, words);
  }
  const kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments(parsed->segments_.data(),
                                                                     parsed->segments_.size());
  const uint64_t words = total / sizeof(capnp::word);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words * limits.traversal_words_per_message_word;
  options.nestingLimit = limits.nesting_limit;
  absl::Status checked;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&] {
    // One full traversal under the tight limit: malformed pointers, aliasing amplification and
    // nesting fail here, not in the handlers.
    capnp::SegmentArrayMessageReader check(segments, options);
    check.getRoot<wire::Envelope>().totalSize();
    // Then every field as the schema types it, within its bounds, on a reader of its own: what it
    // reads (lists of zero-byte elements count their length) must not eat the handlers' budget.
    capnp::SegmentArrayMessageReader typed(segments, options);
    checked = CheckEnvelope(typed.getRoot<wire::Envelope>(), limits);
    // The handlers' reader: the message is known to be sound, and handlers read each part a
    // bounded number of times, so its limit only needs headroom over one traversal.
    options.traversalLimitInWords = words * limits.handler_reads_per_message_word;
    parsed->reader_ = std::make_unique<capnp::SegmentArrayMessageReader>(segments, options);
    parsed->root_ = parsed->reader_->getRoot<wire::Envelope>();
    parsed->root_.getBody().which();
  });
  KJ_IF_MAYBE (e, failure) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid kvpool Envelope: ", e->getDescription().cStr()));
  }
  if (request_id != nullptr) *request_id = parsed->root_.getRequestId();
  if (parsed->root_.getSchemaVersion() != wire::SCHEMA_VERSION) {
    return absl::FailedPreconditionError(
        absl::StrCat("schema version ", parsed->root_.getSchemaVersion(),
                     "; this build speaks version ", wire::SCHEMA_VERSION));
  }
  if (!checked.ok()) return checked;  // no handler's read can throw after it
  return parsed;
}

const char* BodyFieldName(wire::Envelope::Body::Which which) {
  // Read from the schema once, so a new body kind needs no edit here.
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    for (capnp::StructSchema::Field f : capnp::Schema::from<wire::Envelope::Body>().getUnionFields()) {
      const uint16_t d = f.getProto().getDiscriminantValue();
      if (out->size() <= d) out->resize(d + 1);
      (*out)[d] = f.getProto().getName().cStr();
    }
    return out;
  }();
  const auto d = static_cast<size_t>(which);
  return d < names->size() && !(*names)[d].empty() ? (*names)[d].c_str() : "unknown";
}

}  // namespace kvp
