"""What an operator watches, checked against a real kvpoold (host backend): /metrics passes
`promtool check metrics` (Prometheus's own linter: names, types, units, _total counters), the alert
rules pass `promtool check rules`, and every kvpool_* metric the Grafana dashboard and the alert
rules query is one kvpoold exports; /livez and /readyz answer as the Kubernetes probes expect.

usage: observability_test.py KVPOOLD KVPOOL_WORKER KVPOOLCTL   (exits 77, skipped, without
promtool, unless CI=true: CI installs Debian's prometheus package, which has it)
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

KVPOOLD, WORKER, KVPOOLCTL = sys.argv[1:4]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "kvpool.json")
RULES = os.path.join(ROOT, "deploy", "prometheus", "kvpool-alerts.yml")
PROMTOOL = shutil.which("promtool")
if PROMTOOL is None:
    if os.environ.get("CI") == "true":
        print("promtool missing on CI (apt-get install prometheus)")
        sys.exit(1)
    print("skipped: no promtool (apt-get install prometheus)")
    sys.exit(77)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def queried_metrics(text):
    """kvpool_* names in PromQL, histogram series mapped to their family."""
    names = set(re.findall(r"\bkvpool_[a-z_]+", text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


class ObservabilityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvpool-obs-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            cls.port = s.getsockname()[1]
        common = ["--runtime_dir=" + cls.dir]
        cls.daemon = subprocess.Popen([KVPOOLD, "--backend=host", "--pools=2", "--arena_mib=64",
                                       "--layers=2", "--topk=64", "--metrics_address=127.0.0.1",
                                       "--metrics_port=%d" % cls.port] + common)
        cls.workers = [subprocess.Popen([WORKER, "--role=" + role, "--backend=host",
                                         "--pool=%d" % pool] + common)
                       for role, pool in (("prefill", 0), ("decode", 0), ("decode", 1))]
        cls.base = "http://127.0.0.1:%d" % cls.port
        try:
            cls.start()
        except BaseException:
            cls.tearDownClass()  # no process outlives a failed start
            raise

    @classmethod
    def start(cls):
        registered = ['kvpool_workers{pool="0",gpu="host",role="prefill"} 1',
                      'kvpool_workers{pool="0",gpu="host",role="decode"} 1',
                      'kvpool_workers{pool="1",gpu="host",role="decode"} 1']
        deadline = time.time() + 20
        while True:
            try:
                text = get(cls.base + "/metrics")[1]
                if all(r in text for r in registered):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the workers did not register")
            time.sleep(0.1)
        endpoint = "--endpoint=ipc://%s/kvpoold.sock" % cls.dir
        # Samples in the histograms: a prefill, a move to pool 1, a decode there.
        subprocess.run([KVPOOLCTL, endpoint, "prefill", "1", "--tokens=130", "--pool=0",
                        "--decode_pool=1"], check=True, capture_output=True)
        subprocess.run([KVPOOLCTL, endpoint, "decode", "1"], check=True, capture_output=True)
        time.sleep(0.3)  # a tick publishes the metrics
        cls.metrics = get(cls.base + "/metrics")[1]

    @classmethod
    def tearDownClass(cls):
        for p in [cls.daemon] + cls.workers:
            p.terminate()
        for p in [cls.daemon] + cls.workers:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_metrics_pass_promtool(self):
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=self.metrics, text=True,
                           capture_output=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for family in ("kvpool_job_seconds", "kvpool_migration_seconds"):
            self.assertIn("# TYPE %s histogram" % family, self.metrics)
        self.assertIn('kvpool_migrations_total{transport="host",outcome="ok"} 1', self.metrics)
        self.assertIn('kvpool_workers{pool="1",gpu="host",role="prefill"} 0', self.metrics)

    def test_alert_rules_pass_promtool(self):
        r = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_dashboard_and_rules_query_only_exported_metrics(self):
        exported = set(re.findall(r"^# TYPE (kvpool_[a-z_]+)", self.metrics, re.M))
        dashboard = json.load(open(DASHBOARD))
        exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
        self.assertTrue(queried_metrics(exprs))
        self.assertEqual(queried_metrics(exprs) - exported, set(), "dashboard")
        self.assertEqual(queried_metrics(open(RULES).read()) - exported, set(), "alert rules")

    def test_probes(self):
        self.assertEqual(get(self.base + "/livez")[0], 200)
        # Pool 1 has no prefill worker: alive, not ready, and the body says why.
        status, body = get(self.base + "/readyz")
        self.assertEqual(status, 503)
        self.assertIn("pool 1 has 0 prefill and 1 decode workers", body)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
