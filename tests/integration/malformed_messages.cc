#include "tests/integration/malformed_messages.h"

#include <capnp/any.h>
#include <capnp/message.h>

#include <functional>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "protocol/kvpool.capnp.h"
#include "protocol/status_codec.h"

namespace kvp::testing {
namespace {

MalformedMessage Build(std::string what, const std::function<void(wire::Envelope::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  auto e = message.initRoot<wire::Envelope>();
  e.setSchemaVersion(wire::SCHEMA_VERSION);
  e.setRequestId(9);
  fill(e);
  MalformedMessage m{std::move(what), {}};
  for (auto segment : message.getSegmentsForOutput()) {
    m.frames.emplace_back(reinterpret_cast<const char*>(segment.begin()),
                          segment.size() * sizeof(capnp::word));
  }
  return m;
}

}  // namespace

absl::Status ExpectRefused(Dealer& dealer, const MalformedMessage& m) {
  std::vector<zmq::message_t> frames;
  for (const std::string& f : m.frames) frames.emplace_back(f.data(), f.size());
  if (!zmq::send_multipart(dealer.socket(), frames).has_value()) {
    return absl::UnavailableError(absl::StrCat(m.what, ": not sent"));
  }
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = dealer.Receive(10'000);
  if (!reply.ok())
    return absl::UnavailableError(absl::StrCat(m.what, ": ", reply.status().ToString()));
  const auto body = (*reply)->envelope().getBody();
  const absl::Status answer = body.isError() ? StatusFromWire(body.getError()) : absl::OkStatus();
  if ((*reply)->request_id() != 9 || !absl::IsInvalidArgument(answer)) {
    return absl::InternalError(absl::StrCat(m.what, ": answered request ", (*reply)->request_id(),
                                            " with ", answer.ToString()));
  }
  return absl::OkStatus();
}

std::vector<MalformedMessage> MalformedMessages() {
  std::vector<MalformedMessage> all;
  all.push_back(Build("a struct where the token list belongs", [](wire::Envelope::Builder e) {
    auto prefill = e.getBody().initPrefill();
    capnp::AnyStruct::Builder any = wire::PrefillRequest::Builder(prefill);
    any.getPointerSection()[0].initAs<wire::Tensor>();
  }));
  all.push_back(Build("2^28 zero-byte decode steps", [](wire::Envelope::Builder e) {
    auto decode = e.getBody().initDecode();
    capnp::AnyStruct::Builder any = wire::DecodeRequest::Builder(decode);
    any.getPointerSection()[0].initAsListOfAnyStruct(0, 0, 1u << 28);
  }));
  all.push_back(Build("a role no schema has", [](wire::Envelope::Builder e) {
    e.getBody().initRegister().setRole(static_cast<wire::Role>(9));
  }));
  all.push_back(Build("a union member that does not exist", [](wire::Envelope::Builder e) {
    e.getBody().initHeartbeat();
    capnp::AnyStruct::Builder any = wire::Envelope::Builder(e);
    any.getDataSection()[4] = 0xE7;  // the body's discriminant: 999
    any.getDataSection()[5] = 0x03;
  }));
  return all;
}

}  // namespace kvp::testing
