"""A Python client of kvpoold: pyzmq for the transport, pycapnp over the same kvpool.capnp schema.

    from kvpool_client import KvpoolClient
    client = KvpoolClient("ipc:///run/kvpool/kvpoold.sock", name="my-engine")
    client.prefill(1, list(range(2048)))
    out = client.decode([(1, 42)], outputs="last")   # one step for sequence 1, token 42
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
import time

import capnp  # pycapnp
import zmq

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCHEMA_CANDIDATES = [
    os.environ.get("KVPOOL_SCHEMA", ""),
    os.path.join(_HERE, "..", "..", "protocol", "kvpool.capnp"),  # a source checkout
    os.path.join(_HERE, "..", "kvpool.capnp"),  # installed: share/kvpool/
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

    def prefill(self, sequence, tokens, pool=-1, decode_pool=-1):
        """pool: where it runs (-1: kvpoold places it); decode_pool: where it is decoded, moved
        there before the reply (-1: where it was prefilled). The reply's "pool" says where it lives,
        its "migration" how the move went."""
        _, r = self._call("prefill", sequence=sequence, tokens=list(tokens),
                          cacheNamespace=self._cache_namespace, pool=pool, decodePool=decode_pool)
        return r

    def migrate(self, sequence, to_pool):
        """Moves an idle sequence to pool `to_pool`; the reply's "migration" says how."""
        _, r = self._call("migrate", sequence=sequence, toPool=to_pool)
        return r

    def decode(self, steps, outputs="all"):
        """steps: (sequence, token) or (sequence, token, needle_position, needle_token, gain)."""
        request_id = next(self._ids)
        envelope = schema.Envelope.new_message(schemaVersion=schema.schemaVersion,
                                               requestId=request_id)
        decode = envelope.body.init("decode")
        decode.outputLayers = outputs
        wire_steps = decode.init("steps", len(steps))
        for wire_step, step in zip(wire_steps, steps):
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
            } for o in reply.outputs],
        }
    return reply.to_dict()
