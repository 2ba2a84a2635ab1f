// The Broker's sliced prefills (daemon/broker.h, docs/design.md §6): a prefill whose sequence is
// decoded on another pool is written in slices, and after each slice the blocks it completed are
// staged on the decode pool and copied there by a stream move while the next slice is written.
// When the last slice ends only the blocks it wrote are left for the final move, whose Import
// takes the staged copies. A block is streamed only once it is full: the blocks of one life of a
// sequence are never written again, apart from its partial last block.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

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

std::optional<Broker::PrefillSlices> Broker::SlicesFor(int32_t chunk_tokens, uint32_t count,
                                                       PoolIndex from, PoolIndex to) const {
  const int64_t size = chunk_tokens < 0 ? options_.prefill_chunk_tokens : chunk_tokens;
  if (size <= 0 || count <= size) return std::nullopt;
  const absl::StatusOr<wire::Transport> transport = ChooseTransport(from, to);
  if (!transport.ok()) return std::nullopt;  // the final move says why
  PrefillSlices slices;
  slices.size = static_cast<uint32_t>(size);
  slices.to = to;
  slices.transport = *transport;
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
  if (it == jobs_.end() || !it->second.slices.has_value() || it->second.client_gone) return false;
  Job& job = it->second;
  PrefillSlices& s = *job.slices;
  if (s.parked.has_value()) return false;  // its stream move ended: the prefill ends now
  if (auto w = workers_.find(job.worker); w != workers_.end()) w->second.job.reset();
  job.worker = 0;
  const uint32_t total = s.whole.reader().getBody().getPrefillJob().getTokens().size();
  if (result.ok()) s.written = std::min(s.written + s.size, total);
  if (result.ok() && s.written < total) {
    job.message = PrefillSlice(s.whole, s.written, s.written + s.size);
    job.attempts = 0;
    queues_[static_cast<int>(JobKind::kPrefill)].push_front(id);  // it goes on first
    StreamBlocks(id, out);  // may add jobs: `job` is not used after it
    Dispatch(out);
    return true;
  }
  // The last slice, or one that failed.
  s.written_micros = clock_->NowMicros();
  if (!s.moving.has_value()) return false;
  Job& move = jobs_.at(*s.moving);
  if (move.worker != 0) {  // running: the end waits for it, so that its blocks stay put
    s.parked = result;
    return true;
  }
  // Still queued (no worker free for it): the final move copies its blocks instead.
  for (auto& queue : queues_) std::erase(queue, *s.moving);
  pools_->pool(s.to).sequences().Unstage(
      job.sequences.front(), MovesOf(move.message.reader().getBody().getMigrateJob()));
  jobs_.erase(*s.moving);
  s.moving.reset();
  s.stopped = true;
  return false;
}

void Broker::StreamBlocks(JobId id, Outbox& out) {
  Job& job = jobs_.at(id);
  PrefillSlices& s = *job.slices;
  if (s.moving.has_value() || s.stopped) return;
  const SeqId seq = job.sequences.front();
  Pool& source = pools_->pool(job.pool);
  Pool& target = pools_->pool(s.to);
  const absl::StatusOr<absl::Span<const BlockId>> table = source.sequences().Blocks(seq);
  if (!table.ok()) return;
  // Blocks before the first written position are committed (the sequence's earlier tokens and
  // prefix hits); those the slices wrote are full up to the last position written.
  const uint64_t written =
      s.whole.reader().getBody().getPrefillJob().getFirstPosition() + s.written;
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
  absl::StatusOr<std::vector<BlockMove>> moves =
      target.sequences().Stage(seq, job.client_lease, sources);
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
           .client = job.client,
           .request_id = job.request_id,
           .client_lease = job.client_lease,
           .sequences = {},  // the prefill holds the sequence busy
           .message = MigrateJobMessage(move_id, seq, job.pool, s.transport, *moves),
           .submitted_micros = now,
           .then_migrate_to = std::nullopt,
           .migration = Migration{.from = job.pool,
                                  .to = s.to,
                                  .transport = s.transport,
                                  .blocks_moved = static_cast<uint32_t>(moves->size()),
                                  .started_micros = now},
           .slices = std::nullopt,
           .stream_of = id};
  Enqueue(std::move(move), out);  // `job` and `s` may move: not used after this
}

void Broker::EndStreamMove(const Job& move, const absl::Status& result, uint64_t bytes,
                           Outbox& out) {
  const auto mj = move.message.reader().getBody().getMigrateJob();
  const SeqId seq = mj.getSequence();
  auto it = jobs_.find(*move.stream_of);
  if (it == jobs_.end() || !it->second.slices.has_value() ||
      it->second.slices->moving != mj.getJob()) {
    // Its prefill ended without waiting (it cannot, but its blocks must not stay staged).
    pools_->pool(move.pool).sequences().Unstage(seq, MovesOf(mj));
    return;
  }
  PrefillSlices& s = *it->second.slices;
  s.moving.reset();
  if (result.ok()) {
    s.blocks_streamed += mj.getMoves().size();
    s.bytes_streamed += bytes;
  } else {
    spdlog::warn("sequence {}: streaming {} blocks to pool {} by {} failed ({}); the final move "
                 "copies them", seq, mj.getMoves().size(), s.to, TransportName(s.transport),
                 result.ToString());
    pools_->pool(move.pool).sequences().Unstage(seq, MovesOf(mj));
    s.stopped = true;
  }
  if (s.parked.has_value()) {
    const absl::Status written = *s.parked;
    FinishJob(*move.stream_of, written, nullptr, out);
    return;
  }
  StreamBlocks(*move.stream_of, out);
}

}  // namespace kvp
