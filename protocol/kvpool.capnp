# The kvpool wire protocol (docs/design.md §6), schema version 1. Every message on a kvpool ZeroMQ
# socket is one Envelope, framed as one ZeroMQ frame per Cap'n Proto segment (protocol/framing.h).
# Installed with the headers so clients in other languages build against the same file.
#
# Compatibility: fields are only ever added (new ordinals); a change that old readers would
# misread bumps schemaVersion, which readers check before anything else.
@0x9b1883e3720dda76;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvp::wire");

const schemaVersion :UInt32 = 1;

# ---- Bounds: what a reader accepts before any handler reads a message (protocol/message_check.h).
# Every List field names its bound with one of these annotations, and so may a Text field;
# ParseEnvelope refuses a message with a longer one, so no handler walks a list of a billion
# zero-byte elements. Per-pool bounds are the receiver's pool (or the largest pool a spec allows,
# before the receiver knows its pool).
annotation maxElements @0xe3c1a1d7b6a05f01 (field) :UInt32;
enum PoolBound {
  layers @0;  # one element per layer of the pool
  blocks @1;  # at most one element per block of the pool
}
annotation boundBy @0xe3c1a1d7b6a05f02 (field) :PoolBound;

const maxLayers :UInt32 = 1024;             # PoolSpec.numLayers
const maxPrefillTokens :UInt32 = 1048576;   # tokens of one prefill or append
const maxDecodeSteps :UInt32 = 4096;        # sequences of one decode request
const maxTensorRank :UInt32 = 4;
const maxCopies :UInt32 = 16;               # copy-on-write pairs of one append (one in practice)
const maxForgotten :UInt32 = 4194304;       # sequences a worker is told to forget at once
const maxNameBytes :UInt32 = 256;           # cache namespaces, file paths, error texts
const maxMessageText :UInt32 = 65536;
const maxPools :UInt32 = 64;                # pools of one kvpoold (one per GPU, or --pools)

# Abseil's codes, same numbers: what the caller should do next (docs/design.md §7).
enum StatusCode {
  ok @0;
  cancelled @1;
  unknown @2;
  invalidArgument @3;
  deadlineExceeded @4;
  notFound @5;
  alreadyExists @6;
  permissionDenied @7;
  resourceExhausted @8;
  failedPrecondition @9;
  aborted @10;
  outOfRange @11;
  unimplemented @12;
  internal @13;
  unavailable @14;
  dataLoss @15;
  unauthenticated @16;
}

struct Error {
  code @0 :StatusCode;
  message @1 :Text $maxElements(.maxMessageText);
}

enum KvFormat {
  bf16 @0;
  fp8E4m3 @1;
  turbo2 @2;
  turbo3 @3;
  turbo4 @4;
  indexer @5;
}

# What a pool caches per token and layer (docs/design.md §4). An MLA pool has one latent head:
# numKvHeads 1, headDim 512, the K/V fields at their defaults, an indexer.
enum PoolKind {
  kv @0;   # FP8/bf16 K and TurboNV/bf16 V per kv head
  mla @1;  # one fp8_ds_mla latent (656 bytes) shared by all query heads
}

struct PoolSpec {
  numLayers @0 :UInt32;
  numKvHeads @1 :UInt32;
  headDim @2 :UInt32;
  blockSize @3 :UInt32;
  kFormat @4 :KvFormat;
  vFormat @5 :KvFormat;
  vRotation @6 :Bool;
  indexer @7 :Bool;
  indexerUe8m0 @8 :Bool;
  kScales @9 :List(Float32) $boundBy(layers);  # per layer; empty = 1.0
  vScales @10 :List(Float32) $boundBy(layers);  # per layer; empty = 1.0
  kind @11 :PoolKind;
}

enum DType {
  bf16 @0;
  float32 @1;
  int32 @2;
  int64 @3;
}

# A dense little-endian row-major tensor.
struct Tensor {
  dtype @0 :DType;
  shape @1 :List(UInt32) $maxElements(.maxTensorRank);
  data @2 :Data;
}

# Per-layer activations of new tokens, as the cache write consumes them.
struct Activations {
  k @0 :List(Tensor) $boundBy(layers);       # per layer: [tokens, kv_heads, head_dim] bf16 (KV pools)
  v @1 :List(Tensor) $boundBy(layers);       # per layer: [tokens, kv_heads, head_dim] bf16 (KV pools)
  indexK @2 :List(Tensor) $boundBy(layers);  # per layer: [tokens, 128] bf16, pools with an indexer
  latent @3 :List(Tensor) $boundBy(layers);  # per layer: [tokens, 512] bf16 (MLA pools)
  rope @4 :List(Tensor) $boundBy(layers);    # per layer: [tokens, 64] bf16 (MLA pools)
}

# Per-layer queries of one decode step.
struct Queries {
  q @0 :List(Tensor) $boundBy(layers);            # per layer: [q_heads, head_dim] bf16; MLA: [q_heads, 576]
  indexQ @1 :List(Tensor) $boundBy(layers);       # per layer: [64, 128] bf16
  headWeights @2 :List(Tensor) $boundBy(layers);  # per layer: [64] float32
}

# Synthetic model only: the step's queries point at an earlier position.
struct Needle {
  position @0 :UInt64;
  gain @1 :Float32;
  token @2 :Int32;  # the token at `position`: its key is what the query leans on
}

struct PrefillRequest {
  sequence @0 :UInt64;
  tokens @1 :List(Int32) $maxElements(.maxPrefillTokens);
  activations @2 :Activations;  # absent: the synthetic model makes them from the tokens
  # Blocks are shared as prefix hits only within one namespace (vLLM's cache_salt), and only
  # when their content is the same: the same token ids under the synthetic model, the same
  # tensor bytes as well for activations. Empty: the default namespace. A sequence keeps the
  # namespace of its first prefill or append.
  cacheNamespace @3 :Text $maxElements(.maxNameBytes);
  # Where it runs and where it is decoded (docs/design.md §6). pool: -1 lets kvpoold choose (the
  # pool with the most free blocks and a prefill worker) for a new sequence; an existing one stays
  # where it lives. decodePool: -1 keeps it where it was prefilled; another pool has kvpoold move
  # it there once written, before the reply (with `continued`, once the last prefill is).
  pool @4 :Int32 = -1;
  decodePool @5 :Int32 = -1;
  # With a decodePool: the prefill is written in slices of this many tokens, and each slice's
  # completed blocks are copied to the decode pool while the next is written, so that only the
  # last slice's blocks are left to move when the prefill ends (docs/design.md §6). -1: kvpoold's
  # --prefill_chunk_tokens; 0: one slice, everything moved at the end.
  chunkTokens @6 :Int32 = -1;
  # With a decodePool: more prefills of this sequence follow (an engine's chunked prefill). Its
  # blocks stream to the decode pool as they fill and the reply comes once it is written here;
  # the sequence moves with the last prefill, the one without `continued`, whose Import takes
  # what streamed. Every prefill of it names the same decodePool until then.
  continued @7 :Bool;
  # With decodePool: the node whose pool it is (a name of kvpoold's --peers_file; empty or this
  # kvpoold's own --node_name: here). The sequence moves to that kvpoold once written, and lives
  # there; this kvpoold forwards its decodes and release (docs/design.md §11).
  decodeNode @8 :Text $maxElements(.maxNameBytes);
}

struct PrefillReply {
  sequence @0 :UInt64;
  length @1 :UInt64;
  prefixHitTokens @2 :UInt32;
  pool @3 :UInt32;                # where the sequence lives now
  migration @4 :MigrationReport;  # set when a decodePool other than the prefill's was asked
  node @5 :Text $maxElements(.maxNameBytes);  # the node it lives on; empty: this kvpoold's
}

# How a migration's bytes moved, chosen by kvpoold per transfer.
enum Transport {
  none @0;      # nothing to move: the destination held every block already
  host @1;      # memfd pools: the receiving worker maps the source arena and copies
  peerCopy @2;  # GPUs with peer access (or one GPU): the receiver maps the source arena and pulls
  nccl @3;      # ncclSend/ncclRecv between a worker of each pool (cuda pools)
  socket @4;    # a TCP connection between a worker of each pool (host pools; other nodes)
}

struct MigrationReport {
  fromPool @0 :UInt32;
  toPool @1 :UInt32;
  transport @2 :Transport;
  blocksMoved @3 :UInt32;   # copied to the destination
  blocksShared @4 :UInt32;  # the destination held them already (its prefix cache)
  bytes @5 :UInt64;
  micros @6 :UInt64;        # kvpoold's time from planning the move to committing it
  # Set when the move failed: nothing was committed on toPool and the sequence, unchanged, still
  # lives on fromPool.
  error @7 :Error;
  # A prefill's move: of blocksMoved, those copied while the prefill was still being written (a
  # sliced prefill, PrefillRequest.chunkTokens), and kvpoold's time from the prefill's last write
  # to the commit on toPool, when the sequence can be decoded there.
  streamedBlocks @8 :UInt32;
  afterPrefillMicros @9 :UInt64;
  toNode @10 :Text $maxElements(.maxNameBytes);  # toPool's node; empty: this kvpoold's
}

# Moves a sequence to another pool (rebalancing, or decode elsewhere). Two-phase: the blocks are
# reserved on the destination under the sequence's lease, copied, committed there once the
# receiving worker reports them, and only then released on the source (kept as its prefix cache
# where they are indexed). Decodes never see a half-moved sequence: it is busy meanwhile.
struct MigrateRequest {
  sequence @0 :UInt64;
  toPool @1 :UInt32;
  # A peer kvpoold's node name (--peers_file): the sequence moves there, pool toPool of that
  # node, and lives there from then on (docs/design.md §11). Empty: a pool of this kvpoold.
  toNode @2 :Text $maxElements(.maxNameBytes);
}
struct MigrateReply {
  sequence @0 :UInt64;
  length @1 :UInt64;
  migration @2 :MigrationReport;
}

struct DecodeStep {
  sequence @0 :UInt64;
  token @1 :Int32;
  activations @2 :Activations;  # the new token's K/V; absent: synthetic
  queries @3 :Queries;          # absent: synthetic
  needle @4 :Needle;            # synthetic only; absent: none
}

# Which layers' outputs a decode reply carries: every layer (tests, accuracy), the last one (a
# stand-in for the hidden state a model passes on), or none: only each sequence's new length, the
# size of what a full model's decode returns (a token per sequence). Every layer runs regardless.
enum OutputLayers {
  all @0;
  last @1;
  none @2;
}

struct DecodeRequest {
  steps @0 :List(DecodeStep) $maxElements(.maxDecodeSteps);
  outputLayers @1 :OutputLayers;
}

struct DecodeOutput {
  sequence @0 :UInt64;
  length @1 :UInt64;
  out @2 :List(Tensor) $boundBy(layers);   # per layer: [q_heads, head_dim] float32
  topk @3 :List(Tensor) $boundBy(layers);  # per layer: [k] int32, pools with an indexer
  lse @4 :List(Tensor) $boundBy(layers);   # per layer: [q_heads] float32 log-sum-exp (MLA pools)
}

struct DecodeReply {
  outputs @0 :List(DecodeOutput) $maxElements(.maxDecodeSteps);
  workerMicros @1 :UInt64;        # the worker's time executing the job (kernels included)
  workerHandleMicros @2 :UInt64;  # the worker's time from receiving the job to its report
  brokerMicros @3 :UInt64;        # kvpoold's time handling the request and the job's report
}

struct ReleaseRequest { sequence @0 :UInt64; }
struct ReleaseReply { releasedBlocks @0 :UInt32; }

struct ForkRequest {
  source @0 :UInt64;
  target @1 :UInt64;
}
struct ForkReply { sharedBlocks @0 :UInt32; }

struct StatsRequest {}
struct StatsReply {
  blocksFree @0 :UInt64;
  blocksReserved @1 :UInt64;
  blocksUsed @2 :UInt64;
  blocksCached @3 :UInt64;
  prefixHitBlocks @4 :UInt64;
  leases @5 :UInt32;
  sequences @6 :UInt32;
  clientBlocks @7 :UInt64;           # what the asking client holds, against its limits
  clientRequestsInFlight @8 :UInt32;
  rejectedNonFinite @9 :UInt64;      # requests refused for NaN or Inf in their tensors
  pools @10 :List(PoolState) $maxElements(.maxPools);  # the fields above are their sums
  recovery @11 :Recovery;  # what kvpoold's last start kept (docs/design.md §10)
  peers @12 :List(PeerState) $maxElements(.maxPools);  # the other nodes' kvpoolds
  # The asking client's sequences that live on another node (moved there), and where.
  remoteSequences @13 :List(RemoteSequence) $maxElements(.maxDecodeSteps);
}

# A peer kvpoold (docs/design.md §11), as this one sees it.
struct PeerState {
  name @0 :Text $maxElements(.maxNameBytes);
  endpoint @1 :Text $maxElements(.maxNameBytes);
  reachable @2 :Bool;              # it answered within the last few heartbeats
  lastHeardMillis @3 :UInt64;      # since its last message; 0: never
  sequences @4 :UInt32;            # this kvpoold's sequences that live there
}

struct RemoteSequence {
  sequence @0 :UInt64;
  node @1 :Text $maxElements(.maxNameBytes);
  pool @2 :UInt32;
}

# ---- Between kvpoolds (docs/design.md §11): peers only, over CURVE, both sides listed ----

# Node A asks node B to take a sequence A holds: B reserves its blocks in toPool under A's lease
# (A's heartbeats renew it) and hands a receiving worker the move. B answers first with the send
# half of the move (an Envelope with this request's id and a MigrateJob body: the moves, A's
# blocks onto B's, and the receiver's link), which A gives to a worker of the source pool; B
# answers last with PeerImportReply once its receiver reported the bytes and B committed them, or
# with an Error (nothing committed). A releases the sequence only after that reply.
struct PeerImportRequest {
  sequence @0 :UInt64;  # A's id, for logs
  length @1 :UInt64;
  tail @2 :List(Int32) $maxElements(.maxPrefillTokens);  # tokens of the partial last block
  blocks @3 :List(Int32) $boundBy(blocks);  # the source blocks in A's pool, in table order
  toPool @4 :UInt32;
  transport @5 :Transport;  # socket (host pools) or nccl
  spec @6 :PoolSpec;        # A's: B refuses a sequence of another layout
  sourceChunkBytes @7 :UInt64;
}

struct PeerImportReply {
  sequence @0 :UInt64;  # B's id for it, which A uses from now on
  length @1 :UInt64;
  bytes @2 :UInt64;     # what the receiver reported
  pool @3 :UInt32;
}

# What kvpoold's start recovered from its state log; all zero without --state_dir or when it
# started empty.
struct Recovery {
  sequences @0 :UInt64;
  blocks @1 :UInt64;   # committed blocks: used and cached
  micros @2 :UInt64;   # from the process's start to ready to serve
  stateDir @3 :Bool;   # kvpoold logs its state (--state_dir)
}

# One pool of kvpoold, in Stats and Health.
struct PoolState {
  index @0 :UInt32;
  gpu @1 :Int32;  # -1: a host (memfd) pool
  blocksFree @2 :UInt64;
  blocksReserved @3 :UInt64;
  blocksUsed @4 :UInt64;
  blocksCached @5 :UInt64;
  sequences @6 :UInt32;
  prefillWorkers @7 :UInt32;
  decodeWorkers @8 :UInt32;
}

struct HealthRequest {}
struct HealthReply {
  ready @0 :Bool;
  epoch @1 :UInt64;
  workers @2 :UInt32;
  draining @3 :Bool;
  spec @4 :PoolSpec;   # what tensors sent to this pool must look like
  model @5 :Model;
  limits @6 :ClientLimits;
  pools @7 :List(PoolState) $maxElements(.maxPools);
}

# What one client (one lease) may hold at once; RESOURCE_EXHAUSTED names the limit it would pass.
struct ClientLimits {
  maxBlocks @0 :UInt64;          # blocks its sequences and reservations reference
  maxRequestsInFlight @1 :UInt32;  # prefill and decode requests queued or running
}

# Engine attachments write the cache themselves: Append reserves the slots of new tokens, the
# engine writes them, then Commit makes them readable or Abort returns them (docs/design.md §6).
struct AppendRequest {
  sequence @0 :UInt64;
  tokens @1 :List(Int32) $maxElements(.maxPrefillTokens);
  # kvpoold cannot see what an engine writes, so engine-written blocks are shared as prefix hits
  # only within a named namespace, whose clients vouch that equal token ids mean equal K/V
  # (one model, one configuration). Empty: not shared at all.
  cacheNamespace @2 :Text $maxElements(.maxNameBytes);
  # The pool whose arena the engine writes: -1 for where the sequence lives, or pool 0 (the
  # arena of kvpoold's first fd channel) for a new one.
  pool @3 :Int32 = -1;
}
struct AppendReply {
  prefixHitTokens @0 :UInt32;
  slots @1 :List(Int64) $maxElements(.maxPrefillTokens);  # one per token after the prefix hits
  copies @2 :List(BlockCopy) $maxElements(.maxCopies);  # copy-on-write, before writing
  blockTable @3 :List(Int32) $boundBy(blocks);     # the sequence's blocks with the append
  pool @4 :UInt32;                                 # whose arena the slots are in
}
struct CommitRequest { sequence @0 :UInt64; }
struct CommitReply { length @0 :UInt64; }
struct AbortRequest { sequence @0 :UInt64; }
struct AbortReply { length @0 :UInt64; }

enum Role {
  prefill @0;
  decode @1;
}

# What a worker's kernels serve on one kind of arena, for its role (kernels/capabilities.h).
struct ServedFormats {
  kFormats @0 :List(KvFormat) $maxElements(64);
  vFormats @1 :List(KvFormat) $maxElements(64);
  headDims @2 :List(UInt32) $maxElements(64);
  mla @3 :Bool;  # MLA pools: latent write and sparse MLA decode
}

struct Capabilities {
  cuda @0 :Bool;                                 # it can map a cuda arena
  # Superseded by hostArena and cudaArena (what it serves may differ by arena and role); left
  # empty, so that a kvpoold that reads only these refuses the worker rather than misjudge it.
  formats @1 :List(KvFormat) $maxElements(64);
  headDims @2 :List(UInt32) $maxElements(64);
  hostArena @3 :ServedFormats;  # absent: it cannot serve a host arena
  cudaArena @4 :ServedFormats;  # absent: it cannot serve a cuda arena
  nccl @5 :Bool;                # built with NCCL: it can send and receive moves over it
}

struct RegisterRequest {
  role @0 :Role;
  gpu @1 :Int32;  # -1: host backend
  capabilities @2 :Capabilities;
  pid @3 :UInt32;  # for logs
  # The pool it serves: -1 for the pool on its gpu (cuda), or pool 0 (host backend).
  pool @4 :Int32 = -1;
  # GPUs whose memory its own GPU can read (cudaDeviceCanAccessPeer): migrations from pools there
  # can pull with the copy engine.
  peerGpus @5 :List(Int32) $maxElements(.maxPools);
}

# The model the decode jobs run: what the pool spec does not say.
struct Model {
  numQHeads @0 :UInt32;
  topk @1 :UInt32;          # positions the indexer selects per layer (pools with an indexer)
  syntheticSeed @2 :UInt64; # the synthetic model's seed
  # Per layer: > 0 attends to the last W positions only (dense decode); 0, or an empty list: all.
  slidingWindows @3 :List(UInt32) $boundBy(layers);
  sparseVThreshold @4 :Float32;  # τ of sparse-V (docs/design.md §5); 0: exact dense softmax
  softmaxScale @5 :Float32;      # 0: the pool kind's default (1/√head_dim; MLA: 0.1352)
}

struct RegisterReply {
  lease @0 :UInt64;
  spec @1 :PoolSpec;
  numBlocks @2 :UInt64;
  fdChannel @3 :Text $maxElements(4096);  # path of kvpoold's fd channel
  epoch @4 :UInt64;
  heartbeatMillis @5 :UInt32;
  model @6 :Model;
  leaseExpiryMillis @7 :UInt32;
  pool @8 :UInt32;  # the pool it serves (fdChannel hands out that pool's arena)
}

struct Heartbeat {
  lease @0 :UInt64;  # 0: a client's heartbeat (its lease is keyed by its name)
  epoch @1 :UInt64;  # the kvpoold instance that granted the lease (RegisterReply.epoch)
}
struct HeartbeatReply {}

struct PrefillJob {
  job @0 :UInt64;
  sequence @1 :UInt64;
  # The tokens to write (prefix hits left out).
  tokens @2 :List(Int32) $maxElements(.maxPrefillTokens);
  firstPosition @3 :UInt64;      # position of tokens[0]
  slotMapping @4 :List(Int64) $maxElements(.maxPrefillTokens);  # one slot per token
  copies @5 :List(BlockCopy) $maxElements(.maxCopies);  # copy-on-write, before writing
  activations @6 :Activations;
}

# Copies blocks of another pool into this worker's (a migration's receiving side): the source
# pool's arena is fetched from its fd channel (its epoch is this kvpoold's), then each move's
# source block is copied onto its target block, whole (a block spans all layers).
struct MigrateJob {
  job @0 :UInt64;
  sequence @1 :UInt64;
  sourcePool @2 :UInt32;
  sourceChannel @3 :Text $maxElements(4096);
  sourceGpu @4 :Int32;  # -1: host
  transport @5 :Transport;
  moves @6 :List(BlockCopy) $boundBy(blocks);
  # nccl and socket: the move is a pair of jobs, this one on one side of a link between a worker
  # of each pool (sourceChannel is then unused). Absent for host and peerCopy.
  link @7 :TransferLink;
}

enum TransferSide {
  receive @0;  # a worker of the destination pool: writes each move's target block
  send @1;     # a worker of the source pool: reads each move's source block
}

# One side of a paired move. A fresh link is opened by the receiver, which reports where to join
# it (TransferReady: an ncclUniqueId, or host:port); kvpoold relays that to the sender. A link
# that carried a move before (an NCCL communicator) is reused by both sides without a rendezvous.
struct TransferLink {
  side @0 :TransferSide;
  id @1 :UInt64;                             # kvpoold's number for this worker pair's link
  fresh @2 :Bool;                            # not opened yet: rendezvous first
  rendezvous @3 :Data $maxElements(512);     # send side of a fresh link: what the receiver said
  token @4 :Data $maxElements(64);           # socket: the sender presents it, the receiver checks
  deadlineMillis @5 :UInt32;                 # the whole move, rendezvous included
  # The arenas' cuMem chunk sizes: a send never spans a chunk boundary of either side.
  sourceChunkBytes @6 :UInt64;
  targetChunkBytes @7 :UInt64;
}

# From a receiver of a fresh link once the sender can join it; kvpoold sends the send job then.
struct TransferReady {
  job @0 :UInt64;
  rendezvous @1 :Data $maxElements(512);
}

struct BlockCopy {
  source @0 :Int32;
  target @1 :Int32;
}

struct DecodeJobStep {
  sequence @0 :UInt64;
  token @1 :Int32;
  position @2 :UInt64;           # of the new token
  slot @3 :Int64;                # where its K/V go
  # The sequence's block table is the first blockTableFrom blocks of the table this worker got
  # for it in earlier jobs, then blockTable; blockTableHash (protocol/block_tables.h) is of the
  # whole table. A worker that cannot rebuild it answers ABORTED and forgets all its tables.
  blockTable @4 :List(Int32) $boundBy(blocks);
  copies @5 :List(BlockCopy) $maxElements(.maxCopies);
  activations @6 :Activations;
  queries @7 :Queries;
  needle @8 :Needle;
  blockTableFrom @9 :UInt32;
  blockTableHash @10 :UInt64;
}

struct DecodeJob {
  job @0 :UInt64;
  steps @1 :List(DecodeJobStep) $maxElements(.maxDecodeSteps);
  outputLayers @2 :OutputLayers;
  # Sequences whose block tables the worker may drop.
  forget @3 :List(UInt64) $maxElements(.maxForgotten);
}

struct JobDone {
  job @0 :UInt64;
  outputs @1 :List(DecodeOutput) $maxElements(.maxDecodeSteps);  # decode jobs
  execMicros @2 :UInt64;           # time spent executing it, from after it was decoded
  handleMicros @3 :UInt64;         # from receiving the job to its report (decoding included)
  bytes @4 :UInt64;                # migrate jobs: bytes copied
}

struct JobFailed {
  job @0 :UInt64;
  error @1 :Error;
}

struct Envelope {
  schemaVersion @0 :UInt32;
  requestId @1 :UInt64;  # chosen by the sender of a request, echoed by its reply
  # Replies and heartbeat replies: the epoch of the kvpoold answering (it changes with every
  # start), so that a client sees a restart at once. Requests: the epoch the client last heard
  # from (0: none yet), so that kvpoold can say a sequence was lost in a restart.
  epoch @29 :UInt64;
  body :union {
    error @2 :Error;
    prefill @3 :PrefillRequest;
    prefillReply @4 :PrefillReply;
    decode @5 :DecodeRequest;
    decodeReply @6 :DecodeReply;
    release @7 :ReleaseRequest;
    releaseReply @8 :ReleaseReply;
    fork @9 :ForkRequest;
    forkReply @10 :ForkReply;
    stats @11 :StatsRequest;
    statsReply @12 :StatsReply;
    health @13 :HealthRequest;
    healthReply @14 :HealthReply;
    register @15 :RegisterRequest;
    registerReply @16 :RegisterReply;
    heartbeat @17 :Heartbeat;
    heartbeatReply @18 :HeartbeatReply;
    prefillJob @19 :PrefillJob;
    decodeJob @20 :DecodeJob;
    jobDone @21 :JobDone;
    jobFailed @22 :JobFailed;
    append @23 :AppendRequest;
    appendReply @24 :AppendReply;
    commit @25 :CommitRequest;
    commitReply @26 :CommitReply;
    abort @27 :AbortRequest;
    abortReply @28 :AbortReply;
    migrate @30 :MigrateRequest;
    migrateReply @31 :MigrateReply;
    migrateJob @32 :MigrateJob;
    transferReady @33 :TransferReady;
    peerImport @34 :PeerImportRequest;
    peerImportReply @35 :PeerImportReply;
  }
}
