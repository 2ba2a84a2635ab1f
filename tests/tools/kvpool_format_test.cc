// Runs the kvpool-format binary (its path is the first argument) as a user would.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/kv_format_names.h"
#include "kvpool/format/mla_codec.h"
#include "kvpool/format/section_codec.h"

namespace kvp {
namespace {

std::string g_binary;

struct Result {
  int exit_code;
  std::string output;
};

Result RunTool(const std::string& args) {
  const std::string command = g_binary + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  Result r{-1, ""};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class KvpoolFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool_format_test.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  template <typename T>
  void Write(const std::string& name, const std::vector<T>& v) const {
    std::ofstream(Path(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> Read(const std::string& name) const {
    std::ifstream in(Path(name), std::ios::binary | std::ios::ate);
    std::vector<T> v(static_cast<size_t>(in.tellg()) / sizeof(T));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), v.size() * sizeof(T));
    return v;
  }

  std::string dir_;
};

TEST_F(KvpoolFormatTest, EncodeDecodeRoundTripsEveryFormat) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 0.7f);
  for (const char* format : {"bf16", "fp8_e4m3", "turbo2", "turbo3", "turbo4", "indexer"}) {
    for (int d : {64, 128, 256}) {
      if (std::string(format) == "indexer" && d != 128) continue;
      std::vector<float> values(37 * d);
      for (float& x : values) x = normal(rng);
      Write("in.f32", values);
      const std::string opts =
          std::string("--format=") + format + " --head-dim=" + std::to_string(d) + " --scale=0.5";
      Result r = RunTool("encode " + opts + " " + Path("in.f32") + " " + Path("out.bin"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      // The bytes are exactly the library's encoding of the same values.
      SectionCodecOptions o;
      o.format = ParseKvFormat(format).value();
      o.head_dim = d;
      o.scale = 0.5f;
      EXPECT_EQ(Read<uint8_t>("out.bin"), EncodeSections(o, values).value()) << format << d;
      r = RunTool("decode " + opts + " " + Path("out.bin") + " " + Path("back.f32"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::vector<float> back = Read<float>("back.f32");
      ASSERT_EQ(back.size(), values.size());
      EXPECT_EQ(back, DecodeSections(o, EncodeSections(o, values).value()).value());
      r = RunTool("stats " + opts + " " + Path("in.f32"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("relative_mse"), std::string::npos);
      EXPECT_NE(r.output.find("snr_db"), std::string::npos);
    }
  }
}

TEST_F(KvpoolFormatTest, TheMlaLatentCacheEncodesWholeTokens) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> values(3 * 576);
  for (float& x : values) x = normal(rng);
  Write("in.f32", values);
  Result r = RunTool("encode --format=fp8_ds_mla " + Path("in.f32") + " " + Path("out.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<uint8_t> bytes = Read<uint8_t>("out.bin");
  EXPECT_EQ(bytes.size(), 3u * 656);
  EXPECT_EQ(bytes, EncodeMlaTokens(values).value());
  r = RunTool("decode --format=fp8_ds_mla " + Path("out.bin") + " " + Path("back.f32"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Read<float>("back.f32"), DecodeMlaTokens(bytes).value());
  r = RunTool("stats --format=fp8_ds_mla " + Path("in.f32"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bytes_per_token   656"), std::string::npos) << r.output;
  Write("short.f32", std::vector<float>(575, 1.0f));
  r = RunTool("encode --format=fp8_ds_mla " + Path("short.f32") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("576-value MLA tokens"), std::string::npos) << r.output;
}

TEST_F(KvpoolFormatTest, BadInputGetsAClearErrorAndNoOutput) {
  Write("in.f32", std::vector<float>(100, 1.0f));  // not a whole number of 64-vectors
  Result r = RunTool("encode --format=turbo3 --head-dim=64 " + Path("in.f32") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("not a whole number"), std::string::npos) << r.output;
  EXPECT_NE(::access(Path("o").c_str(), F_OK), 0);

  r = RunTool("encode --format=turbo7 --head-dim=64 " + Path("in.f32") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown format 'turbo7'"), std::string::npos) << r.output;

  r = RunTool("encode --format=turbo3 --head-dim=96 " + Path("in.f32") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("head dim 96"), std::string::npos) << r.output;

  std::vector<float> with_inf(64, 1.0f);
  with_inf[9] = 1.0f / 0.0f;
  Write("inf.f32", with_inf);
  r = RunTool("encode --format=turbo2 --head-dim=64 " + Path("inf.f32") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("vector 0 element 9"), std::string::npos) << r.output;

  r = RunTool("decode --format=turbo3 --head-dim=128 " + Path("missing") + " " + Path("o"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no such file"), std::string::npos) << r.output;

  r = RunTool("encode --format=fp8_e4m3 " + Path("in.f32"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--head-dim is required"), std::string::npos) << r.output;
  EXPECT_NE(::access(Path("o").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: kvpool_format_test PATH_TO_KVPOOL_FORMAT\n");
    return 2;
  }
  kvp::g_binary = argv[1];
  return RUN_ALL_TESTS();
}
