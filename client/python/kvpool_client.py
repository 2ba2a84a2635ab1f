"""A Python client of kvpoold: pyzmq for the transport, pycapnp over the same kvpool.capnp schema.

    from kvpool_client import KvpoolClient
    client = KvpoolClient("ipc:///run/kvpool/kvpoold.sock", name="my-engine")
    client.prefill(1, list(range(2048)))
    out = client.decode([(1, 42)], outputs="last")   # one step for sequence 1, token 42

Client tensors instead of the synthetic model: prefill(..., activations={"latent": [...], "rope":
[...], "indexK": [...]}) on an MLA pool ("k", "v", "indexK" on a KV pool), one flat tensor per
layer; decode steps as dicts with "activations" and "queries".
    client.release(1)

Every message is one Envelope framed as one ZeroMQ frame per Cap'n Proto segment (docs/design.md
§6). Error replies raise KvpoolError with the Abseil status code name. Nothing received is pickled or
evaluated. Sequences belong to the client's name while kvpoold's client lease lasts.

Nobody waits on a dead kvpoold: when the connection drops while a reply is awaited, or a message
from another kvpoold epoch arrives first, the call raises KvpoolError("UNAVAILABLE") at once,
naming the restart. Requests carry the epoch last heard from, so that a restarted kvpoold can say
that a sequence was lost with its predecessor.
"""

import itertools
import os
import struct
import sys
import time

import capnp  # pycapnp
import zmq

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCHEMA_CANDIDATES = [
    os.environ.get("KVPOOL_SCHEMA", ""),
    os.path.join(_HERE, "..", "..", "protocol", "kvpool.capnp"),  # a source checkout
    os.path.join(sys.prefix, "share", "kvpool", "kvpool.capnp"),  # installed (the .deb: /usr)
    "/usr/share/kvpool/kvpool.capnp",
]


def _load_schema():
    for path in _SCHEMA_CANDIDATES:
        if path and os.path.exists(path):
            return capnp.load(os.path.abspath(path), imports=["/usr/include", "/usr/local/include"])
    raise FileNotFoundError("kvpool.capnp not found; set KVPOOL_SCHEMA")


schema = _load_schema()


def default_endpoint():
    """The same default as the C++ tools (protocol/endpoints.h)."""
    for var in ("KVPOOL_RUNTIME_DIR", "RUNTIME_DIRECTORY"):
        if os.environ.get(var):
            return "ipc://%s/kvpoold.sock" % os.environ[var]
    if os.geteuid() == 0:
        return "ipc:///run/kvpool/kvpoold.sock"
    if os.environ.get("XDG_RUNTIME_DIR"):
        return "ipc://%s/kvpool/kvpoold.sock" % os.environ["XDG_RUNTIME_DIR"]
    return "ipc:///tmp/kvpool-%d/kvpoold.sock" % os.geteuid()


class KvpoolError(Exception):
    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


def _code_name(code):
    # invalidArgument -> INVALID_ARGUMENT, as Abseil spells it.
    name = str(code)
    return "".join("_" + c if c.isupper() else c for c in name).upper()


def _tensor_values(tensor):
    fmt = {"float32": "f", "int32": "i", "int64": "q"}[str(tensor.dtype)]
    data = bytes(tensor.data)
    return list(struct.unpack("<%d%s" % (len(data) // struct.calcsize(fmt), fmt), data))


# Values a token of each 2-D activation tensor carries ([tokens, n]); k and v are
# [tokens, kv_heads, head_dim], from the pool's spec.
_TOKEN_VALUES = {"latent": 512, "rope": 64, "indexK": 128}
_MLA_QUERY_DIM = 576  # an MLA pool's absorbed query head: latent then RoPE


def _bf16_bytes(values):
    """bf16 of each float, rounded to nearest even (NaN stays NaN), little-endian."""
    words = struct.unpack("<%dI" % len(values), struct.pack("<%df" % len(values), *values))
    halves = []
    for w in words:
        if (w & 0x7F800000) == 0x7F800000 and (w & 0x7FFFFF):
            halves.append((w >> 16) | 0x40)  # quiet NaN, sign kept
        else:
            halves.append(((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF)
    return struct.pack("<%dH" % len(halves), *halves)


def _set_tensor(tensor, dtype, shape, values):
    """values: floats (rounded to bf16 for a bf16 tensor), or bytes already in the dtype."""
    tensor.dtype = dtype
    dims = tensor.init("shape", len(shape))
    for i, d in enumerate(shape):
        dims[i] = d
    if isinstance(values, (bytes, bytearray, memoryview)):
        tensor.data = bytes(values)
    elif dtype == "bf16":
        tensor.data = _bf16_bytes(values)
    else:
        tensor.data = struct.pack("<%df" % len(values), *values)


def read_curve_key(path):
    """The one Z85 key in a key file (kvpoolctl curve-keygen; lines starting with # skipped)."""
    with open(path) as f:
        keys = [line.strip() for line in f if line.strip() and not line.strip().startswith("#")]
    if len(keys) != 1 or len(keys[0]) != 40:
        raise ValueError("%s: expected one 40-character Z85 CURVE key" % path)
    return keys[0]


class KvpoolClient:
    """curve_server_key / curve_secret_key (Z85 text): for kvpoold's tcp:// endpoint, which admits
    CURVE clients whose public key it lists (kvpoold --curve_clients_file)."""

    def __init__(self, endpoint=None, name=None, timeout_ms=120000, keep_alive_ms=5000,
                 curve_server_key=None, curve_secret_key=None, cache_namespace=""):
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt_string(zmq.ROUTING_ID, name or "py-%d" % os.getpid())
        if (curve_server_key is None) != (curve_secret_key is None):
            raise ValueError("curve_server_key and curve_secret_key go together")
        if curve_secret_key is not None:
            secret = curve_secret_key.encode() if isinstance(curve_secret_key, str) else curve_secret_key
            server = curve_server_key.encode() if isinstance(curve_server_key, str) else curve_server_key
            self._socket.curve_secretkey = secret
            self._socket.curve_publickey = zmq.curve_public(secret)
            self._socket.curve_serverkey = server
        # Waits are cut into keep_alive_ms slices with a heartbeat after each, so a long job does
        # not outlive this client's lease (as the C++ client does).
        self._keep_alive_ms = keep_alive_ms
        self._timeout_s = timeout_ms / 1000.0
        # The blocks of this client's prefills are shared only inside this namespace.
        self._cache_namespace = cache_namespace
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._epoch = 0             # of the kvpoold last heard from
        self._reconnecting = False  # the connection dropped: adopt the next epoch quietly
        self._socket.connect(endpoint or default_endpoint())
        self._ids = itertools.count(1)

    def close(self):
        self._socket.disable_monitor()
        self._monitor.close()
        self._socket.close()

    def _drop_stale_events(self):
        while self._monitor.poll(0):
            self._monitor.recv_multipart()

    def _call(self, kind, **fields):
        request_id = next(self._ids)
        envelope = schema.Envelope.new_message(schemaVersion=schema.schemaVersion,
                                               requestId=request_id)
        body = envelope.body.init(kind)
        for key, value in fields.items():
            setattr(body, key, value)
        return self._send_and_wait(envelope, request_id)

    def _send(self, envelope):
        envelope.epoch = self._epoch
        self._socket.send_multipart(envelope.to_segments())

    def _send_and_wait(self, envelope, request_id):
        self._drop_stale_events()
        sent_to = 0 if self._reconnecting else self._epoch
        self._send(envelope)
        deadline = time.monotonic() + self._timeout_s
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(self._keep_alive_ms))
            if self._socket not in ready:
                if self._monitor in ready:
                    self._drop_stale_events()
                    self._reconnecting = True
                    raise KvpoolError("UNAVAILABLE",
                                      "lost the connection to kvpoold (it stopped or restarted) "
                                      "while waiting: the request may not have run; retry it")
                if time.monotonic() > deadline:
                    raise KvpoolError("DEADLINE_EXCEEDED", "no reply from kvpoold")
                beat = schema.Envelope.new_message(schemaVersion=schema.schemaVersion, requestId=0)
                beat.body.init("heartbeat").lease = 0
                self._send(beat)
                continue
            frames = self._socket.recv_multipart()
            reply = schema.Envelope.from_segments(frames, traversal_limit_in_words=
                                                  2 * sum(len(f) for f in frames) // 8)
            if reply.schemaVersion != schema.schemaVersion:
                raise KvpoolError("FAILED_PRECONDITION",
                                  "kvpoold speaks schema version %d" % reply.schemaVersion)
            if reply.epoch and (not self._epoch or self._reconnecting):
                self._epoch, self._reconnecting = reply.epoch, False
            if reply.requestId != request_id:
                # Another kvpoold answering something else: the one this request went to is gone.
                if sent_to and reply.epoch and reply.epoch != sent_to:
                    self._epoch = reply.epoch
                    raise KvpoolError("UNAVAILABLE",
                                      "kvpoold restarted (epoch %d -> %d) before answering "
                                      "request %d; it was lost: retry it"
                                      % (sent_to, reply.epoch, request_id))
                continue  # a late reply to an earlier, timed-out call, or a heartbeat's
            if reply.epoch:
                self._epoch = reply.epoch
            which = reply.body.which()
            if which == "error":
                raise KvpoolError(_code_name(reply.body.error.code), reply.body.error.message)
            return which, _to_python(reply.body)

    def health(self):
        _, h = self._call("health")
        return h

    def stats(self):
        _, s = self._call("stats")
        return s

    def _shapes(self):
        """The pool's spec and model (from Health, asked once): what tensors must look like."""
        if not hasattr(self, "_health"):
            self._health = self.health()
        return self._health["spec"], self._health["model"]

    def _new_request(self, kind):
        request_id = next(self._ids)
        envelope = schema.Envelope.new_message(schemaVersion=schema.schemaVersion,
                                               requestId=request_id)
        return envelope, envelope.body.init(kind), request_id

    def _set_activations(self, builder, activations, tokens):
        """activations: {"latent"/"rope"/"indexK" (MLA pools), "k"/"v"/"indexK" (KV pools): one
        tensor per layer}, each tensor a flat list of floats or bf16 bytes, token-major."""
        spec, _ = self._shapes()
        for name, layers in activations.items():
            if name in ("k", "v"):
                shape = [tokens, spec["numKvHeads"], spec["headDim"]]
            elif name in _TOKEN_VALUES:
                shape = [tokens, _TOKEN_VALUES[name]]
            else:
                raise ValueError("unknown activation tensor %r" % name)
            tensors = builder.init(name, len(layers))
            for tensor, values in zip(tensors, layers):
                _set_tensor(tensor, "bf16", shape, values)

    def _set_queries(self, builder, queries):
        """queries: {"q": [q_heads, head_dim] (MLA pools: [q_heads, 576]), "indexQ": [64, 128],
        "headWeights": [64] float32: one tensor per layer}, each flat, as for activations."""
        spec, model = self._shapes()
        dim = _MLA_QUERY_DIM if spec.get("kind") == "mla" else spec["headDim"]
        shapes = {"q": ("bf16", [model["numQHeads"], dim]), "indexQ": ("bf16", [64, 128]),
                  "headWeights": ("float32", [64])}
        for name, layers in queries.items():
            if name not in shapes:
                raise ValueError("unknown query tensor %r" % name)
            dtype, shape = shapes[name]
            tensors = builder.init(name, len(layers))
            for tensor, values in zip(tensors, layers):
                _set_tensor(tensor, dtype, shape, values)

    def prefill(self, sequence, tokens, pool=-1, decode_pool=-1, activations=None,
                chunk_tokens=-1, continued=False, decode_node=""):
        """pool: where it runs (-1: kvpoold places it); decode_pool: where it is decoded, moved
        there before the reply (-1: where it was prefilled). The reply's "pool" says where it lives,
        its "migration" how the move went. activations (see _set_activations): the tokens' own
        tensors; None: the synthetic model makes them from the token ids. chunk_tokens: with a
        decode pool, the slice size whose blocks move while the next is written (-1: kvpoold's
        --prefill_chunk_tokens, 0: written whole and moved after). continued: with a decode pool,
        more prefills of this sequence follow (an engine's chunked prefill): its blocks stream
        there as they fill, the reply comes once written, and the last prefill moves it.
        decode_node: a peer kvpoold's node name (its --peers_file): decode_pool is that node's,
        and the sequence lives there once moved; the reply's "node" says so."""
        envelope, body, request_id = self._new_request("prefill")
        body.sequence, body.tokens = sequence, list(tokens)
        body.cacheNamespace, body.pool, body.decodePool = self._cache_namespace, pool, decode_pool
        body.chunkTokens, body.continued, body.decodeNode = chunk_tokens, continued, decode_node
        if activations is not None:
            self._set_activations(body.init("activations"), activations, len(tokens))
        _, r = self._send_and_wait(envelope, request_id)
        return r

    def migrate(self, sequence, to_pool, to_node=""):
        """Moves an idle sequence to pool `to_pool` (of peer node `to_node`, if named); the
        reply's "migration" says how."""
        _, r = self._call("migrate", sequence=sequence, toPool=to_pool, toNode=to_node)
        return r

    def decode(self, steps, outputs="all"):
        """steps: (sequence, token), (sequence, token, needle_position, needle_token, gain), or
        {"sequence", "token", "activations" (the new token's, as for prefill), "queries"}."""
        envelope, decode, request_id = self._new_request("decode")
        decode.outputLayers = outputs
        wire_steps = decode.init("steps", len(steps))
        for wire_step, step in zip(wire_steps, steps):
            if isinstance(step, dict):
                wire_step.sequence, wire_step.token = step["sequence"], step["token"]
                if step.get("activations") is not None:
                    self._set_activations(wire_step.init("activations"), step["activations"], 1)
                if step.get("queries") is not None:
                    self._set_queries(wire_step.init("queries"), step["queries"])
                continue
            wire_step.sequence, wire_step.token = step[0], step[1]
            if len(step) == 5:
                needle = wire_step.init("needle")
                needle.position, needle.token, needle.gain = step[2], step[3], step[4]
        _, reply = self._send_and_wait(envelope, request_id)
        return reply

    def fork(self, source, target):
        _, r = self._call("fork", source=source, target=target)
        return r["sharedBlocks"]

    def release(self, sequence):
        _, r = self._call("release", sequence=sequence)
        return r["releasedBlocks"]


def _to_python(body):
    """The reply body as plain Python values; tensors become lists."""
    which = body.which()
    reply = getattr(body, which)
    if which == "decodeReply":
        return {
            "workerMicros": reply.workerMicros,
            "outputs": [{
                "sequence": o.sequence,
                "length": o.length,
                "out": [_tensor_values(t) for t in o.out],
                "topk": [_tensor_values(t) for t in o.topk],
                "lse": [_tensor_values(t) for t in o.lse],
            } for o in reply.outputs],
        }
    return reply.to_dict()
