#include "base/flag_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FlagFileTest, FlagsCommentsAndBlankLines) {
  auto flags =
      ParseFlagFileText("# kvpoold\n--layers=4\n\n  --indexer  \n--k_scales=0.5,0.25\r\n", "f");
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_THAT(*flags, ElementsAre("--layers=4", "--indexer", "--k_scales=0.5,0.25"));
}

TEST(FlagFileTest, MalformedLinesNameTheFileAndLine) {
  const std::string nul("--ok\n--bad\0name\n", 17);
  for (const std::string& text : {std::string("--layers=4\nlayers=4\n"), std::string("--=4\n"),
                                  std::string("--la yers=4\n"), std::string("-\n"), nul}) {
    absl::Status status = ParseFlagFileText(text, "kvpoold.flags").status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << text;
    EXPECT_THAT(status.message(), HasSubstr("kvpoold.flags:")) << text;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      ParseFlagFileText(std::string(kMaxFlagFileBytes + 1, '#'), "f").status()));
}

TEST(FlagFileTest, FilesExpandInPlaceAndMayNotIncludeThemselves) {
  char dir[] = "/tmp/kvpool-flags-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string outer = std::string(dir) + "/outer", inner = std::string(dir) + "/inner",
                    loop = std::string(dir) + "/loop";
  std::ofstream(inner) << "--b=2\n";
  std::ofstream(outer) << "--a=1\n--flagfile=" << inner << "\n--c=3\n";
  std::ofstream(loop) << "--flagfile=" << loop << "\n";
  std::string prog = "prog", f1 = "--flagfile=" + outer, d = "--d=4";
  char* argv[] = {prog.data(), f1.data(), d.data()};
  auto args = ExpandFlagFiles(3, argv);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args, ElementsAre("prog", "--a=1", "--b=2", "--c=3", "--d=4"));
  std::string f2 = "--flagfile=" + loop;
  char* looping[] = {prog.data(), f2.data()};
  EXPECT_THAT(ExpandFlagFiles(2, looping).status().message(), HasSubstr("includes itself"));
  std::string missing = "--flagfile=" + std::string(dir) + "/none";
  char* absent[] = {prog.data(), missing.data()};
  EXPECT_TRUE(absl::IsNotFound(ExpandFlagFiles(2, absent).status()));
  for (const std::string& f : {outer, inner, loop}) std::remove(f.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace kvp
