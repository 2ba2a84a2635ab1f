// The boundary check (protocol/message_check.h): messages that Cap'n Proto's generic traversal
// accepts but whose typed reads would throw are refused by ParseEnvelope with a Status naming the
// field, and every list of the schema carries a bound.
#include "protocol/message_check.h"

#include <capnp/any.h>
#include <capnp/dynamic.h>

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/framing.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

// Every struct reachable from the Envelope, and every List field of them.
void CollectLists(capnp::StructSchema s, std::set<uint64_t>& seen,
                  std::vector<std::string>& unbounded, const WireLimits& limits) {
  if (!seen.insert(s.getProto().getId()).second) return;
  for (auto field : s.getFields()) {
    capnp::Type type = field.getType();
    const std::string name =
        std::string(s.getProto().getDisplayName().cStr()) + "." + field.getProto().getName().cStr();
    if (type.isList()) {
      if (TEST_ListBound(field, limits) == 0) unbounded.push_back(name);
      type = type.asList().getElementType();
    }
    if (type.isStruct()) CollectLists(type.asStruct(), seen, unbounded, limits);
  }
}

TEST(MessageCheckTest, EveryListOfTheSchemaHasABound) {
  std::set<uint64_t> seen;
  std::vector<std::string> unbounded;
  CollectLists(capnp::Schema::from<wire::Envelope>(), seen, unbounded, WireLimits());
  EXPECT_GT(seen.size(), 30u);
  EXPECT_THAT(unbounded, ::testing::IsEmpty());
}

TEST(MessageCheckTest, BoundsComeFromTheSchemaAndThePool) {
  WireLimits limits;
  limits.max_layers = 3;
  limits.max_blocks = 77;
  const auto prefill = capnp::Schema::from<wire::PrefillRequest>();
  EXPECT_EQ(TEST_ListBound(prefill.getFieldByName("tokens"), limits), wire::MAX_PREFILL_TOKENS);
  const auto activations = capnp::Schema::from<wire::Activations>();
  EXPECT_EQ(TEST_ListBound(activations.getFieldByName("k"), limits), 3u);
  const auto step = capnp::Schema::from<wire::DecodeJobStep>();
  EXPECT_EQ(TEST_ListBound(step.getFieldByName("blockTable"), limits), 77u);
}

// The frames of `message`, as a peer would send them.
std::vector<zmq::message_t> Frames(capnp::MallocMessageBuilder& message) {
  std::vector<zmq::message_t> frames;
  for (auto segment : message.getSegmentsForOutput()) {
    frames.emplace_back(segment.begin(), segment.size() * sizeof(capnp::word));
  }
  return frames;
}

wire::Envelope::Builder NewEnvelope(capnp::MallocMessageBuilder& message) {
  auto e = message.initRoot<wire::Envelope>();
  e.setSchemaVersion(wire::SCHEMA_VERSION);
  e.setRequestId(9);
  return e;
}

absl::Status Parse(capnp::MallocMessageBuilder& message, const WireLimits& limits = {}) {
  uint64_t id = 0;
  absl::Status s = ParseEnvelope(Frames(message), limits, &id).status();
  EXPECT_EQ(id, 9u) << "the error reply can still carry the request id";
  return s;
}

TEST(MessageCheckTest, AStructWhereAListBelongsIsRefusedNamingTheField) {
  capnp::MallocMessageBuilder message;
  auto prefill = NewEnvelope(message).getBody().initPrefill();
  prefill.setSequence(1);
  // PrefillRequest's first pointer is `tokens`, a List(Int32): put a struct there.
  capnp::AnyStruct::Builder any = wire::PrefillRequest::Builder(prefill);
  any.getPointerSection()[0].initAs<wire::Tensor>().setDtype(wire::DType::INT32);
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("body.prefill.tokens"));
}

TEST(MessageCheckTest, AListWhereAStructBelongsIsRefused) {
  capnp::MallocMessageBuilder message;
  auto step = NewEnvelope(message).getBody().initDecode().initSteps(1)[0];
  capnp::AnyStruct::Builder any = wire::DecodeStep::Builder(step);
  any.getPointerSection()[0].initAsAnyList(capnp::ElementSize::FOUR_BYTES, 3);  // activations
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("body.decode.steps[0].activations"));
}

TEST(MessageCheckTest, AHugeListOfZeroByteElementsIsRefusedBeforeAnyoneWalksIt) {
  capnp::MallocMessageBuilder message;
  auto decode = NewEnvelope(message).getBody().initDecode();
  capnp::AnyStruct::Builder any = wire::DecodeRequest::Builder(decode);
  any.getPointerSection()[0].initAsListOfAnyStruct(0, 0, 1u << 28);  // steps
  EXPECT_LT(message.sizeInWords(), 16u);
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(MessageCheckTest, AListLongerThanThePoolAllowsIsRefused) {
  capnp::MallocMessageBuilder message;
  auto prefill = NewEnvelope(message).getBody().initPrefill();
  prefill.initTokens(1);
  prefill.initActivations().initK(5);
  WireLimits limits;
  limits.max_layers = 4;
  const absl::Status s = Parse(message, limits);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("body.prefill.activations.k: list of 5 elements; at most 4"));
  limits.max_layers = 5;
  EXPECT_TRUE(Parse(message, limits).ok());
}

TEST(MessageCheckTest, AnEnumValueTheSchemaDoesNotListIsRefused) {
  capnp::MallocMessageBuilder message;
  auto reg = NewEnvelope(message).getBody().initRegister();
  reg.setRole(static_cast<wire::Role>(77));
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("body.register.role"));
}

TEST(MessageCheckTest, AnUnknownUnionMemberIsRefused) {
  capnp::MallocMessageBuilder message;
  auto e = NewEnvelope(message);
  e.getBody().initStats();
  // The body's discriminant is the envelope's 16 bits after schemaVersion (bytes 4-5): 999 is
  // no member.
  capnp::AnyStruct::Builder any = wire::Envelope::Builder(e);
  auto data = any.getDataSection();
  data[4] = 0xE7;
  data[5] = 0x03;
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("union member"));
}

TEST(MessageCheckTest, ATextOverItsBoundIsRefused) {
  capnp::MallocMessageBuilder message;
  auto prefill = NewEnvelope(message).getBody().initPrefill();
  prefill.initTokens(1);
  prefill.setCacheNamespace(std::string(wire::MAX_NAME_BYTES + 1, 'x'));
  const absl::Status s = Parse(message);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("cacheNamespace"));
}

TEST(MessageCheckTest, WellFormedMessagesPass) {
  capnp::MallocMessageBuilder message;
  auto step = NewEnvelope(message).getBody().initDecode().initSteps(2)[1];
  step.setSequence(3);
  auto q = step.initQueries().initQ(2);
  q[0].setDtype(wire::DType::BF16);
  q[0].initShape(2).set(0, 32);
  EXPECT_TRUE(Parse(message).ok());
}

}  // namespace
}  // namespace kvp
