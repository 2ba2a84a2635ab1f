// The fd channel and host arena across real processes (fork + exec of kvpool_arena_child, whose
// path is the first argument).
#include "kvpool/arena/fd_channel.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/arena/host_arena.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/lease_table.h"

namespace kvp {
namespace {

std::string g_child;
constexpr size_t kPage = 4096;

pid_t Spawn(std::vector<std::string> args) {
  args.insert(args.begin(), g_child);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(g_child.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string SocketPath(const std::string& name) {
  return absl::StrCat("/tmp/kvpool-test-", ::getpid(), "-", name, ".sock");
}

ArenaDescription Describe(const HostArena& arena) {
  ArenaDescription d;
  d.kind = ArenaKind::kHost;
  d.epoch = 42;
  d.chunk_bytes = arena.chunk_sizes();
  // As many blocks of the default spec as the arena holds.
  d.num_blocks = static_cast<int64_t>(d.total_bytes()) / BlockLayout::Create(d.spec)->block_stride();
  return d;
}

AllowList Me() { return AllowList{{::getuid()}, {}}; }

TEST(HostArenaTest, GrowsByChunksAtStableAddresses) {
  HostArena arena = HostArena::Create(1 << 20, 1 << 20, 8 << 20).value();
  uint8_t* base = arena.base();
  std::memset(base, 0x11, 1 << 20);
  ASSERT_TRUE(arena.GrowTo(3 << 20).ok());
  EXPECT_EQ(arena.base(), base);
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{3} << 20);
  EXPECT_EQ(arena.fds().size(), 3u);
  EXPECT_EQ(base[12345], 0x11);
  std::memset(base + (2 << 20), 0x22, 1 << 20);  // the new chunk is usable
  EXPECT_EQ(arena.GrowTo(9 << 20).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(HostArena::Create(1000, 0, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ArenaDescriptionTest, MoreBlocksThanTheChunksHoldAreRefused) {
  ArenaDescription d;
  d.chunk_bytes = {1 << 20};
  const int64_t fit = (1 << 20) / BlockLayout::Create(d.spec)->block_stride();
  auto decode = [](const ArenaDescription& a) {
    const std::string bytes = EncodeArenaDescription(a);
    return DecodeArenaDescription(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  };
  d.num_blocks = fit;
  EXPECT_TRUE(decode(d).ok());
  d.num_blocks = fit + 1;
  EXPECT_EQ(decode(d).status().code(), absl::StatusCode::kInvalidArgument);
  d.num_blocks = 1;
  d.chunk_bytes = {~uint64_t{0}, 2};  // sizes that wrap around
  EXPECT_EQ(decode(d).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArenaDescriptionTest, RoundTripsAndRejectsDamage) {
  ArenaDescription d;
  d.kind = ArenaKind::kCuda;
  d.epoch = 7;
  d.device = 1;
  d.chunk_bytes = {1 << 30, 1 << 30};
  d.num_blocks = 1234;
  d.spec.num_layers = 2;
  d.spec.indexer = true;
  d.spec.v_scales = {0.5f, 0.25f};
  const std::string bytes = EncodeArenaDescription(d);
  auto span = [](const std::string& s) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  const ArenaDescription back = DecodeArenaDescription(span(bytes)).value();
  EXPECT_EQ(back.kind, ArenaKind::kCuda);
  EXPECT_EQ(back.chunk_bytes, d.chunk_bytes);
  EXPECT_EQ(back.num_blocks, 1234);
  EXPECT_EQ(back.spec.v_scales, d.spec.v_scales);
  EXPECT_TRUE(back.spec.indexer);
  EXPECT_EQ(DecodeArenaDescription(span(bytes.substr(0, bytes.size() - 1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad = bytes;
  bad[0] ^= 1;
  EXPECT_EQ(DecodeArenaDescription(span(bad)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FdChannelTest, AChildProcessSeesTheParentsBytesAndTheParentSeesTheChilds) {
  HostArena arena = HostArena::Create(1 << 20, 2 << 20, 2 << 20).value();
  const uint64_t parent_pattern = 0x1122334455667788ull, child_pattern = 0x99AABBCCDDEEFF00ull;
  for (size_t i = 0; i < kPage; i += 8) std::memcpy(arena.base() + i, &parent_pattern, 8);
  FdChannelServer server = FdChannelServer::Listen(SocketPath("rw"), Me()).value();
  const pid_t child = Spawn({"read-write", server.path(), "1122334455667788", "99aabbccddeeff00"});
  FdPeer peer = server.Accept(5000).value();
  EXPECT_EQ(peer.credentials().pid, child);
  ASSERT_TRUE(peer.SendArena(Describe(arena), arena.fds()).ok());
  EXPECT_EQ(peer.Receive(5000).value(), "done");
  for (size_t i = 0; i < kPage; i += 8) {
    ASSERT_EQ(std::memcmp(arena.base() + 2 * kPage + i, &child_pattern, 8), 0) << i;
  }
  ASSERT_TRUE(peer.Send("bye").ok());
  EXPECT_EQ(Wait(child), 0);
}

TEST(FdChannelTest, APeerOffTheAllowListGetsAnErrorAndNoFds) {
  HostArena arena = HostArena::Create(1 << 20, 1 << 20, 1 << 20).value();
  AllowList others{{::getuid() + 4242}, {::getgid() + 4242}};
  FdChannelServer server = FdChannelServer::Listen(SocketPath("refuse"), others).value();
  const pid_t child = Spawn({"expect-refused", server.path()});
  const auto refused = server.Accept(5000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Wait(child), 0);
}

TEST(FdChannelTest, TheSocketIsPrivateToItsOwner) {
  FdChannelServer server = FdChannelServer::Listen(SocketPath("mode"), Me()).value();
  struct stat st;
  ASSERT_EQ(::stat(server.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(FdChannelTest, AKilledChildsReservationsComeBackWhenItsLeaseExpires) {
  HostArena arena = HostArena::Create(1 << 20, 1 << 20, 1 << 20).value();
  FdChannelServer server = FdChannelServer::Listen(SocketPath("kill"), Me()).value();
  FakeClock clock;
  LeaseTable leases(&clock, 3'000'000);
  BlockAllocator blocks(16);
  const pid_t child = Spawn({"heartbeat", server.path()});
  FdPeer peer = server.Accept(5000).value();
  ASSERT_TRUE(peer.SendArena(Describe(arena), arena.fds()).ok());
  const LeaseId lease = leases.Grant(absl::StrCat("pid ", peer.credentials().pid));
  // The child's reservations (as kvpoold makes them when it asks): 5 reserved, 2 committed.
  std::vector<BlockId> mine = blocks.Reserve(lease, 7).value();
  ASSERT_TRUE(blocks.Commit(lease, mine[0], std::nullopt).ok());
  ASSERT_TRUE(blocks.Commit(lease, mine[1], std::nullopt).ok());
  for (int beat = 0; beat < 5; ++beat) {
    ASSERT_EQ(peer.Receive(5000).value(), "H");
    clock.Advance(1'000'000);
    ASSERT_TRUE(leases.Renew(lease).ok());
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(Wait(child), -SIGKILL);
  // Drain what it sent before dying; then the channel reports it gone.
  absl::StatusOr<std::string> msg;
  do {
    msg = peer.Receive(5000);
  } while (msg.ok());
  EXPECT_EQ(msg.status().code(), absl::StatusCode::kUnavailable);
  // Until the lease expires the blocks stay its own: nothing is handed out twice.
  EXPECT_TRUE(leases.Expire().empty());
  EXPECT_EQ(blocks.counts().free, 16 - 7);
  clock.Advance(3'000'001);
  ASSERT_EQ(leases.Expire(), std::vector<LeaseId>{lease});
  EXPECT_EQ(blocks.ReleaseLease(lease), 7);
  EXPECT_EQ(blocks.counts().free, 16);
  EXPECT_TRUE(blocks.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: fd_channel_test PATH_TO_KVPOOL_ARENA_CHILD\n");
    return 2;
  }
  kvp::g_child = argv[1];
  ::signal(SIGPIPE, SIG_IGN);
  return RUN_ALL_TESTS();
}
