#!/usr/bin/env python3
"""Merges `kvpool-bench kernels --json` with `torch_baselines.py --json` into one results file and
prints the results table of docs/benchmarks.md (each kvpool row next to PyTorch's equivalent at the same shape).

  python3 bench/report.py KERNELS.json TORCH.json OUT.json
"""
import json
import re
import sys


def batch_key(op, shape):
    """The part of a kvpool shape that the PyTorch rows name."""
    fields = dict(re.findall(r"(\w+(?:/\w+)?)=([\w./]+)", shape))
    if op == "paged_decode":
        return f"batch={fields['batch']} ctx={fields['ctx']} q/kv={fields['q/kv']} d={fields['d']}"
    if op == "indexer_logits":
        return f"batch={fields['batch']} tokens={fields['tokens']}"
    if op == "topk":
        return f"batch={fields['batch']} n={fields['n']} k={fields['k']}"
    if op == "sparse_decode":
        return f"batch={fields['batch']} q/kv={fields['q/kv']}"
    if op == "cache_write":
        return f"tokens={fields['tokens']} layers={fields['layers']}"
    if op == "sparse_mla_decode":
        return f"batch={fields['batch']} s_q={fields['s_q']} heads={fields['heads']}"
    if op == "mla_decode_layer":
        return (f"batch={fields['batch']} ctx={fields['ctx']} index_heads={fields['index_heads']} "
                f"topk={fields['topk']}")
    return None


def main():
    kernels = json.load(open(sys.argv[1]))
    torch_rows = json.load(open(sys.argv[2]))
    baselines = {(r["op"], r["key"]): r for r in torch_rows["rows"]}
    for row in kernels["rows"]:
        base = baselines.get((row["op"], batch_key(row["op"], row["shape"])))
        if base:
            row["torch"] = base["torch"]
            row["torch_median_us"] = base["median_us"]
            row["speedup_vs_torch"] = base["median_us"] / row["median_us"]
    kernels["torch_version"] = torch_rows["torch"]
    with open(sys.argv[3], "w") as f:
        json.dump(kernels, f, indent=2)
    print(f"{kernels['device']}, {kernels['date']}, copy bandwidth {kernels['copy_tbps']:.2f} TB/s "
          f"(read + write), PyTorch {torch_rows['torch']}\n")
    print("| op | shape | µs | TB/s | of copy | PyTorch µs | speed-up | notes |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in kernels["rows"]:
        notes = " ".join(f"{k}={v:.3g}" for k, v in r.items()
                         if k in ("skip_rate", "speedup_vs_tau0", "rel_l2_vs_tau0", "identical_to_dense",
                                  "cuda_graph_us", "step_layer_us", "step_layer_graph_us",
                                  "list_rows", "third_pass_rows", "loads_only_us"))
        torch_us = f"{r['torch_median_us']:.1f}" if "torch_median_us" in r else "-"
        speedup = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        rate = (f"{r['tbps']:.2f} | {100 * r['fraction_of_copy']:.0f}%" if r["bytes"] > 0
                else "- | -")  # an empty launch moves nothing
        print(f"| {r['op']} | {r['shape']} | {r['median_us']:.1f} | {rate} | {torch_us} | "
              f"{speedup} | {notes} |")


if __name__ == "__main__":
    main()
