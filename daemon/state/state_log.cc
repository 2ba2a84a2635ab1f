#include "daemon/state/state_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <capnp/message.h>
#include <capnp/serialize-packed.h>
#include <capnp/serialize.h>
#include <kj/io.h>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/state/state.capnp.h"
#include "protocol/spec_codec.h"

namespace kvp {
namespace {

constexpr uint64_t kCompactFloorBytes = uint64_t{256} << 20;
constexpr uint64_t kCompactGrowth = 8;  // compact when the file is this many snapshots

// Records are packed (Cap'n Proto's zero-run encoding): tables, tails and digests are mostly
// small numbers and zeros, and a packed snapshot is a fraction of the flat one.
std::string Serialize(capnp::MessageBuilder& message) {
  kj::VectorOutputStream out;
  capnp::writePackedMessage(out, message);
  const kj::ArrayPtr<kj::byte> bytes = out.getArray();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// ---- Our types -> records ----

void DigestToWire(const TokenDigest& d, state::Digest::Builder out) {
  out.setLo(d.lo);
  out.setHi(d.hi);
}

TokenDigest DigestFromWire(state::Digest::Reader in) { return {in.getLo(), in.getHi()}; }

// `kept`, `kept_tail`: leading blocks and tail entries the record leaves as the previous record of
// this sequence had them.
void SequenceToWire(PoolIndex pool, SeqId id, const CommittedSequence& c,
                    state::Sequence::Builder out, size_t kept = 0, size_t kept_tail = 0) {
  const SequenceImage& s = c.image;
  out.setPool(pool);
  out.setId(id);
  out.setOwner(c.owner);
  out.setRoot(s.scope.root);
  out.setShared(s.scope.shared);
  out.setLength(s.length);
  out.setFullHash(s.full_hash);
  out.setKeptTail(static_cast<uint32_t>(kept_tail));
  auto tail = out.initTail(static_cast<unsigned>(s.tail.size() - kept_tail));
  for (unsigned i = 0; i < tail.size(); ++i) tail.set(i, s.tail[kept_tail + i]);
  auto digests = out.initTailDigests(static_cast<unsigned>(s.tail_digests.size() - kept_tail));
  for (unsigned i = 0; i < digests.size(); ++i) {
    DigestToWire(s.tail_digests[kept_tail + i], digests[i]);
  }
  out.setKeptBlocks(static_cast<uint32_t>(kept));
  auto blocks = out.initBlocks(static_cast<unsigned>(s.blocks.size() - kept));
  for (unsigned i = 0; i < blocks.size(); ++i) blocks.set(i, s.blocks[kept + i]);
}

CommittedSequence SequenceFromWire(state::Sequence::Reader in) {
  CommittedSequence c;
  c.owner = in.getOwner();
  SequenceImage& s = c.image;
  s.scope = {.root = in.getRoot(), .shared = in.getShared()};
  s.length = in.getLength();
  s.full_hash = in.getFullHash();
  for (int32_t t : in.getTail()) s.tail.push_back(t);
  for (auto d : in.getTailDigests()) s.tail_digests.push_back(DigestFromWire(d));
  for (int32_t b : in.getBlocks()) s.blocks.push_back(b);
  return c;
}

void IndexToWire(PoolIndex pool, BlockId block, const std::optional<PrefixKey>& key,
                 state::IndexEntry::Builder out) {
  out.setPool(pool);
  out.setBlock(block);
  out.setPresent(key.has_value());
  if (!key.has_value()) return;
  out.setHash(key->hash);
  out.setRoot(key->root);
  auto tokens = out.initTokens(static_cast<unsigned>(key->tokens.size()));
  for (unsigned i = 0; i < tokens.size(); ++i) tokens.set(i, key->tokens[i]);
  DigestToWire(key->content, out.initContent());
}

PrefixKey KeyFromWire(state::IndexEntry::Reader in) {
  PrefixKey key;
  key.hash = in.getHash();
  key.root = in.getRoot();
  for (int32_t t : in.getTokens()) key.tokens.push_back(t);
  key.content = DigestFromWire(in.getContent());
  return key;
}

void ReservationToWire(PoolIndex pool, BlockId block, bool present,
                       state::Reservation::Builder out) {
  out.setPool(pool);
  out.setBlock(block);
  out.setPresent(present);
}

// The leases of a batch: client leases granted, leases ended, worker leases granted.
void LeasesToWire(const std::vector<LeaseTable::ClientLease>& clients,
                  const std::vector<LeaseId>& ended,
                  const std::vector<LeaseTable::WorkerLease>& workers,
                  state::Batch::Builder batch) {
  auto leases = batch.initLeases(static_cast<unsigned>(clients.size() + ended.size()));
  unsigned i = 0;
  for (const LeaseTable::ClientLease& c : clients) {
    leases[i].setId(c.id);
    leases[i].setPresent(true);
    leases[i].setClient(c.client);
    leases[i++].setExpiryMicros(c.expiry_micros);
  }
  for (LeaseId id : ended) {
    leases[i].setId(id);
    leases[i++].setPresent(false);
  }
  auto w = batch.initWorkers(static_cast<unsigned>(workers.size()));
  for (unsigned j = 0; j < w.size(); ++j) {
    w[j].setLease(workers[j].id);
    w[j].setPresent(true);
    w[j].setPid(workers[j].pid);
  }
}

void HeaderToWire(const StateHeader& h, state::Header::Builder out) {
  out.setVersion(state::STATE_VERSION);
  PoolSpecToWire(h.spec, out.initSpec());
  out.setBlockStride(static_cast<uint64_t>(h.block_stride));
  auto pools = out.initPools(static_cast<unsigned>(h.pools.size()));
  for (unsigned i = 0; i < pools.size(); ++i) {
    const PoolIdentity& p = h.pools[i];
    pools[i].setId(p.id);
    pools[i].setGpu(p.gpu);
    pools[i].setNumBlocks(static_cast<uint32_t>(p.num_blocks));
    auto chunks = pools[i].initChunkBytes(static_cast<unsigned>(p.chunk_bytes.size()));
    for (unsigned c = 0; c < chunks.size(); ++c) chunks.set(c, p.chunk_bytes[c]);
  }
  out.setDigestKey(kj::arrayPtr(h.digest_key.data(), h.digest_key.size()));
  out.setArenaBytes(h.arena_bytes);
}

absl::StatusOr<StateHeader> HeaderFromWire(state::Header::Reader in) {
  if (in.getVersion() != state::STATE_VERSION) {
    return absl::DataLossError(absl::StrCat("the state file is of version ", in.getVersion(),
                                            "; this kvpoold reads version ",
                                            state::STATE_VERSION));
  }
  StateHeader h;
  ASSIGN_OR_RETURN(h.spec, PoolSpecFromWire(in.getSpec()));
  h.block_stride = static_cast<int64_t>(in.getBlockStride());
  h.arena_bytes = in.getArenaBytes();
  for (auto p : in.getPools()) {
    PoolIdentity id{.id = p.getId(),
                    .gpu = p.getGpu(),
                    .chunk_bytes = {},
                    .num_blocks = static_cast<int32_t>(p.getNumBlocks())};
    for (uint64_t c : p.getChunkBytes()) id.chunk_bytes.push_back(c);
    h.pools.push_back(std::move(id));
  }
  const auto key = in.getDigestKey();
  if (key.size() != h.digest_key.size() || h.pools.empty()) {
    return absl::DataLossError("the state file's header has no pools or no digest key");
  }
  std::copy(key.begin(), key.end(), h.digest_key.begin());
  return h;
}

// ---- Replay ----

struct PoolReplay {
  absl::flat_hash_map<SeqId, CommittedSequence> sequences;
  // Indexed blocks with the order they entered in: cached blocks are restored oldest first.
  absl::flat_hash_map<BlockId, std::pair<uint64_t, PrefixKey>> indexed;
  absl::flat_hash_set<BlockId> reserved;
};

struct Replay {
  std::vector<PoolReplay> pools;
  absl::flat_hash_map<LeaseId, LeaseTable::ClientLease> leases;
  absl::flat_hash_map<LeaseId, uint32_t> workers;
  LeaseId next_lease = 1;
  uint64_t order = 0;

  absl::Status Apply(state::Batch::Reader b) {
    const auto pool = [&](uint32_t p) -> absl::StatusOr<PoolReplay*> {
      if (p >= pools.size()) {
        return absl::DataLossError(absl::StrCat("a state record names pool ", p, " of ",
                                                pools.size()));
      }
      return &pools[p];
    };
    for (auto s : b.getSequences()) {
      ASSIGN_OR_RETURN(PoolReplay * p, pool(s.getPool()));
      CommittedSequence c = SequenceFromWire(s);
      const uint32_t kept = s.getKeptBlocks(), kept_tail = s.getKeptTail();
      if (kept > 0 || kept_tail > 0) {
        auto it = p->sequences.find(s.getId());
        if (it == p->sequences.end() || it->second.image.blocks.size() < kept ||
            it->second.image.tail.size() < kept_tail ||
            it->second.image.tail_digests.size() < kept_tail) {
          return absl::DataLossError(absl::StrCat("sequence ", s.getId(), " keeps ", kept,
                                                  " blocks and ", kept_tail,
                                                  " tail tokens of a record it does not have"));
        }
        const SequenceImage& was = it->second.image;
        c.image.blocks.insert(c.image.blocks.begin(), was.blocks.begin(), was.blocks.begin() + kept);
        c.image.tail.insert(c.image.tail.begin(), was.tail.begin(), was.tail.begin() + kept_tail);
        c.image.tail_digests.insert(c.image.tail_digests.begin(), was.tail_digests.begin(),
                                    was.tail_digests.begin() + kept_tail);
      }
      p->sequences[s.getId()] = std::move(c);
    }
    for (auto s : b.getDropped()) {
      ASSIGN_OR_RETURN(PoolReplay * p, pool(s.getPool()));
      p->sequences.erase(s.getId());
    }
    for (auto e : b.getIndex()) {
      ASSIGN_OR_RETURN(PoolReplay * p, pool(e.getPool()));
      if (e.getPresent()) {
        p->indexed[e.getBlock()] = {order++, KeyFromWire(e)};
      } else {
        p->indexed.erase(e.getBlock());
      }
    }
    for (auto r : b.getReservations()) {
      ASSIGN_OR_RETURN(PoolReplay * p, pool(r.getPool()));
      if (r.getPresent()) {
        p->reserved.insert(r.getBlock());
      } else {
        p->reserved.erase(r.getBlock());
      }
    }
    for (auto l : b.getLeases()) {
      if (l.getPresent()) {
        leases[l.getId()] = {l.getId(), l.getClient(), l.getExpiryMicros()};
      } else {
        leases.erase(l.getId());
        workers.erase(l.getId());
      }
    }
    for (auto w : b.getWorkers()) {
      if (w.getPresent()) {
        workers[w.getLease()] = w.getPid();
      } else {
        workers.erase(w.getLease());
      }
    }
    next_lease = std::max<LeaseId>(next_lease, b.getNextLease());
    return absl::OkStatus();
  }

  RecoveredState Finish(StateHeader header) && {
    RecoveredState r;
    for (PoolReplay& p : pools) {
      PoolImage image;
      image.sequences.reserve(p.sequences.size());
      for (auto& [id, c] : p.sequences) image.sequences.emplace_back(id, std::move(c));
      std::sort(image.sequences.begin(), image.sequences.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<std::pair<uint64_t, std::pair<BlockId, PrefixKey>>> by_order;
      by_order.reserve(p.indexed.size());
      for (auto& [block, entry] : p.indexed) {
        by_order.push_back({entry.first, {block, std::move(entry.second)}});
      }
      std::sort(by_order.begin(), by_order.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto& [o, entry] : by_order) image.indexed.push_back(std::move(entry));
      image.reserved.assign(p.reserved.begin(), p.reserved.end());
      std::sort(image.reserved.begin(), image.reserved.end());
      r.pools.push_back(std::move(image));
    }
    for (auto& [id, lease] : leases) r.leases.push_back(std::move(lease));
    std::sort(r.leases.begin(), r.leases.end(),
              [](const auto& a, const auto& b) { return a.id < b.id; });
    for (const auto& [id, pid] : workers) r.workers.push_back({id, pid});
    r.next_lease = next_lease;
    r.header = std::move(header);
    return r;
  }
};

// A record's payload as a message.
class RecordReader {
 public:
  explicit RecordReader(absl::string_view payload)
      : input_(kj::arrayPtr(reinterpret_cast<const kj::byte*>(payload.data()), payload.size())) {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = uint64_t{1} << 40;  // our own file, checksummed
    reader_.emplace(input_, options);
  }
  state::Record::Reader record() { return reader_->getRoot<state::Record>(); }

 private:
  kj::ArrayInputStream input_;
  std::optional<capnp::PackedMessageReader> reader_;
};

// Everything `pools` holds, as a snapshot batch; the pools' images it was made from.
std::vector<PoolImage> SnapshotToWire(const PoolSet& pools, state::Batch::Builder out) {
  std::vector<PoolImage> images;
  size_t sequences = 0, indexed = 0, reserved = 0;
  for (PoolIndex i = 0; i < pools.size(); ++i) {
    images.push_back(pools.pool(i).Capture());
    sequences += images.back().sequences.size();
    indexed += images.back().indexed.size();
    reserved += images.back().reserved.size();
  }
  auto seqs = out.initSequences(static_cast<unsigned>(sequences));
  auto index = out.initIndex(static_cast<unsigned>(indexed));
  auto reservations = out.initReservations(static_cast<unsigned>(reserved));
  unsigned s = 0, x = 0, r = 0;
  for (PoolIndex i = 0; i < images.size(); ++i) {
    for (const auto& [id, c] : images[i].sequences) SequenceToWire(i, id, c, seqs[s++]);
    for (const auto& [block, key] : images[i].indexed) IndexToWire(i, block, key, index[x++]);
    for (BlockId b : images[i].reserved) ReservationToWire(i, b, true, reservations[r++]);
  }
  LeasesToWire(pools.leases().ClientLeases(), {}, pools.leases().WorkerLeases(), out);
  out.setNextLease(pools.leases().next_id());
  return images;
}

}  // namespace

absl::StatusOr<RecoveredState> ReadStateLog(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kStateFileName);
  ASSIGN_OR_RETURN(RecordFileContents contents, ReadRecordFile(path));
  if (contents.records.size() < 2) {
    return absl::DataLossError(absl::StrCat(path, " has no header and snapshot"));
  }
  std::optional<StateHeader> header;
  Replay replay;
  for (size_t i = 0; i < contents.records.size(); ++i) {
    RecordReader reader(contents.records[i]);
    const state::Record::Reader record = reader.record();
    absl::Status applied = [&]() -> absl::Status {
      if (i == 0) {
        if (!record.isHeader()) return absl::DataLossError("the first record is not a header");
        ASSIGN_OR_RETURN(header, HeaderFromWire(record.getHeader()));
        replay.pools.resize(header->pools.size());
        return absl::OkStatus();
      }
      if (i == 1) {
        if (!record.isSnapshot()) return absl::DataLossError("the second record is no snapshot");
        return replay.Apply(record.getSnapshot());
      }
      if (!record.isBatch()) return absl::DataLossError("a record after the snapshot is no batch");
      return replay.Apply(record.getBatch());
    }();
    if (!applied.ok()) {
      return absl::DataLossError(absl::StrCat(path, ", record ", i, ": ", applied.message()));
    }
  }
  RecoveredState state = std::move(replay).Finish(*std::move(header));
  state.batches = contents.records.size() - 2;
  state.torn_bytes = contents.torn_bytes;
  state.valid_bytes = contents.valid_bytes;
  return state;
}

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Resume(const std::string& dir,
                                                           StateHeader header, PoolSet* pools,
                                                           uint64_t valid_bytes,
                                                           const std::vector<LeaseId>& ended) {
  std::unique_ptr<StateLog> log(
      new StateLog(absl::StrCat(dir, "/", kStateFileName), std::move(header), pools));
  pools->TrackChanges();
  pools->TakeChanges();  // the log has them
  ASSIGN_OR_RETURN(log->writer_, RecordWriter::Continue(log->path_, valid_bytes));
  log->snapshot_bytes_ = valid_bytes;
  capnp::MallocMessageBuilder message;
  state::Batch::Builder batch = message.initRoot<state::Record>().initBatch();
  LeasesToWire({}, ended, {}, batch);
  log->logged_next_lease_ = pools->leases().next_id();
  batch.setNextLease(log->logged_next_lease_);
  RETURN_IF_ERROR(log->writer_.Append(Serialize(message)));
  return log;
}

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Start(const std::string& dir,
                                                          StateHeader header, PoolSet* pools) {
  std::unique_ptr<StateLog> log(
      new StateLog(absl::StrCat(dir, "/", kStateFileName), std::move(header), pools));
  pools->TrackChanges();
  pools->TakeChanges();  // the snapshot has them
  RETURN_IF_ERROR(log->Compact());
  return log;
}

absl::Status StateLog::Compact() {
  capnp::MallocMessageBuilder header_message;
  HeaderToWire(header_, header_message.initRoot<state::Record>().initHeader());
  capnp::MallocMessageBuilder snapshot_message;
  const std::vector<PoolImage> images =
      SnapshotToWire(*pools_, snapshot_message.initRoot<state::Record>().initSnapshot());
  ASSIGN_OR_RETURN(writer_, RecordWriter::Replace(path_, {Serialize(header_message),
                                                          Serialize(snapshot_message)}));
  // Later records of these sequences may refer to the snapshot's tables.
  logged_.clear();
  for (PoolIndex i = 0; i < images.size(); ++i) {
    for (const auto& [seq, c] : images[i].sequences) logged_[{i, seq}] = LoggedOf(c);
  }
  snapshot_bytes_ = writer_.bytes();
  logged_next_lease_ = pools_->leases().next_id();
  return absl::OkStatus();
}

absl::Status StateLog::CompactIfLarge() {
  if (writer_.bytes() <= std::max(kCompactFloorBytes, kCompactGrowth * snapshot_bytes_)) {
    return absl::OkStatus();
  }
  const uint64_t before = writer_.bytes();
  RETURN_IF_ERROR(Compact());
  spdlog::info("state log compacted: {} -> {} bytes", before, writer_.bytes());
  return absl::OkStatus();
}

absl::Status StateLog::Flush() {
  PoolSet::Changes changes = pools_->TakeChanges();
  const LeaseId next_lease = pools_->leases().next_id();
  const bool pools_changed = std::any_of(changes.pools.begin(), changes.pools.end(),
                                         [](const PoolChanges& c) { return !c.empty(); });
  if (!pools_changed && changes.leases.empty() && next_lease == logged_next_lease_) {
    return absl::OkStatus();
  }
  capnp::MallocMessageBuilder message;
  state::Batch::Builder batch = message.initRoot<state::Record>().initBatch();
  // Counted first: Cap'n Proto lists are sized when they are made.
  size_t puts = 0, drops = 0, index = 0, reserved = 0;
  std::vector<std::vector<std::pair<SeqId, std::optional<CommittedSequence>>>> seqs(
      changes.pools.size());
  for (PoolIndex i = 0; i < changes.pools.size(); ++i) {
    const SequenceTable& table = pools_->pool(i).sequences();
    for (SeqId seq : changes.pools[i].sequences) {
      seqs[i].emplace_back(seq, table.Committed(seq));
      ++(seqs[i].back().second.has_value() ? puts : drops);
    }
    index += changes.pools[i].indexed.size();
    reserved += changes.pools[i].reserved.size();
  }
  auto put = batch.initSequences(static_cast<unsigned>(puts));
  auto dropped = batch.initDropped(static_cast<unsigned>(drops));
  auto entries = batch.initIndex(static_cast<unsigned>(index));
  auto reservations = batch.initReservations(static_cast<unsigned>(reserved));
  unsigned p = 0, d = 0, x = 0, r = 0;
  for (PoolIndex i = 0; i < changes.pools.size(); ++i) {
    const BlockAllocator& blocks = pools_->pool(i).blocks();
    for (const auto& [seq, committed] : seqs[i]) {
      if (committed.has_value()) {
        // The same life of the sequence: only its last logged block may have changed (a copy
        // on write), so the record starts there; the tail only grows until its block fills.
        Logged& logged = logged_[{i, seq}];
        const SequenceImage& image = committed->image;
        const bool same_life = logged.incarnation == committed->incarnation;
        const size_t kept = same_life && logged.blocks > 0
                                ? std::min(logged.blocks - 1, image.blocks.size())
                                : 0;
        const size_t kept_tail =
            same_life && logged.full_blocks == image.length / block_size_ &&
                    logged.tail <= image.tail.size()
                ? logged.tail
                : 0;
        SequenceToWire(i, seq, *committed, put[p++], kept, kept_tail);
        logged = LoggedOf(*committed);
      } else {
        logged_.erase({i, seq});
        dropped[d].setPool(i);
        dropped[d++].setId(seq);
      }
    }
    for (BlockId b : changes.pools[i].indexed) IndexToWire(i, b, blocks.PrefixOf(b), entries[x++]);
    for (BlockId b : changes.pools[i].reserved) {
      ReservationToWire(i, b, blocks.IsReserved(b), reservations[r++]);
    }
  }
  const LeaseTable& leases = pools_->leases();
  std::vector<LeaseTable::ClientLease> clients;
  std::vector<LeaseId> ended;
  std::vector<LeaseTable::WorkerLease> workers;
  for (LeaseId id : changes.leases) {
    if (auto c = leases.FindClientLease(id); c.has_value()) {
      clients.push_back(*std::move(c));
    } else if (auto w = leases.FindWorkerLease(id); w.has_value()) {
      workers.push_back(*w);
    } else {
      ended.push_back(id);
    }
  }
  LeasesToWire(clients, ended, workers, batch);
  batch.setNextLease(next_lease);
  RETURN_IF_ERROR(writer_.Append(Serialize(message)));
  logged_next_lease_ = next_lease;
  ++flushes_;
  return absl::OkStatus();
}

}  // namespace kvp
