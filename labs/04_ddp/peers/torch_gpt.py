#!/usr/bin/env python3
"""The course's GPT written as a plain PyTorch eager nn.Module: the peer of lab 04's demo.

Same shapes as dtl::model::GPT (learned positions, pre-LN blocks, fused qkv, attention written
out with a causal mask, tanh GELU, tied head, biases, no dropout), the same AdamW
(dtl/optim.hpp: lr 3e-3, betas 0.9/0.95, eps 1e-8, no weight decay) and the same thread rule
as the dtl Runtime (cores / ranks on this machine). One step = zero_grad, forward, loss,
backward, optimizer step; the first step is warm-up. With --ranks 2 it runs DistributedDataParallel
over gloo with the demo's buckets (1 MiB), each rank on global_batch / ranks rows, and a step
takes as long as its slowest rank.

Prints one line: `peer step_ms=<median> ...`, what compare.py reads.

  python3 torch_gpt.py --batch 64                  one process, the demo model
  python3 torch_gpt.py --ranks 2 --batch 128       DDP over gloo, 2 processes
"""
import argparse
import math
import os
import socket
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        # A plain attribute, not a buffer: DDP would broadcast a buffer, and gloo has no bool.
        self.future = torch.ones(seq, seq, dtype=torch.bool).triu(1)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(self.future[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, d))


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, seq)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, d):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def adamw(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay}, {"params": no_decay}], lr=3e-3,
                             betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def train(rank, world, args):
    if world > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(1234)
    model = GPT(args.vocab, args.seq, args.layers, args.heads, args.d_model)
    step_model = model
    if world > 1:
        step_model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = adamw(model)
    rows = args.batch // world
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(args.vocab, (rows, args.seq + 1), generator=gen)
               for _ in range(args.steps)]
    times = []
    for tokens in batches:
        start = time.perf_counter()
        opt.zero_grad()
        loss = step_model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    times = torch.tensor(times[1:], dtype=torch.float64)  # step 0 is warm-up
    if world > 1:  # the job's step is its slowest rank's
        torch.distributed.all_reduce(times, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"peer step_ms={statistics.median(times.tolist()) * 1e3:.1f} ranks={world} "
              f"threads={torch.get_num_threads()} params={params} batch={args.batch}x{args.seq}",
              flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--batch", type=int, default=64, help="GLOBAL batch (sequences per step)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--steps", type=int, default=12, help="steps, the first is warm-up")
    p.add_argument("--threads", type=int, default=0, help="0 = cores / ranks, as dtl's Runtime")
    args = p.parse_args()
    if args.ranks == 1:
        train(0, 1, args)
        return
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    torch.multiprocessing.spawn(train, args=(args.ranks, args), nprocs=args.ranks)


if __name__ == "__main__":
    main()
