// The peers file (daemon/peers.h): what it accepts, and every way it names a bad line.
#include "daemon/peers.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/curve.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

class PeersTest : public ::testing::Test {
 protected:
  std::string b_key_ = NewCurveKeyPair()->public_key;
  std::string c_key_ = NewCurveKeyPair()->public_key;
};

TEST_F(PeersTest, ReadsNamesEndpointsAndKeysSkippingComments) {
  const std::string text = "# peers of a\n\n  b tcp://10.0.0.2:7001 " + b_key_ +
                           "\nnode-3\ttcp://node-3.kvpool:7001\t" + c_key_ + "\n";
  absl::StatusOr<std::vector<PeerNode>> peers = ParsePeers(text, "peers", "a");
  ASSERT_TRUE(peers.ok()) << peers.status();
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_EQ((*peers)[0].name, "b");
  EXPECT_EQ((*peers)[0].endpoint, "tcp://10.0.0.2:7001");
  EXPECT_EQ((*peers)[0].public_key, b_key_);
  EXPECT_EQ((*peers)[0].raw_key, *DecodeZ85Key(b_key_));
  EXPECT_EQ((*peers)[1].name, "node-3");
}

TEST_F(PeersTest, NamesTheLineAndWhatIsWrongWithIt) {
  const struct {
    std::string text;
    const char* why;
  } cases[] = {
      {"b tcp://h:1", "expected: NAME tcp://HOST:PORT PUBLIC_KEY"},
      {"B tcp://h:1 " + b_key_, "node name 'B'"},
      {"-b tcp://h:1 " + b_key_, "node name '-b'"},
      {"a tcp://h:1 " + b_key_, "'a' is this node's name"},
      {"b ipc:///x " + b_key_, "expected tcp://HOST:PORT"},
      {"b tcp://h:1 notakey", "a CURVE key is 40 Z85 characters"},
      {"b tcp://h:1 " + b_key_ + "\nb tcp://h:2 " + c_key_, "peer b again"},
      {"b tcp://h:1 " + b_key_ + "\nc tcp://h:1 " + c_key_, "endpoint tcp://h:1 again"},
      {"b tcp://h:1 " + b_key_ + "\nc tcp://h:2 " + b_key_, "a key listed for another peer"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::vector<PeerNode>> peers = ParsePeers(c.text, "peers", "a");
    ASSERT_FALSE(peers.ok()) << c.text;
    EXPECT_EQ(peers.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(peers.status().message(), HasSubstr(c.why)) << c.text;
    EXPECT_THAT(peers.status().message(), HasSubstr("peers:")) << c.text;
  }
}

TEST(NodeNameTest, IsADnsLabel) {
  EXPECT_TRUE(CheckNodeName("a").ok());
  EXPECT_TRUE(CheckNodeName("gpu-node-17").ok());
  EXPECT_FALSE(CheckNodeName("").ok());
  EXPECT_FALSE(CheckNodeName("a/b").ok());
  EXPECT_FALSE(CheckNodeName("a.b").ok());
  EXPECT_FALSE(CheckNodeName(std::string(64, 'a')).ok());
}

TEST(NodeNameTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadPeersFile("/nonexistent/peers", "a").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvp
