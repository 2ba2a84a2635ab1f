// The cuda arena across real processes on one GPU (fork + exec of kvpool_arena_child, whose path
// is the first argument): exported chunk fds, imported and mapped in the child, writes seen both
// ways.
#include "kvpool/arena/cuda_arena.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/arena/fd_channel.h"

namespace kvp {
namespace {

std::string g_child;
constexpr size_t kPage = 4096;

class CudaArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(CudaArenaTest, GrowsInGranularChunksAtOneBaseAndRejectsOddChunks) {
  const uint64_t g = CudaArena::Granularity(0).value();
  CudaArena arena = CudaArena::Create(0, 16 * g, 16 * g, 64 * g).value();
  uint8_t* base = arena.base();
  ASSERT_EQ(cudaMemset(base, 0x5A, 16 * g), cudaSuccess);
  ASSERT_TRUE(arena.GrowTo(40 * g).ok());
  EXPECT_EQ(arena.base(), base);
  EXPECT_EQ(arena.chunk_sizes().size(), 3u);
  ASSERT_EQ(cudaMemset(base + 32 * g, 0x6B, 8 * g), cudaSuccess);
  uint8_t probe = 0;
  ASSERT_EQ(cudaMemcpy(&probe, base + 12345, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(probe, 0x5A);
  EXPECT_EQ(arena.GrowTo(65 * g).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaArena::Create(0, g + 1, 0, 4 * g).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Runs kvpool_arena_child on `child_device` against a cuda arena on device 0: the child must read
// our pattern and we must read its.
void ExpectTwoProcessesShareTheArena(int child_device) {
  const uint64_t g = CudaArena::Granularity(0).value();
  CudaArena arena = CudaArena::Create(0, 8 * g, 16 * g, 16 * g).value();
  std::vector<uint64_t> page(kPage / 8, 0x0123456789ABCDEFull);
  ASSERT_EQ(cudaMemcpy(arena.base(), page.data(), kPage, cudaMemcpyHostToDevice), cudaSuccess);
  const std::string path =
      absl::StrCat("/tmp/kvpool-cuda-", ::getpid(), "-", child_device, ".sock");
  FdChannelServer server = FdChannelServer::Listen(path, AllowList{{::getuid()}, {}}).value();
  const std::string device = std::to_string(child_device);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl(g_child.c_str(), g_child.c_str(), "cuda-read-write", path.c_str(), "0123456789abcdef",
            "fedcba9876543210", device.c_str(), nullptr);
    ::_exit(127);
  }
  FdPeer peer = server.Accept(20000).value();
  ArenaDescription d;
  d.kind = ArenaKind::kCuda;
  d.device = 0;
  d.chunk_bytes = arena.chunk_sizes();
  // As many blocks of the default spec as the arena holds: a receiver refuses any more.
  d.num_blocks =
      static_cast<int64_t>(d.total_bytes()) / BlockLayout::Create(d.spec)->block_stride();
  std::vector<UniqueFd> fds = arena.ExportFds().value();
  std::vector<int> raw;
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  ASSERT_TRUE(peer.SendArena(d, raw).ok());
  EXPECT_EQ(peer.Receive(30000).value(), "done");
  std::vector<uint64_t> back(kPage / 8);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), arena.base() + 2 * kPage, kPage, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (uint64_t v : back) ASSERT_EQ(v, 0xFEDCBA9876543210ull);
  ASSERT_TRUE(peer.Send("bye").ok());
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A kvpoold restart keeps the arena (docs/design.md §10) because cuMemCreate memory exported as
// POSIX fds lives while any process holds an fd or a mapping of it. The child creates an arena,
// fills page 0, hands us its fds and exits; `map_first`: we map before it exits (a worker's
// mapping holds the memory), else we hold only the fds (as systemd's fd store does) and adopt
// them afterwards. Either way the pattern is still there, and the adopted arena can be handed on.
void ExpectChunksOutliveTheirCreator(bool map_first) {
  const std::string path = absl::StrCat("/tmp/kvpool-cuda-create-", ::getpid(), ".sock");
  ::unlink(path.c_str());
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl(g_child.c_str(), g_child.c_str(), "cuda-create", path.c_str(), "5a5a00ff5a5a00ff",
            nullptr);
    ::_exit(127);
  }
  absl::StatusOr<FdPeer> peer = absl::UnavailableError("not yet");
  for (int i = 0; i < 400 && !peer.ok(); ++i) {
    ::usleep(50'000);
    peer = ConnectFdChannel(path);
  }
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto arena = peer->ReceiveArena(20000);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const std::vector<uint64_t> chunks = arena->first.chunk_bytes;
  std::optional<CudaArenaMapping> mapping;
  std::vector<UniqueFd> fds = std::move(arena->second);
  if (map_first) {
    auto m = CudaArenaMapping::Map(0, chunks, std::move(fds));
    ASSERT_TRUE(m.ok()) << m.status();
    mapping.emplace(*std::move(m));
  }
  ASSERT_TRUE(peer->Send("exit").ok());
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;  // the creator is gone
  std::vector<uint64_t> page(kPage / 8);
  if (map_first) {
    ASSERT_EQ(cudaMemcpy(page.data(), mapping->base(), kPage, cudaMemcpyDeviceToHost), cudaSuccess);
  } else {
    absl::StatusOr<CudaArena> adopted = CudaArena::Adopt(0, chunks.at(0), std::move(fds));
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    ASSERT_EQ(cudaMemcpy(page.data(), adopted->base(), kPage, cudaMemcpyDeviceToHost), cudaSuccess);
    // What a restarted kvpoold does next: export the adopted chunks to its workers.
    EXPECT_EQ(adopted->ExportFds().value().size(), chunks.size());
  }
  for (uint64_t v : page) ASSERT_EQ(v, 0x5A5A00FF5A5A00FFull) << "the memory did not survive";
}

TEST_F(CudaArenaTest, ChunksOutliveTheirCreatorWhileAnotherProcessMapsThem) {
  ExpectChunksOutliveTheirCreator(/*map_first=*/true);
}

TEST_F(CudaArenaTest, ChunksOutliveTheirCreatorWhileAnotherProcessHoldsTheirFds) {
  ExpectChunksOutliveTheirCreator(/*map_first=*/false);
}

TEST_F(CudaArenaTest, AdoptRefusesChunksOfAnotherDevice) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "needs two GPUs";
  const uint64_t g = CudaArena::Granularity(0).value();
  CudaArena arena = CudaArena::Create(0, 8 * g, 8 * g, 8 * g).value();
  EXPECT_EQ(CudaArena::Adopt(1, 8 * g, arena.ExportFds().value()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaArenaTest, AnotherProcessOnTheSameGpuSeesOurWritesAndWeSeeItsWrites) {
  ExpectTwoProcessesShareTheArena(0);
}

// Label multigpu: a process on GPU 1 maps GPU 0's arena through peer access.
TEST_F(CudaArenaTest, AProcessOnAPeerGpuMapsTheArena) {
  int n = 0, can = 0;
  cudaGetDeviceCount(&n);
  if (n < 2) GTEST_SKIP() << "needs two GPUs";
  cudaDeviceCanAccessPeer(&can, 1, 0);
  if (!can) GTEST_SKIP() << "GPU 1 has no peer access to GPU 0";
  ExpectTwoProcessesShareTheArena(1);
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) return 2;
  kvp::g_child = argv[1];
  ::signal(SIGPIPE, SIG_IGN);
  return RUN_ALL_TESTS();
}
