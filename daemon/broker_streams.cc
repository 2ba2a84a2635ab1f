// The Broker's sliced prefills and streams (daemon/broker.h, docs/design.md §6): while a sequence
// decoded on another pool is still being written (the later slices of one prefill, or an
// engine's later prefills of it, `continued`), the blocks that are full are staged on the decode
// pool and copied there by stream moves; the final move's Import takes the staged copies, so only
// what was not streamed is left when the last write ends. A block is streamed only once it is
// full: the blocks of one life of a sequence are never written again, apart from its partial last
// block.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/broker.h"  // the class whose members these are
#include "protocol/activations_codec.h"
#include "protocol/transport_names.h"

namespace kvp {
namespace {

std::vector<BlockMove> MovesOf(wire::MigrateJob::Reader job) {
  std::vector<BlockMove> moves;
  moves.reserve(job.getMoves().size());
  for (auto m : job.getMoves()) moves.push_back({.source = m.getSource(), .target = m.getTarget()});
  return moves;
}

}  // namespace

std::optional<Broker::PrefillSlices> Broker::SlicesFor(int32_t chunk_tokens,
                                                       uint32_t count) const {
  const int64_t size = chunk_tokens < 0 ? options_.prefill_chunk_tokens : chunk_tokens;
  if (size <= 0 || count <= size) return std::nullopt;
  PrefillSlices slices;
  slices.size = static_cast<uint32_t>(size);
  return slices;
}

EnvelopeBuilder Broker::PrefillSlice(const EnvelopeBuilder& whole, uint32_t begin, uint32_t end) {
  const auto all = whole.reader().getBody().getPrefillJob();
  end = std::min(end, all.getTokens().size());
  EnvelopeBuilder message(whole.request_id());
  auto job = message.envelope().getBody().initPrefillJob();
  job.setJob(all.getJob());
  job.setSequence(all.getSequence());
  job.setFirstPosition(all.getFirstPosition() + begin);
  auto tokens = job.initTokens(end - begin);
  auto slots = job.initSlotMapping(end - begin);
  for (uint32_t i = begin; i < end; ++i) {
    tokens.set(i - begin, all.getTokens()[i]);
    slots.set(i - begin, all.getSlotMapping()[i]);
  }
  // The copy-on-write of the partial last block goes before its first write: in the first slice.
  if (begin == 0) job.setCopies(all.getCopies());
  if (all.hasActivations()) {
    CopyActivationRows(all.getActivations(), begin, end - begin, job.initActivations());
  }
  return message;
}

bool Broker::ContinueSlices(JobId id, const absl::Status& result, Outbox& out) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || !it->second.slices.has_value() || it->second.client_gone ||
      it->second.parked.has_value() || !result.ok()) {
    return false;
  }
  Job& job = it->second;
  PrefillSlices& s = *job.slices;
  const uint32_t total = s.whole.reader().getBody().getPrefillJob().getTokens().size();
  s.written = std::min(s.written + s.size, total);
  if (s.written >= total) return false;  // the last slice: the prefill ends
  if (auto w = workers_.find(job.worker); w != workers_.end()) w->second.job.reset();
  job.worker = 0;
  job.message = PrefillSlice(s.whole, s.written, s.written + s.size);
  job.attempts = 0;
  queues_[static_cast<int>(JobKind::kPrefill)].push_front(id);  // it goes on first
  const SeqId seq = job.sequences.front();
  StreamBlocks(seq, out);  // may add jobs: `job` is not used after it
  Dispatch(out);
  return true;
}

absl::Status Broker::CheckStreamTarget(SeqId seq, LeaseId lease,
                                       std::optional<PoolIndex> decode_pool) const {
  auto it = streams_.find(seq);
  if (it == streams_.end() || it->second.dropped || it->second.lease != lease) {
    return absl::OkStatus();  // another client's sequence: its own checks answer
  }
  if (decode_pool == it->second.to) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "sequence ", seq, " streams to pool ", it->second.to, " (a continued prefill): its "
      "prefills name that decode pool until the last one"));
}

Broker::Stream* Broker::StreamFor(SeqId seq, PoolIndex from, PoolIndex to, LeaseId lease) {
  if (auto it = streams_.find(seq); it != streams_.end()) {
    if (it->second.dropped || it->second.to != to) return nullptr;  // an earlier life's
    return &it->second;
  }
  const absl::StatusOr<wire::Transport> transport = ChooseTransport(from, to);
  if (!transport.ok()) return nullptr;  // the final move says why
  Stream& stream = streams_[seq];
  stream.to = to;
  stream.transport = *transport;
  stream.lease = lease;
  return &stream;
}

bool Broker::ParkBehindStream(JobId id, const absl::Status& result) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  Job& job = it->second;
  if (job.kind != JobKind::kPrefill || !job.then_migrate_to.has_value() || job.client_gone ||
      job.parked.has_value()) {
    return false;
  }
  job.written_micros = clock_->NowMicros();
  const SeqId seq = job.sequences.front();
  auto stream = streams_.find(seq);
  if (stream == streams_.end() || !stream->second.moving.has_value() ||
      stream->second.lease != job.client_lease) {
    return false;  // nothing moving of this client's: its final move starts now
  }
  Stream& s = stream->second;
  Job& move = jobs_.at(*s.moving);
  if (move.worker == 0) {
    // Still queued (no worker free for it): the final move copies its blocks instead.
    for (auto& queue : queues_) std::erase(queue, *s.moving);
    pools_->pool(s.to).sequences().Unstage(
        seq, MovesOf(move.message.reader().getBody().getMigrateJob()));
    jobs_.erase(*s.moving);
    s.moving.reset();
    s.stopped = true;
    if (s.dropped) EndStream(seq);
    return false;
  }
  // Running: the end waits for it, the sequence stays busy and the staged blocks stay put.
  if (auto w = workers_.find(job.worker); w != workers_.end()) w->second.job.reset();
  job.worker = 0;
  job.parked = result;
  s.waiting = id;
  return true;
}

void Broker::StreamBlocks(SeqId seq, Outbox& out) {
  auto it = streams_.find(seq);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  if (s.moving.has_value() || s.stopped || s.dropped || s.waiting.has_value()) return;
  const absl::StatusOr<PoolIndex> home = HomeOf(seq);
  if (!home.ok()) return;
  Pool& source = pools_->pool(*home);
  Pool& target = pools_->pool(s.to);
  const absl::StatusOr<absl::Span<const BlockId>> table = source.sequences().Blocks(seq);
  if (!table.ok()) return;
  // Positions written: the committed ones, and those of a sliced prefill's reported slices.
  int64_t written = source.sequences().Length(seq).value_or(0);
  if (auto busy = busy_.find(seq); busy != busy_.end()) {
    const Job& job = jobs_.at(busy->second);
    if (job.slices.has_value()) {
      written = static_cast<int64_t>(
          job.slices->whole.reader().getBody().getPrefillJob().getFirstPosition() +
          job.slices->written);
    }
  }
  const size_t full =
      std::min<size_t>(written / pools_->layout().spec().block_size, table->size());
  std::vector<BlockId> sources;
  for (size_t i = s.next_block; i < full; ++i) {
    const BlockId b = (*table)[i];
    const std::optional<PrefixKey> key = source.blocks().PrefixOf(b);
    if (key.has_value() && target.blocks().FindPrefix(*key).has_value()) continue;  // held there
    sources.push_back(b);
  }
  s.next_block = std::max(s.next_block, full);
  if (sources.empty()) return;
  absl::StatusOr<std::vector<BlockMove>> moves = target.sequences().Stage(seq, s.lease, sources);
  if (!moves.ok()) {
    // No room to stage them: the final move copies them (or says why it cannot).
    spdlog::info("sequence {}: streaming {} blocks to pool {} stops: {}", seq, sources.size(),
                 s.to, moves.status().ToString());
    s.stopped = true;
    return;
  }
  if (moves->empty()) return;
  const int64_t now = clock_->NowMicros();
  const JobId move_id = next_job_++;
  s.moving = move_id;
  Job move{.kind = JobKind::kMigrate,
           .pool = s.to,
           .client = "",
           .request_id = 0,
           .client_lease = s.lease,
           .sequences = {},  // the sequence may be written (and decoded) meanwhile
           .message = MigrateJobMessage(move_id, seq, *home, s.transport, *moves),
           .submitted_micros = now,
           .migration = Migration{.from = *home,
                                  .to = s.to,
                                  .transport = s.transport,
                                  .blocks_moved = static_cast<uint32_t>(moves->size()),
                                  .started_micros = now},
           .stream_of = seq};
  Enqueue(std::move(move), out);  // `s` may move: not used after this
}

void Broker::EndStreamMove(const Job& move, const absl::Status& result, uint64_t bytes,
                           Outbox& out) {
  const auto mj = move.message.reader().getBody().getMigrateJob();
  const SeqId seq = *move.stream_of;
  SequenceTable& target = pools_->pool(move.pool).sequences();
  auto it = streams_.find(seq);
  if (it == streams_.end() || it->second.moving != mj.getJob()) {
    target.Unstage(seq, MovesOf(mj));  // cannot happen, but its blocks must not stay staged
    return;
  }
  Stream& s = it->second;
  s.moving.reset();
  const std::optional<JobId> waiting = std::exchange(s.waiting, std::nullopt);
  const auto finish_waiting = [&] {  // the last prefill parked behind this move goes on
    auto job = waiting.has_value() ? jobs_.find(*waiting) : jobs_.end();
    if (job == jobs_.end()) return;
    FinishJob(*waiting, job->second.parked.value_or(absl::OkStatus()), nullptr, out);
  };
  if (s.dropped) {
    // Released (or a write failed) while its blocks moved: nothing staged is used again; a new
    // sequence of the id parked behind the move goes on without it.
    EndStream(seq);
    finish_waiting();
    return;
  }
  if (result.ok()) {
    s.bytes += bytes;
  } else {
    spdlog::warn("sequence {}: streaming {} blocks to pool {} by {} failed ({}); the final move "
                 "copies them", seq, mj.getMoves().size(), s.to, TransportName(s.transport),
                 result.ToString());
    target.Unstage(seq, MovesOf(mj));
    s.stopped = true;
  }
  if (waiting.has_value()) {
    finish_waiting();
    return;
  }
  StreamBlocks(seq, out);
}

void Broker::DropStream(SeqId seq) {
  auto it = streams_.find(seq);
  if (it == streams_.end()) return;
  if (it->second.moving.has_value()) {
    it->second.dropped = true;  // EndStreamMove ends it
    return;
  }
  EndStream(seq);
}

void Broker::EndStream(SeqId seq) {
  auto it = streams_.find(seq);
  if (it == streams_.end()) return;
  pools_->pool(it->second.to).sequences().DropStaged(seq);
  streams_.erase(it);
}

}  // namespace kvp
