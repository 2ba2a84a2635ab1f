// CURVE key files: what kvpoold and kvpoolctl read must be exactly the keys written, and anything
// else a clear error naming the file.
#include "protocol/curve.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpool-curve-XXXXXX";
    dir_ = ::mkdtemp(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name)) << text;
  }
  std::string dir_;
};

TEST_F(CurveTest, APublicKeyFollowsFromItsSecret) {
  absl::StatusOr<CurveKeyPair> pair = NewCurveKeyPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->public_key.size(), 40u);
  absl::StatusOr<CurveKeyPair> again = CurveKeyPairFromSecret(pair->secret_key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->public_key, pair->public_key);
  EXPECT_TRUE(absl::IsInvalidArgument(CurveKeyPairFromSecret("short").status()));
}

TEST_F(CurveTest, KeyFilesRoundTripAndAreNeverOverwritten) {
  const CurveKeyPair pair = *NewCurveKeyPair();
  ASSERT_TRUE(WriteCurveKeyFile(Path("secret"), pair.secret_key, 0600).ok());
  struct stat st {};
  ASSERT_EQ(::stat(Path("secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<std::string> read = ReadCurveKeyFile(Path("secret"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, pair.secret_key);
  EXPECT_TRUE(absl::IsAlreadyExists(WriteCurveKeyFile(Path("secret"), "x", 0600)));
  EXPECT_EQ(*ReadCurveKeyFile(Path("secret")), pair.secret_key);
}

TEST_F(CurveTest, AllowListsSkipCommentsAndBlanksAndKeepKeysWithHashes) {
  // '#' is a Z85 character: only a line that starts with it is a comment.
  std::string text = "# clients\n\n";
  std::vector<std::string> publics;
  bool some_key_has_a_hash = false;
  for (int i = 0; i < 30; ++i) {
    publics.push_back(NewCurveKeyPair()->public_key);
    some_key_has_a_hash |= publics.back().find('#') != std::string::npos;
    text += "  " + publics.back() + "  \n";
  }
  Write("clients", text);
  absl::StatusOr<std::vector<std::string>> raw = ReadCurveKeyListFile(Path("clients"));
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_EQ(raw->size(), publics.size());
  for (size_t i = 0; i < publics.size(); ++i) {
    char z85[41];
    zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>((*raw)[i].data()), 32);
    EXPECT_EQ(std::string(z85), publics[i]);
  }
  EXPECT_TRUE(some_key_has_a_hash) << "30 random keys without a '#': the test proves less";
}

TEST_F(CurveTest, BadKeyFilesAreErrorsNamingTheFile) {
  EXPECT_TRUE(absl::IsNotFound(ReadCurveKeyFile(Path("missing")).status()));
  Write("two", NewCurveKeyPair()->public_key + "\n" + NewCurveKeyPair()->public_key + "\n");
  absl::Status s = ReadCurveKeyFile(Path("two")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds 2 keys"));
  Write("short", "abc\n");
  s = ReadCurveKeyListFile(Path("short")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(Path("short") + ":1: a CURVE key is 40"));
  Write("bad", "# fine\n" + std::string(40, '"') + "\n");  // '"' is not Z85
  s = ReadCurveKeyListFile(Path("bad")).status();
  EXPECT_THAT(s.message(), HasSubstr(":2: a CURVE key holds characters that are not Z85"));
}

TEST(CurveKeyLinesTest, AreParsedLineByLineAndNeverEchoAKey) {
  const CurveKeyPair pair = NewCurveKeyPair().value();
  auto keys = ParseCurveKeyLines("# admitted\n\n  " + pair.public_key + "  \n", "clients");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, std::vector<std::string>{pair.public_key});
  const std::string damaged = pair.secret_key.substr(0, 39) + "\x7f";
  const absl::Status s = ParseCurveKeyLines("\n" + damaged + "\n", "secret").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("secret:2"));
  EXPECT_EQ(std::string(s.message()).find(damaged.substr(0, 20)), std::string::npos);
}

}  // namespace
}  // namespace kvp
