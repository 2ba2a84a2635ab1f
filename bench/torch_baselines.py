#!/usr/bin/env python3
"""PyTorch baselines for `kvpool-bench kernels`, timed the same way on the same GPU: CUDA events
around each run after warm-up, median of many runs, random non-zero inputs, inputs rotated across
copies where one copy would fit in L2.

  python3 bench/torch_baselines.py --json=OUT.json [--quick]
"""
import argparse
import datetime
import json
import statistics
import sys

import torch
import torch.nn.functional as F


_SCRATCH = None


def median_us(fn, copies=1, warmup=5, runs=50):
    """Like kvpool-bench's timer: before each run the GPU reads 256 MiB, which evicts L2 with clean
    lines (nothing dirty left for the run to write back) and keeps the GPU busy while Python
    enqueues the run, so launch gaps do not land between the events."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = torch.full((64 << 20,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
    times = []
    for i in range(warmup + runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _SCRATCH.sum()
        start.record()
        fn(i % copies)
        stop.record()
        stop.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def kv_rows(args, dev, gen, randn, rows):
    # Dense decode: SDPA over bf16 K/V (the uncompressed cache a user would otherwise keep), at the
    # targets' shapes and at the other heads and head dims of `kvpool-bench kernels --only=shapes`
    # (its other block sizes and V formats share the targets' baseline).
    dense = [(32, 8192, 32, 8, 128), (8, 32768, 32, 8, 128), (1, 131072, 32, 8, 128)]
    dense += [(32, 8192, q_heads, 8, 128) for q_heads in (8, 16, 64, 128)]
    dense += [(32, 8192, 32, 8, head_dim) for head_dim in (64, 256)]
    for batch, ctx, q_heads, kv_heads, head_dim in dense:
        if args.quick:
            ctx //= 16
        q = randn(batch, q_heads, 1, head_dim)
        k = randn(batch, kv_heads, ctx, head_dim)
        v = randn(batch, kv_heads, ctx, head_dim)
        us = median_us(lambda i: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rows.append({"op": "paged_decode",
                     "key": f"batch={batch} ctx={ctx} q/kv={q_heads}/{kv_heads} d={head_dim}",
                     "torch": "SDPA bf16 K/V (GQA)", "median_us": us})
        del q, k, v

    # Indexer logits: ReLU(q·kᵀ) weighted over 64 heads, keys already dequantized to bf16.
    n = 16384 if args.quick else 163840
    copies = 8
    ks = [randn(n, 128) for _ in range(copies)]
    qs = [randn(64, 128) for _ in range(copies)]
    ws = [torch.rand(64, device=dev, generator=gen) for _ in range(copies)]
    us = median_us(lambda i: (torch.relu(ks[i] @ qs[i].T).float() * ws[i]).sum(-1), copies)
    rows.append({"op": "indexer_logits", "key": f"batch=1 tokens={n}", "torch": "bf16 matmul + relu + weighted sum",
                 "median_us": us})
    del ks, qs
    for b, tokens in [(16, 2048), (32, 4096 if args.quick else 65536)]:
        kb, qb, wb = randn(b, tokens, 128), randn(b, 128, 64), torch.rand(b, 1, 64, device=dev, generator=gen)
        us = median_us(lambda i: (torch.relu(torch.bmm(kb, qb)).float() * wb).sum(-1))
        rows.append({"op": "indexer_logits", "key": f"batch={b} tokens={tokens}",
                     "torch": "bf16 bmm + relu + weighted sum", "median_us": us})
        del kb, qb
    b, n32 = 32, (4096 if args.quick else 65536)

    # Top-k over 163,840 scores, and over a batch of 32 rows of 65,536.
    scores = [torch.randn(n, device=dev, generator=gen) for _ in range(32)]
    for k in (256, 2048):
        us = median_us(lambda i: torch.topk(scores[i], k), 32)
        rows.append({"op": "topk", "key": f"batch=1 n={n} k={k}", "torch": "torch.topk", "median_us": us})
    del scores
    batch_scores = torch.randn(b, n32, device=dev, generator=gen)
    us = median_us(lambda i: torch.topk(batch_scores, 2048, dim=-1))
    rows.append({"op": "topk", "key": f"batch={b} n={n32} k=2048", "torch": "torch.topk", "median_us": us})
    del batch_scores

    # Sparse decode: gather the selected bf16 rows, then SDPA.
    for batch, heads, kv in [(1, 32, 8), (1, 128, 1), (16 if args.quick else 128, 32, 8),
                             (16 if args.quick else 128, 128, 1)]:
        ctx = 8192
        kc, vc = randn(batch, ctx, kv, 128), randn(batch, ctx, kv, 128)
        idx = torch.stack([torch.randperm(ctx, device=dev, generator=gen)[:2048] for _ in range(batch)])
        q = randn(batch, heads, 1, 128)

        def sparse(_):
            bi = torch.arange(batch, device=dev)[:, None]
            kk = kc[bi, idx].transpose(1, 2)
            vv = vc[bi, idx].transpose(1, 2)
            return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)

        us = median_us(sparse)
        rows.append({"op": "sparse_decode", "key": f"batch={batch} q/kv={heads}/{kv}",
                     "torch": "index gather + SDPA bf16", "median_us": us})
        del kc, vc

    # Cache write: scatter bf16 K and V of 32,768 tokens into a paged cache, 8 layers.
    tokens = 4096 if args.quick else 32768
    caches = [(torch.empty(tokens, 8, 128, device=dev, dtype=torch.bfloat16),
               torch.empty(tokens, 8, 128, device=dev, dtype=torch.bfloat16)) for _ in range(8)]
    kin = [randn(tokens, 8, 128) for _ in range(8)]
    vin = [randn(tokens, 8, 128) for _ in range(8)]
    slots = torch.randperm(tokens, device=dev, generator=gen)

    def write(_):
        for layer in range(8):
            caches[layer][0].index_copy_(0, slots, kin[layer])
            caches[layer][1].index_copy_(0, slots, vin[layer])

    us = median_us(write, warmup=3, runs=20)
    rows.append({"op": "cache_write", "key": f"tokens={tokens} layers=8", "torch": "index_copy_ bf16 K,V",
                 "median_us": us})



def mla_rows(args, dev, gen, randn, rows):
    # Sparse MLA decode (kvpool-bench kernels --only=mla): gather the selected tokens of a bf16
    # latent cache (576 values: latent and RoPE), then SDPA with the 512 latent values as V and
    # DeepSeek-V3.2's softmax scale; every head shares the top-2048 of its query token.
    tokens = 16384 if args.quick else 163840
    cache = randn(tokens, 576)
    for batch, s_q, heads in [(128, 2, 128), (128, 1, 128), (1, 1, 128), (128, 1, 64), (128, 1, 32),
                              (128, 1, 16)]:
        if args.quick and batch > 32:
            continue
        n = batch * s_q
        idx = torch.stack([torch.randperm(tokens, device=dev, generator=gen)[:2048] for _ in range(n)])
        q = randn(n, heads, 1, 576)

        def mla(_):
            kv = cache[idx]  # [n, 2048, 576]
            k = kv[:, None]
            v = kv[:, None, :, :512]
            return F.scaled_dot_product_attention(q, k.expand(-1, heads, -1, -1),
                                                  v.expand(-1, heads, -1, -1), scale=0.1352)

        us = median_us(mla, warmup=3, runs=20)
        rows.append({"op": "sparse_mla_decode", "key": f"batch={batch} s_q={s_q} heads={heads}",
                     "torch": "index gather + SDPA bf16 (576/512)", "median_us": us})
        del idx, q

    # A DeepSeek-V3.2 decode layer at batch 1 (kvpool-bench's mla_decode_layer): the indexer's
    # 64 heads over every token's bf16 index key, top-2048, then the gather and SDPA above.
    index_k = randn(tokens, 128)
    index_q = randn(64, 128)
    weights = torch.full((64,), 0.125, device=dev)
    q = randn(1, 128, 1, 576)

    def layer(_):
        scores = (torch.relu(index_k @ index_q.T).float() * weights).sum(-1)
        idx = torch.topk(scores, 2048).indices
        kv = cache[idx][None, None]
        return F.scaled_dot_product_attention(q, kv.expand(-1, 128, -1, -1),
                                              kv[..., :512].expand(-1, 128, -1, -1), scale=0.1352)

    us = median_us(layer, warmup=3, runs=20)
    rows.append({"op": "mla_decode_layer", "key": f"batch=1 ctx={tokens} index_heads=64 topk=2048",
                 "torch": "bf16 indexer + torch.topk + gather + SDPA", "median_us": us})
    del cache, index_k


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["all", "kv", "mla"], default="all",
                        help="kv: the K/V kernels' baselines; mla: the MLA ones (kernels --only=mla)")
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    rows = []

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32).to(dtype)

    if args.only in ("all", "kv"):
        kv_rows(args, dev, gen, randn, rows)
    if args.only in ("all", "mla"):
        mla_rows(args, dev, gen, randn, rows)


    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                   "rows": rows}, f, indent=2)
    for r in rows:
        print(f"torch {r['op']:16s} {r['key']:28s} {r['median_us']:10.1f} us  ({r['torch']})")


if __name__ == "__main__":
    sys.exit(main())
