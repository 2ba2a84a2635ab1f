#include "protocol/framing.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

std::vector<zmq::message_t> PrefillMessage(uint64_t request_id, int tokens) {
  EnvelopeBuilder b(request_id);
  auto prefill = b.envelope().getBody().initPrefill();
  prefill.setSequence(77);
  auto list = prefill.initTokens(tokens);
  for (int i = 0; i < tokens; ++i) list.set(i, i * 3);
  return b.Frame();
}

// Copies of the frames (what arrives from a socket).
std::vector<zmq::message_t> Copy(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> out;
  for (const zmq::message_t& f : frames) out.emplace_back(f.data(), f.size());
  return out;
}

TEST(FramingTest, EnvelopesRoundTripWithTheirRequestId) {
  auto frames = PrefillMessage(0xABCDEF0123ull, 100000);  // large enough for several segments
  EXPECT_GT(frames.size(), 1u);
  auto parsed = ParseEnvelope(Copy(frames)).value();
  EXPECT_EQ(parsed->request_id(), 0xABCDEF0123ull);
  ASSERT_TRUE(parsed->envelope().getBody().isPrefill());
  const auto prefill = parsed->envelope().getBody().getPrefill();
  EXPECT_EQ(prefill.getSequence(), 77u);
  ASSERT_EQ(prefill.getTokens().size(), 100000u);
  EXPECT_EQ(prefill.getTokens()[99999], 99999 * 3);
}

TEST(FramingTest, ZeroCopyFramesKeepTheBuilderAliveUntilReleased) {
  std::vector<zmq::message_t> frames = PrefillMessage(5, 10);
  auto parsed = ParseEnvelope(std::move(frames)).value();  // reads the builder's own memory
  EXPECT_EQ(parsed->envelope().getBody().getPrefill().getTokens()[9], 27);
}

TEST(FramingTest, MisalignedFramesAreCopiedNotReadInPlace) {
  const auto frames = PrefillMessage(9, 50);
  std::vector<std::vector<char>> buffers;
  std::vector<zmq::message_t> odd;
  for (const zmq::message_t& f : frames) {
    buffers.emplace_back(f.size() + 1);
    std::memcpy(buffers.back().data() + 1, f.data(), f.size());
    odd.emplace_back(buffers.back().data() + 1, f.size(), nullptr, nullptr);  // not 8-aligned
  }
  auto parsed = ParseEnvelope(std::move(odd)).value();
  EXPECT_EQ(parsed->envelope().getBody().getPrefill().getTokens()[49], 147);
}

TEST(FramingTest, GarbageIsRefusedWithAStatus) {
  std::vector<zmq::message_t> empty;
  EXPECT_EQ(ParseEnvelope(std::move(empty)).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<zmq::message_t> odd_size;
  odd_size.emplace_back("hello", 5);
  EXPECT_EQ(ParseEnvelope(std::move(odd_size)).status().code(), absl::StatusCode::kInvalidArgument);
  // Eight words of 0xFF: a root pointer to nowhere.
  std::vector<zmq::message_t> noise;
  std::vector<uint8_t> bytes(64, 0xFF);
  noise.emplace_back(bytes.data(), bytes.size());
  const auto status = ParseEnvelope(std::move(noise)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // A valid message cut short.
  auto frames = PrefillMessage(1, 1000);
  std::vector<zmq::message_t> cut;
  cut.emplace_back(frames[0].data(), frames[0].size() / 2 / 8 * 8);
  EXPECT_EQ(ParseEnvelope(std::move(cut)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FramingTest, LimitsAreEnforced) {
  WireLimits small;
  small.max_message_bytes = 4096;
  EXPECT_EQ(ParseEnvelope(PrefillMessage(1, 10000), small).status().code(),
            absl::StatusCode::kInvalidArgument);
  WireLimits few;
  few.max_segments = 1;
  auto many = PrefillMessage(1, 100000);
  ASSERT_GT(many.size(), 1u);
  EXPECT_EQ(ParseEnvelope(std::move(many), few).status().code(),
            absl::StatusCode::kInvalidArgument);
  WireLimits shallow;
  shallow.nesting_limit = 1;
  EXPECT_EQ(ParseEnvelope(PrefillMessage(1, 10), shallow).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FramingTest, AnotherSchemaVersionIsAFailedPrecondition) {
  EnvelopeBuilder b(3);
  b.envelope().setSchemaVersion(wire::SCHEMA_VERSION + 1);
  b.envelope().getBody().initHealth();
  uint64_t request_id = 0;
  const auto status = ParseEnvelope(b.Frame(), {}, &request_id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("schema version"), absl::string_view::npos);
  EXPECT_EQ(request_id, 3u);  // so the error reply can answer the request
}

TEST(FramingTest, AFrameCanBeSentAgain) {
  EnvelopeBuilder b(4);
  b.envelope().getBody().initRelease().setSequence(9);
  for (int i = 0; i < 2; ++i) {
    auto parsed = ParseEnvelope(b.Frame());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ((*parsed)->envelope().getBody().getRelease().getSequence(), 9u);
  }
}

TEST(FramingTest, CrossesARealZeroMqSocketAsMultipart) {
  zmq::context_t context;
  zmq::socket_t tx(context, zmq::socket_type::pair), rx(context, zmq::socket_type::pair);
  rx.bind("inproc://framing-test");
  tx.connect("inproc://framing-test");
  std::vector<zmq::message_t> frames = PrefillMessage(42, 70000);
  const size_t count = frames.size();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_TRUE(
        tx.send(frames[i], i + 1 < count ? zmq::send_flags::sndmore : zmq::send_flags::none));
  }
  std::vector<zmq::message_t> received;
  do {
    zmq::message_t part;
    ASSERT_TRUE(rx.recv(part));
    received.push_back(std::move(part));
  } while (received.back().more());
  EXPECT_EQ(received.size(), count);
  auto parsed = ParseEnvelope(std::move(received)).value();
  EXPECT_EQ(parsed->request_id(), 42u);
  EXPECT_EQ(parsed->envelope().getBody().getPrefill().getTokens()[69999], 69999 * 3);
}

TEST(StatusCodecTest, EveryCodeRoundTrips) {
  for (int code = 0; code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code),
                          code == 0 ? "" : "why " + std::to_string(code));
    EnvelopeBuilder b(1);
    StatusToWire(in, b.envelope().getBody().initError());
    auto parsed = ParseEnvelope(b.Frame()).value();
    const absl::Status out = StatusFromWire(parsed->envelope().getBody().getError());
    EXPECT_EQ(out.code(), in.code());
    EXPECT_EQ(out.message(), in.message());
  }
}

}  // namespace
}  // namespace kvp
