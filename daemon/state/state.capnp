# kvpoold's state log (docs/design.md §10): what it keeps across restarts under --state_dir.
# One file of checksummed records (daemon/state/record_file.h): a Header, a Snapshot of the whole
# state when the file was written, then one Batch per change set, in order.
#
# Compatibility: as the wire schema, fields are only added; a change that old readers would
# misread bumps stateVersion, and a kvpoold that finds another version starts empty.
@0xbcf922be02060c6a;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvp::state");
using Wire = import "/protocol/kvpool.capnp";

const stateVersion :UInt32 = 1;

# A pool as it was created: what the chunks a restarted kvpoold gets back must be.
struct Pool {
  id @0 :UInt64;          # random at creation; names its chunks in systemd's fd store
  gpu @1 :Int32;          # -1: a host (memfd) pool
  chunkBytes @2 :List(UInt64);
  numBlocks @3 :UInt32;
}

struct Header {
  version @0 :UInt32;
  spec @1 :Wire.PoolSpec;
  blockStride @2 :UInt64;
  pools @3 :List(Pool);
  digestKey @4 :Data;     # the content digest key (protocol/content_digest.h); secret
  arenaBytes @5 :UInt64;  # each pool's arena as asked for (--arena_mib)
}

struct Digest {
  lo @0 :UInt64;
  hi @1 :UInt64;
}

# A committed sequence (kvpool/pool/sequence_table.h CommittedSequence).
struct Sequence {
  pool @0 :UInt32;
  id @1 :UInt64;
  owner @2 :UInt64;       # its client's lease
  root @3 :UInt64;        # its cache namespace's chain root
  shared @4 :Bool;
  length @5 :Int64;
  fullHash @6 :UInt64;
  tail @7 :List(Int32);
  tailDigests @8 :List(Digest);
  blocks @9 :List(Int32);
  keptBlocks @10 :UInt32;  # leading blocks as in its last record (`blocks` follow them)
  keptTail @11 :UInt32;    # leading tail tokens and digests as in its last record
}

struct SequenceRef {
  pool @0 :UInt32;
  id @1 :UInt64;
}

# A block in the prefix index, or (present = false) one that left it.
struct IndexEntry {
  pool @0 :UInt32;
  block @1 :Int32;
  present @2 :Bool;
  hash @3 :UInt64;
  root @4 :UInt64;
  tokens @5 :List(Int32);
  content @6 :Digest;
}

# A client lease, or (present = false) one that ended.
struct Lease {
  id @0 :UInt64;
  present @1 :Bool;
  client @2 :Text;
  expiryMicros @3 :Int64;
}

# Reserved blocks: written by jobs that may still run when kvpoold dies, so a restarted kvpoold
# keeps them out of use until those jobs' workers are gone (docs/design.md §10).
struct Reservation {
  pool @0 :UInt32;
  block @1 :Int32;
  present @2 :Bool;
}

# A worker process that may be writing blocks: kvpoold's restart waits for it.
struct Worker {
  lease @0 :UInt64;
  present @1 :Bool;
  pid @2 :UInt32;
}

# The changes of one step of kvpoold's loop, all or nothing.
struct Batch {
  sequences @0 :List(Sequence);
  dropped @1 :List(SequenceRef);
  index @2 :List(IndexEntry);
  leases @3 :List(Lease);
  nextLease @4 :UInt64;
  reservations @5 :List(Reservation);
  workers @6 :List(Worker);
}

struct Record {
  union {
    header @0 :Header;
    snapshot @1 :Batch;   # everything present, as of the header
    batch @2 :Batch;
  }
}
