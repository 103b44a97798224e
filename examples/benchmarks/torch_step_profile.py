"""Where a DistributedOptimizer training step spends its time: forward, backward (during which the
gradient allreduces already run) and step() (which waits for the ones still in flight).

    hororun -np 2 python examples/benchmarks/torch_step_profile.py

Same model as pytorch_synthetic_benchmark.py; prints each rank's median over the timed steps.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn

import horo_torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=720)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=15, help="steps; the first 3 are not timed")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = []
    for _ in range(args.layers):
        blocks += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.Linear(args.width, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    x, y = torch.randn(args.batch_size, args.width), torch.randint(0, 10, (args.batch_size,))
    loss_fn = nn.CrossEntropyLoss()
    phases = {"forward": [], "backward": [], "step": []}
    for i in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= 3:
            for name, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[name].append(value * 1e3)
    text = " ".join(f"{name} {statistics.median(v):.1f} ms" for name, v in phases.items())
    print(f"rank {hvd.rank()}: {text}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
