"""The Python client against real kvpoold and worker processes (host backend).

usage: python_client_test.py KVPOOLD KVPOOL_WORKER   (exits 77, skipped, without pycapnp/pyzmq)
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
try:
    import kvpool_client  # needs pycapnp and pyzmq
except ImportError as e:
    print("skipped: %s (scripts/install-deps.sh creates .venv with them)" % e)
    sys.exit(77)

KVPOOLD, WORKER = sys.argv[1], sys.argv[2]


class ServiceTestCase(unittest.TestCase):
    """A kvpoold (host backend) and its workers in a fresh runtime directory for the whole class."""

    @classmethod
    def start_service(cls, daemon_flags, workers, name):
        """workers: (role, pool or None); waits until all have registered."""
        common = ["--runtime_dir=" + cls.dir]
        cls.procs = [subprocess.Popen([KVPOOLD, "--backend=host", "--arena_mib=64",
                                       "--metrics_port=-1"] + daemon_flags + common)]
        for role, pool in workers:
            flags = ["--pool=%d" % pool] if pool is not None else []
            cls.procs.append(subprocess.Popen([WORKER, "--role=" + role, "--backend=host"]
                                              + flags + common))
        cls.client = kvpool_client.KvpoolClient("ipc://%s/kvpoold.sock" % cls.dir, name=name,
                                                timeout_ms=20000)
        deadline = time.time() + 20
        while cls.client.health()["workers"] < len(workers):
            if time.time() > deadline:
                raise RuntimeError("workers did not register")
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for p in cls.procs:
            p.send_signal(signal.SIGTERM)
        for p in cls.procs:
            p.wait(timeout=30)
        shutil.rmtree(cls.dir, ignore_errors=True)


class PythonClientTest(ServiceTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvpool-py-")
        # A tcp:// endpoint too, for a CURVE client whose key kvpoold lists.
        cls.server_public, server_secret = [k.decode() for k in kvpool_client.zmq.curve_keypair()]
        cls.client_public, cls.client_secret = [k.decode() for k in kvpool_client.zmq.curve_keypair()]
        with open(os.path.join(cls.dir, "server.key"), "w") as f:
            f.write(server_secret + "\n")
        with open(os.path.join(cls.dir, "clients"), "w") as f:
            f.write("# the test's client\n" + cls.client_public + "\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            cls.tcp = "tcp://127.0.0.1:%d" % s.getsockname()[1]
        cls.start_service(["--pools=2", "--layers=2", "--topk=64", "--tcp_endpoint=" + cls.tcp,
                           "--curve_secret_key_file=" + os.path.join(cls.dir, "server.key"),
                           "--curve_clients_file=" + os.path.join(cls.dir, "clients")],
                          [("prefill", 0), ("decode", 0), ("decode", 1)], "py-test")

    def test_prefill_on_one_pool_decode_on_the_other(self):
        tokens = [t * 3 + 1 for t in range(130)]
        reply = self.client.prefill(40, tokens, pool=0, decode_pool=1)
        self.assertEqual(reply["pool"], 1)
        self.assertEqual(reply["migration"]["transport"], "host")
        self.assertEqual(reply["migration"]["blocksMoved"], 3)
        self.assertNotIn("error", reply["migration"])
        out = self.client.decode([(40, 5)])["outputs"][0]
        self.assertEqual(out["length"], 131)
        self.assertEqual(self.client.migrate(40, 0)["migration"]["toPool"], 0)
        pools = self.client.stats()["pools"]
        self.assertEqual(len(pools), 2)
        self.assertEqual(pools[1]["blocksUsed"], 0)
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.migrate(40, 5)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.client.release(40)

    def test_a_sliced_prefill_streams_to_its_decode_pool(self):
        tokens = [t * 5 + 2 for t in range(300)]  # five blocks of 64, slices of one
        reply = self.client.prefill(42, tokens, pool=0, decode_pool=1, chunk_tokens=64)
        self.assertEqual(reply["pool"], 1)
        self.assertEqual(reply["migration"]["blocksMoved"], 5)
        self.assertNotIn("error", reply["migration"])
        self.assertEqual(self.client.decode([(42, 5)])["outputs"][0]["length"], 301)
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.prefill(43, tokens, pool=0, decode_pool=1, chunk_tokens=-5)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.client.release(42)
        # An engine's chunked prefill (a prompt of its own: nothing cached): continued chunks
        # stay on pool 0, the last one moves it.
        prompt = [t * 11 + 4 for t in range(300)]
        try:
            first = self.client.prefill(44, prompt[:128], pool=0, decode_pool=1, continued=True)
            self.assertEqual(first["pool"], 0)
            last = self.client.prefill(44, prompt[128:], pool=0, decode_pool=1)
            self.assertEqual(last["pool"], 1)
            self.assertEqual(last["migration"]["blocksMoved"], 5)
            self.assertNotIn("error", last["migration"])
        finally:
            self.client.release(44)

    def test_prefill_decode_fork_release(self):
        tokens = list(range(5000, 5150))
        self.assertEqual(self.client.prefill(1, tokens)["length"], 150)
        self.assertEqual(self.client.fork(1, 2), 3)
        a = self.client.decode([(1, 9, 20, tokens[20], 0.8)], outputs="all")["outputs"][0]
        b = self.client.decode([(2, 9, 20, tokens[20], 0.8)], outputs="all")["outputs"][0]
        self.assertEqual(a["length"], 151)
        self.assertEqual(len(a["out"]), 2)            # one per layer
        self.assertEqual(len(a["out"][0]), 32 * 128)  # q_heads x head_dim
        self.assertIn(20, a["topk"][0])               # the needle was selected
        self.assertEqual(a["out"], b["out"])          # a fork decodes like its source
        self.assertEqual(self.client.release(1), 3)
        self.assertEqual(self.client.release(2), 3)
        stats = self.client.stats()
        self.assertEqual(stats["blocksUsed"], 0)
        self.assertEqual(stats["blocksReserved"], 0)

    def test_a_listed_curve_client_is_served_over_tcp(self):
        remote = kvpool_client.KvpoolClient(self.tcp, name="py-remote", timeout_ms=20000,
                                            curve_server_key=self.server_public,
                                            curve_secret_key=self.client_secret)
        try:
            self.assertGreaterEqual(remote.health()["workers"], 2)
            self.assertEqual(remote.prefill(7, list(range(64)))["length"], 64)
            self.assertEqual(remote.release(7), 1)
        finally:
            remote.close()

    def test_namespaces_keep_prefixes_apart(self):
        tokens = list(range(7000, 7128))
        red = kvpool_client.KvpoolClient("ipc://%s/kvpoold.sock" % self.dir, name="py-red",
                                         timeout_ms=20000, cache_namespace="red")
        try:
            self.assertEqual(red.prefill(20, tokens)["prefixHitTokens"], 0)
            self.assertEqual(self.client.prefill(21, tokens)["prefixHitTokens"], 0)
            self.assertEqual(red.prefill(22, tokens)["prefixHitTokens"], 128)
            for seq in (20, 22):
                red.release(seq)
            self.client.release(21)
        finally:
            red.close()

    def test_errors_are_typed(self):
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.release(424242)
        self.assertEqual(e.exception.code, "NOT_FOUND")
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.prefill(3, [])
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")


class MlaPoolTest(ServiceTestCase):
    """An MLA pool (kvpoold --pool_kind=mla) prefilled and decoded with the client's own tensors."""

    LAYERS, TOKENS, HEADS = 2, 40, 16

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvpool-py-mla-")
        cls.start_service(["--pool_kind=mla", "--layers=%d" % cls.LAYERS,
                           "--q_heads=%d" % cls.HEADS, "--topk=64"],
                          [("prefill", None), ("decode", None)], "py-mla")

    def test_a_query_that_points_at_one_token_reads_its_latent(self):
        rng = random.Random(7)
        n = self.TOKENS
        latent = [[rng.gauss(0, 1) for _ in range(n * 512)] for _ in range(self.LAYERS)]
        rope = [[rng.gauss(0, 1) for _ in range(n * 64)] for _ in range(self.LAYERS)]
        index_k = [[rng.gauss(0, 1) for _ in range(n * 128)] for _ in range(self.LAYERS)]
        spec = self.client.health()["spec"]
        self.assertEqual(spec["kind"], "mla")
        self.assertEqual(spec["headDim"], 512)
        reply = self.client.prefill(7, [rng.randrange(32000) for _ in range(n)],
                                    activations={"latent": latent, "rope": rope, "indexK": index_k})
        self.assertEqual(reply["length"], n)
        # Every head's absorbed query is token 12's own latent and RoPE values: its score stands
        # so far above the others' that the output is token 12's latent as the cache holds it.
        target = 12
        q = [(latent[l][target * 512:(target + 1) * 512] + rope[l][target * 64:(target + 1) * 64])
             * self.HEADS for l in range(self.LAYERS)]
        step = {"sequence": 7, "token": 1,
                "activations": {"latent": [[0.5] * 512] * self.LAYERS,
                                "rope": [[0.5] * 64] * self.LAYERS,
                                "indexK": [[0.0] * 128] * self.LAYERS},
                "queries": {"q": q, "indexQ": [[0.0] * 64 * 128] * self.LAYERS,
                            "headWeights": [[1.0] * 64] * self.LAYERS}}
        out = self.client.decode([step])["outputs"][0]
        self.assertEqual(out["length"], n + 1)
        self.assertEqual(len(out["out"]), self.LAYERS)
        self.assertEqual(len(out["lse"]), self.LAYERS)
        for l in range(self.LAYERS):
            self.assertEqual(len(out["out"][l]), self.HEADS * 512)
            self.assertEqual(len(out["lse"][l]), self.HEADS)
            self.assertEqual(sorted(p for p in out["topk"][l] if p >= 0), list(range(n + 1)))
            want = latent[l][target * 512:(target + 1) * 512]
            for h in range(self.HEADS):
                got = out["out"][l][h * 512:(h + 1) * 512]
                err = sum((a - b) ** 2 for a, b in zip(got, want)) ** 0.5
                norm = sum(b * b for b in want) ** 0.5
                self.assertLess(err / norm, 0.05)  # E4M3 codes and a bf16 output

    def test_tensors_of_the_wrong_shape_are_refused(self):
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.prefill(8, [1, 2, 3], activations={"latent": [[0.0] * 3 * 512] * 2,
                                                           "rope": [[0.0] * 3 * 64] * 2})
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")  # no index keys
        with self.assertRaises(kvpool_client.KvpoolError) as e:
            self.client.prefill(8, [1, 2, 3], activations={"k": [[0.0] * 3 * 512] * 2})
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")  # K/V: not an MLA pool's tensors


class DeadDaemonTest(unittest.TestCase):
    """A request in flight when kvpoold dies fails at once, not after the timeout."""

    def test_a_dead_daemon_fails_the_waiting_call_at_once(self):
        run_dir = tempfile.mkdtemp(prefix="kvpool-py-dead-")
        common = ["--runtime_dir=" + run_dir]
        daemon = subprocess.Popen([KVPOOLD, "--backend=host", "--arena_mib=64", "--layers=2",
                                   "--topk=64", "--metrics_port=-1"] + common)
        worker = subprocess.Popen([WORKER, "--role=prefill", "--backend=host"] + common)
        client = kvpool_client.KvpoolClient("ipc://%s/kvpoold.sock" % run_dir, name="py-dead",
                                            timeout_ms=60000)
        try:
            deadline = time.time() + 20
            while client.health()["workers"] < 1:
                self.assertLess(time.time(), deadline, "the worker did not register")
                time.sleep(0.05)
            worker.send_signal(signal.SIGSTOP)  # the prefill below cannot finish
            killer = subprocess.Popen(["sh", "-c", "sleep 0.5; kill -9 %d" % daemon.pid])
            started = time.monotonic()
            with self.assertRaises(kvpool_client.KvpoolError) as e:
                client.prefill(1, list(range(100)))
            self.assertEqual(e.exception.code, "UNAVAILABLE")
            self.assertIn("lost the connection", e.exception.message)
            self.assertLess(time.monotonic() - started, 30)
            killer.wait()
        finally:
            client.close()
            worker.send_signal(signal.SIGCONT)
            for p in (daemon, worker):
                p.kill()
                p.wait()
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
