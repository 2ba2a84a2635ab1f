// kvpoold's state log (daemon/state/): framing and checksums, and that replaying the log of any
// sequence of pool operations, cut after any record or inside one, restores exactly the state
// that record described.
#include "daemon/state/state_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "base/crc32c.h"
#include "daemon/recovery.h"
#include "daemon/state/record_file.h"
#include "gtest/gtest.h"

namespace kvp {
namespace {

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/kvpool-state-XXXXXX";
    path_ = ::mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Truncate(const std::string& path, uint64_t bytes) {
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(bytes)), 0);
}

TEST(Crc32cTest, IsTheCastagnoliChecksum) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  const std::string text = "the quick brown fox jumps over the lazy dog, twice over";
  EXPECT_EQ(Crc32c(text), Crc32c(text.substr(13), Crc32c(text.substr(0, 13))));
}

TEST(RecordFileTest, ATornOrCorruptTailIsDroppedAndReported) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  auto w = RecordWriter::Replace(path, {"header", "snapshot"});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Append("one").ok());
  ASSERT_TRUE(w->Append(std::string(1000, 'x')).ok());
  auto all = ReadRecordFile(path);
  ASSERT_TRUE(all.ok());
  const std::vector<std::string> records(all->records.begin(), all->records.end());
  EXPECT_EQ(records, (std::vector<std::string>{"header", "snapshot", "one",
                                               std::string(1000, 'x')}));
  EXPECT_EQ(all->torn_bytes, 0u);
  EXPECT_EQ(all->valid_bytes, w->bytes());

  Truncate(path, w->bytes() - 3);  // the last record cut short
  auto cut = ReadRecordFile(path);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->records.size(), 3u);
  EXPECT_EQ(cut->torn_bytes, 8 + 1000 - 3u);

  // A flipped byte inside the third record: it and what follows are dropped.
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const off_t third = static_cast<off_t>(kRecordFileMagic.size() + 8 + 6 + 8 + 8 + 8);
  ASSERT_EQ(::pwrite(fd, "X", 1, third), 1);
  ::close(fd);
  auto corrupt = ReadRecordFile(path);
  ASSERT_TRUE(corrupt.ok());
  EXPECT_EQ(corrupt->records.size(), 2u);

  ASSERT_TRUE(RecordWriter::Replace(path, {}).ok());
  ASSERT_EQ(::truncate(path.c_str(), 3), 0);
  EXPECT_EQ(ReadRecordFile(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadRecordFile(dir.path() + "/none").status().code(), absl::StatusCode::kNotFound);
}

PoolSpec Spec() {
  PoolSpec spec;
  spec.num_layers = 2;
  spec.block_size = 16;
  return spec;
}

// Everything a restore must reproduce, in a comparable form.
struct Canonical {
  std::vector<std::string> pools;
  std::vector<std::string> leases;
  friend bool operator==(const Canonical&, const Canonical&) = default;
};

std::string Describe(const PoolImage& image) {
  std::string out;
  for (const auto& [seq, c] : image.sequences) {
    absl::StrAppend(&out, "seq ", seq, " owner ", c.owner, " root ", c.image.scope.root, " len ",
                    c.image.length, " hash ", c.image.full_hash, " blocks");
    for (BlockId b : c.image.blocks) absl::StrAppend(&out, " ", b);
    absl::StrAppend(&out, " tail");
    for (int32_t t : c.image.tail) absl::StrAppend(&out, " ", t);
    absl::StrAppend(&out, "\n");
  }
  std::vector<std::pair<BlockId, PrefixKey>> indexed = image.indexed;
  std::sort(indexed.begin(), indexed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [b, key] : indexed) {
    absl::StrAppend(&out, "indexed ", b, " ", key.hash, " ", key.root, " ", key.tokens.size(),
                    " ", key.content.lo, "\n");
  }
  for (BlockId b : image.reserved) absl::StrAppend(&out, "reserved ", b, "\n");
  return out;
}

Canonical Capture(const PoolSet& pools) {
  Canonical c;
  for (PoolIndex i = 0; i < pools.size(); ++i) c.pools.push_back(Describe(pools.pool(i).Capture()));
  for (const auto& l : pools.leases().ClientLeases()) {
    c.leases.push_back(absl::StrCat(l.id, " ", l.client, " ", l.expiry_micros));
  }
  return c;
}

// Random pool operations of a few clients, as the broker makes them: prefills with shared
// prefixes, appends left pending (reservations), commits, aborts, forks, releases, migrations
// and lease ends.
class Driver {
 public:
  Driver(PoolSet* pools, uint64_t seed) : pools_(pools), rng_(seed) {}

  void Step() {
    if (clients_.empty() || rng_() % 10 == 0) {
      clients_.push_back(pools_->leases().GrantClient(absl::StrCat("c", rng_() % 1000), 30'000'000));
    }
    const LeaseId lease = clients_[rng_() % clients_.size()];
    const PoolIndex p = static_cast<PoolIndex>(rng_() % pools_->size());
    SequenceTable& t = pools_->pool(p).sequences();
    std::vector<SeqId> mine;  // sorted: hash map order differs from run to run
    for (SeqId s : t.Ids()) {
      if (t.Owner(s).value() == lease && !t.Importing(s)) mine.push_back(s);
    }
    std::sort(mine.begin(), mine.end());
    const SeqId any = mine.empty() ? 0 : mine[rng_() % mine.size()];
    switch (rng_() % 8) {
      case 0:
      case 1: {  // a new sequence: tokens from a small alphabet, so prefixes repeat
        std::vector<int32_t> tokens(1 + rng_() % 50);
        for (auto& x : tokens) x = static_cast<int32_t>(rng_() % 2);
        const SeqId seq = next_++;
        if (pools_->Home(seq).has_value()) return;
        if (t.Append(seq, lease, tokens).ok() && rng_() % 4 != 0) (void)t.Commit(seq);
        return;
      }
      case 2:  // an append, left pending or committed
        if (any != 0 && !t.HasPending(any).value()) {
          std::vector<int32_t> tokens(1 + rng_() % 20, 1);
          if (t.Append(any, lease, tokens).ok() && rng_() % 3 != 0) (void)t.Commit(any);
        }
        return;
      case 3:  // a pending append ends
        if (any != 0 && t.HasPending(any).value()) {
          (void)(rng_() % 2 == 0 ? t.Commit(any) : t.Abort(any));
        }
        return;
      case 4:
        if (any != 0) (void)t.Fork(any, next_++, lease);
        return;
      case 5:
        if (any != 0) (void)t.Release(any);
        return;
      case 6: {  // a migration to the other pool, committed or not
        if (any == 0 || pools_->size() < 2) return;
        absl::StatusOr<SequenceImage> image = t.Image(any);
        if (!image.ok()) return;
        SequenceTable& to = pools_->pool((p + 1) % pools_->size()).sequences();
        if (!to.Import(any, lease, *image).ok()) return;
        if (rng_() % 3 == 0) {
          (void)to.Abort(any);
        } else if (to.Commit(any).ok()) {
          (void)t.Release(any);
        }
        return;
      }
      default:
        if (rng_() % 4 == 0 && clients_.size() > 1) {  // a client's lease ends
          pools_->leases().Revoke(lease);
          pools_->ForgetLease(lease);
          std::erase(clients_, lease);
        }
        return;
    }
  }

 private:
  PoolSet* pools_;
  std::mt19937_64 rng_;
  std::vector<LeaseId> clients_;
  SeqId next_ = 1;
};

StateHeader Header(const PoolSet& pools) {
  StateHeader h;
  h.spec = Spec();
  h.block_stride = pools.layout().block_stride();
  for (PoolIndex i = 0; i < pools.size(); ++i) {
    h.pools.push_back({.id = 100 + i, .gpu = -1, .chunk_bytes = {1 << 20},
                       .num_blocks = pools.pool(i).blocks().num_blocks()});
  }
  h.digest_key.fill(7);
  h.arena_bytes = 1 << 20;
  return h;
}

TEST(StateLogTest, EveryPrefixOfTheLogRestoresTheStateItDescribes) {
  TempDir dir;
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 48 * stride, 2, &clock, 3'000'000).value();
  auto log = StateLog::Start(dir.path(), Header(*pools), pools.get());
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<std::pair<uint64_t, Canonical>> points = {{(*log)->file_bytes(), Capture(*pools)}};
  Driver driver(pools.get(), 33);
  for (int step = 0; step < 400; ++step) {
    driver.Step();
    ASSERT_TRUE((*log)->Flush().ok());
    ASSERT_TRUE(pools->CheckInvariants().ok());
    if ((*log)->file_bytes() != points.back().first) {
      points.emplace_back((*log)->file_bytes(), Capture(*pools));
    }
  }
  ASSERT_GT(points.size(), 200u);
  const std::string path = dir.path() + "/" + kStateFileName;
  const std::string full = [&] {
    std::string s(points.back().first, '\0');
    const int fd = ::open(path.c_str(), O_RDONLY);
    EXPECT_EQ(::read(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
    ::close(fd);
    return s;
  }();
  for (size_t k = 0; k < points.size(); k += (k < 20 ? 1 : 7)) {
    for (const uint64_t cut : {points[k].first, k + 1 < points.size() ? points[k + 1].first - 5 : 0}) {
      if (cut == 0) continue;
      SCOPED_TRACE(absl::StrCat("log cut after ", cut, " bytes (record ", k, ")"));
      {
        const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
        ASSERT_EQ(::write(fd, full.data(), cut), static_cast<ssize_t>(cut));
        ::close(fd);
      }
      absl::StatusOr<RecoveredState> state = ReadStateLog(dir.path());
      ASSERT_TRUE(state.ok()) << state.status();
      EXPECT_EQ(state->torn_bytes, cut == points[k].first ? 0u : cut - points[k].first);
      auto restored = PoolSet::Create(Spec(), 48 * stride, 2, &clock, 3'000'000).value();
      absl::StatusOr<RestoredPools> r = RestorePools(*std::move(state), *restored, 0, 1'000'000);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(restored->CheckInvariants().ok()) << restored->CheckInvariants();
      const Canonical got = Capture(*restored);
      EXPECT_EQ(got.pools, points[k].second.pools);
      // The restore adds the quarantine lease; client leases are the logged ones.
      EXPECT_EQ(got.leases, points[k].second.leases);
      // Reserved blocks are quarantined until the quarantine ends; then nothing is reserved.
      if (r->quarantine != 0) {
        restored->leases().Revoke(r->quarantine);
        restored->ForgetLease(r->quarantine);
      }
      EXPECT_EQ(restored->counts().reserved, 0);
      ASSERT_TRUE(restored->CheckInvariants().ok());
    }
  }
}

TEST(StateLogTest, AResumedLogGoesOnWhereTheTornTailWas) {
  TempDir dir;
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 16 * stride, 1, &clock, 3'000'000).value();
  const LeaseId lease = pools->leases().GrantClient("c", 1000);
  SequenceTable& t = pools->pool(0).sequences();
  auto log = StateLog::Start(dir.path(), Header(*pools), pools.get()).value();
  ASSERT_TRUE(t.Append(1, lease, std::vector<int32_t>(40, 1)).ok());
  ASSERT_TRUE(t.Commit(1).ok());
  ASSERT_TRUE(log->Flush().ok());
  const uint64_t whole = log->file_bytes();
  ASSERT_TRUE(t.Append(2, lease, std::vector<int32_t>(20, 2)).ok());
  ASSERT_TRUE(t.Commit(2).ok());
  ASSERT_TRUE(log->Flush().ok());
  log.reset();
  Truncate(dir.path() + "/" + kStateFileName, whole + 6);  // the second batch torn
  absl::StatusOr<RecoveredState> state = ReadStateLog(dir.path());
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->valid_bytes, whole);
  auto restored = PoolSet::Create(Spec(), 16 * stride, 1, &clock, 3'000'000).value();
  const uint64_t valid = state->valid_bytes;
  RestoredPools r = RestorePools(*std::move(state), *restored, 0, 0).value();
  EXPECT_EQ(r.sequences, 1u);
  auto resumed = StateLog::Resume(dir.path(), Header(*restored), restored.get(), valid, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  SequenceTable& t2 = restored->pool(0).sequences();
  ASSERT_TRUE(t2.Append(3, lease, std::vector<int32_t>(10, 3)).ok());
  ASSERT_TRUE(t2.Commit(3).ok());
  ASSERT_TRUE((*resumed)->Flush().ok());
  absl::StatusOr<RecoveredState> again = ReadStateLog(dir.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->torn_bytes, 0u);
  ASSERT_EQ(again->pools[0].sequences.size(), 2u);
  EXPECT_EQ(again->pools[0].sequences[0].first, 1u);
  EXPECT_EQ(again->pools[0].sequences[1].first, 3u);
}

TEST(StateLogTest, AnInconsistentLogRestoresNothing) {
  TempDir dir;
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 8 * stride, 1, &clock, 3'000'000).value();
  const LeaseId lease = pools->leases().GrantClient("c", 1000);
  SequenceTable& t = pools->pool(0).sequences();
  ASSERT_TRUE(t.Append(1, lease, std::vector<int32_t>(40, 1)).ok());
  ASSERT_TRUE(t.Commit(1).ok());
  auto log = StateLog::Start(dir.path(), Header(*pools), pools.get());
  ASSERT_TRUE(log.ok());
  absl::StatusOr<RecoveredState> state = ReadStateLog(dir.path());
  ASSERT_TRUE(state.ok());
  state->pools[0].sequences[0].second.image.blocks[0] = 1000;  // past the pool's end
  auto restored = PoolSet::Create(Spec(), 8 * stride, 1, &clock, 3'000'000).value();
  EXPECT_EQ(RestorePools(*std::move(state), *restored, 0, 0).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(restored->num_sequences(), 0u);
  EXPECT_TRUE(restored->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvp
