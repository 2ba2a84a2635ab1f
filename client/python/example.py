"""Prefill, decode and release one sequence through kvpoold (the README's Python example)."""
import sys

from kvpool_client import KvpoolClient

client = KvpoolClient(sys.argv[1] if len(sys.argv) > 1 else None, name="python-example")
print("health:", client.health())
print("prefill:", client.prefill(7, range(1000, 1300)))
reply = client.decode([(7, 42, 10, 1010, 0.5)], outputs="last")
step = reply["outputs"][0]
print("decode: length", step["length"], "top-k", step["topk"][0][:8], "...")
print("released blocks:", client.release(7))
