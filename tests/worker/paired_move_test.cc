// Paired moves on the worker (worker/migration.h, worker/socket_transport.h): both sides cut the
// same pieces, bad links are refused before anything moves, and the socket transport moves bytes
// exactly, closes connections without the link's token, and gives up at the link's deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <numeric>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/framing.h"
#include "worker/migration.h"
#include "worker/socket_transport.h"

namespace kvp {
namespace {

using ::testing::ElementsAre;

TEST(PiecesOfTest, RunsAreCutWhereEitherSidesChunkEnds) {
  // Blocks of 100 bytes; source chunks of 250, target chunks of 300. Blocks 1..4 onto 0..3 are one
  // run of 400 bytes from offset 100 to 0: cut at source 250 and 500, target 300.
  const std::vector<MovePiece> pieces = PiecesOf({{1, 0}, {2, 1}, {3, 2}, {4, 3}}, 100, 250, 300);
  EXPECT_THAT(pieces, ElementsAre(MovePiece{100, 0, 150}, MovePiece{250, 150, 150},
                                  MovePiece{400, 300, 100}));
  // A fragmented table: one piece per run, in move order.
  EXPECT_THAT(PiecesOf({{5, 0}, {2, 1}, {3, 2}}, 100, 1000, 1000),
              ElementsAre(MovePiece{500, 0, 100}, MovePiece{200, 100, 200}));
}

capnp::Data::Reader Data(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

// A paired migrate job of `moves`, side and link as given.
EnvelopeBuilder PairedJob(wire::TransferSide side, bool fresh, const std::string& rendezvous,
                          uint32_t deadline_ms) {
  EnvelopeBuilder m(1);
  auto j = m.envelope().getBody().initMigrateJob();
  j.setJob(1);
  j.setTransport(wire::Transport::SOCKET);
  auto moves = j.initMoves(1);
  moves[0].setSource(1);
  moves[0].setTarget(2);
  auto link = j.initLink();
  link.setSide(side);
  link.setFresh(fresh);
  link.setRendezvous(Data(rendezvous));
  link.setDeadlineMillis(deadline_ms);
  link.setSourceChunkBytes(1 << 20);
  link.setTargetChunkBytes(1 << 20);
  return m;
}

TEST(MigrateWorkTest, PairedJobsNeedASoundLink) {
  JobContext ctx;
  ctx.num_blocks = 8;
  const auto decode = [&](const EnvelopeBuilder& m) {
    return MigrateWorkFromWire(m.reader().getBody().getMigrateJob(), ctx).status();
  };
  EXPECT_TRUE(decode(PairedJob(wire::TransferSide::RECEIVE, true, "", 1000)).ok());
  EXPECT_TRUE(decode(PairedJob(wire::TransferSide::SEND, false, "", 1000)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(decode(PairedJob(wire::TransferSide::SEND, true, "", 1000))))
      << "a fresh link's sender needs the rendezvous";
  EXPECT_TRUE(absl::IsInvalidArgument(decode(PairedJob(wire::TransferSide::RECEIVE, true, "", 0))));
  EnvelopeBuilder no_link = PairedJob(wire::TransferSide::RECEIVE, true, "", 1000);
  no_link.envelope().getBody().getMigrateJob().disownLink();
  EXPECT_TRUE(absl::IsInvalidArgument(decode(no_link)));
}

constexpr int64_t kStride = 4096;
constexpr int64_t kBlocks = 16;

struct Arenas {
  std::vector<uint8_t> source, target;
  Arenas() : source(kStride * kBlocks), target(kStride * kBlocks, 0) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  OwnArena Source() { return {.base = source.data(), .num_blocks = kBlocks, .block_stride = kStride}; }
  OwnArena Target() { return {.base = target.data(), .num_blocks = kBlocks, .block_stride = kStride}; }
};

MigrateWork Work(wire::TransferSide side, const std::string& rendezvous, int deadline_ms,
                 const std::string& token = "secret-token") {
  MigrateWork w;
  w.transport = wire::Transport::SOCKET;
  w.moves = {{3, 0}, {4, 1}, {9, 7}, {1, 15}};
  LinkWork link;
  link.side = side;
  link.id = 42;
  link.rendezvous = rendezvous;
  link.token = token;
  link.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  link.source_chunk_bytes = 3 * kStride;  // cuts the run 3..4 onto 0..1
  link.target_chunk_bytes = 8 * kStride;
  w.link = link;
  return w;
}

// Connects to host:port and writes `bytes`, then closes: a stranger, or a sender that dies.
void Stranger(const std::string& endpoint, const std::string& bytes) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &address.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

void ExpectMoved(const Arenas& a, const MigrateWork& w) {
  for (const auto& [source, target] : w.moves) {
    EXPECT_TRUE(std::equal(a.source.begin() + source * kStride,
                           a.source.begin() + (source + 1) * kStride,
                           a.target.begin() + target * kStride))
        << "block " << source << " onto " << target;
  }
}

TEST(SocketTransportTest, MovesExactlyAndClosesConnectionsWithoutTheToken) {
  Arenas a;
  SocketTransport receiver(a.Target(), {}), sender(a.Source(), {});
  const MigrateWork receive = Work(wire::TransferSide::RECEIVE, "", 5000);
  absl::StatusOr<std::string> endpoint = receiver.Open(receive);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_THAT(*endpoint, ::testing::StartsWith("127.0.0.1:"));
  absl::Status received;
  std::thread waiting([&] { received = receiver.Receive(receive); });
  Stranger(*endpoint, std::string(64, 'x'));  // not a kvpool stream
  // A sender with the wrong token is refused before a byte lands.
  SocketTransport impostor(a.Source(), {});
  const absl::Status refused = impostor.Send(Work(wire::TransferSide::SEND, *endpoint, 300, "wrong"));
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(std::all_of(a.target.begin(), a.target.end(), [](uint8_t b) { return b == 0; }));
  const absl::Status sent = sender.Send(Work(wire::TransferSide::SEND, *endpoint, 5000));
  waiting.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received;
  ExpectMoved(a, receive);
}

TEST(SocketTransportTest, APeerThatConnectsAndSendsNothingHoldsTheReceiverOnlyBriefly) {
  Arenas a;
  SocketTransport receiver(a.Target(), {.header_timeout = std::chrono::milliseconds(200)});
  SocketTransport sender(a.Source(), {});
  const MigrateWork receive = Work(wire::TransferSide::RECEIVE, "", 3000);
  absl::StatusOr<std::string> endpoint = receiver.Open(receive);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  absl::Status received;
  std::thread waiting([&] { received = receiver.Receive(receive); });
  // Two silent connections, kept open past the link's deadline, then the sender.
  std::vector<int> silent;
  const size_t colon = endpoint->rfind(':');
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint->substr(colon + 1))));
  ::inet_pton(AF_INET, endpoint->substr(0, colon).c_str(), &address.sin_addr);
  for (int i = 0; i < 2; ++i) {
    silent.push_back(::socket(AF_INET, SOCK_STREAM, 0));
    ASSERT_EQ(::connect(silent.back(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  }
  const absl::Status sent = sender.Send(Work(wire::TransferSide::SEND, *endpoint, 3000));
  waiting.join();
  for (int fd : silent) ::close(fd);
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received;
  ExpectMoved(a, receive);
}

TEST(SocketTransportTest, APacedSenderStillMovesEverything) {
  Arenas a;
  SocketTransport receiver(a.Target(), {});
  SocketTransport sender(a.Source(), {.max_bytes_per_second = 1 << 20});
  const MigrateWork receive = Work(wire::TransferSide::RECEIVE, "", 5000);
  absl::StatusOr<std::string> endpoint = receiver.Open(receive);
  ASSERT_TRUE(endpoint.ok());
  absl::Status received;
  std::thread waiting([&] { received = receiver.Receive(receive); });
  const absl::Status sent = sender.Send(Work(wire::TransferSide::SEND, *endpoint, 5000));
  waiting.join();
  ASSERT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(received.ok()) << received;
  ExpectMoved(a, receive);
}

TEST(SocketTransportTest, TheReceiverGivesUpAtTheDeadlineOrWhenTheSenderDies) {
  Arenas a;
  SocketTransport receiver(a.Target(), {});
  MigrateWork receive = Work(wire::TransferSide::RECEIVE, "", 200);
  ASSERT_TRUE(receiver.Open(receive).ok());
  const absl::Status nobody = receiver.Receive(receive);
  EXPECT_TRUE(absl::IsDeadlineExceeded(nobody)) << nobody;

  EXPECT_TRUE(absl::IsFailedPrecondition(receiver.Receive(receive)))
      << "socket links are opened for one move";

  // A sender that dies after its header: the receiver sees the connection close.
  receive = Work(wire::TransferSide::RECEIVE, "", 5000);
  absl::StatusOr<std::string> endpoint = receiver.Open(receive);
  ASSERT_TRUE(endpoint.ok());
  absl::Status received;
  std::thread waiting([&] { received = receiver.Receive(receive); });
  struct {
    uint32_t magic = 0x4d50564b, version = 1;
    uint64_t link = 42;
    uint32_t token_bytes = 12, pieces = 3;  // PiecesOf: runs 3..4, 9 and 1
    uint64_t bytes = 4 * kStride;
  } header;
  std::string stream(reinterpret_cast<const char*>(&header), sizeof(header));
  stream += "secret-token";
  stream += std::string(1000, 'z');  // then it dies
  Stranger(*endpoint, stream);
  waiting.join();
  EXPECT_TRUE(absl::IsUnavailable(received)) << received;
}

TEST(SocketTransportTest, ASenderWithoutAReceiverFailsCleanly) {
  Arenas a;
  SocketTransport sender(a.Source(), {});
  EXPECT_TRUE(absl::IsUnavailable(sender.Send(Work(wire::TransferSide::SEND, "127.0.0.1:1", 500))));
  EXPECT_TRUE(absl::IsInvalidArgument(sender.Send(Work(wire::TransferSide::SEND, "nowhere", 500))));
}

}  // namespace
}  // namespace kvp
