"""A first Horo job: every rank allreduces, allgathers and broadcasts torch tensors and checks the
results against values it can compute on its own.

    hororun -np 2 python examples/pytorch/pytorch_collectives_demo.py
"""
import argparse
import sys

import torch

import horo_torch as hvd


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help; no options
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    failures = []

    def check(what, ok):
        print(f"rank {rank}/{size}: {what}: {'ok' if ok else 'WRONG'}", flush=True)
        if not ok:
            failures.append(what)

    # Allreduce: rank r contributes r + 1, so the sum is size * (size + 1) / 2.
    x = torch.full((1000,), float(rank + 1))
    check("allreduce Sum", torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.full((1000,), size * (size + 1) / 2)))
    check("allreduce Average", torch.allclose(hvd.allreduce(x), torch.full((1000,), (size + 1) / 2)))
    check("allreduce Max (bfloat16)",
          torch.equal(hvd.allreduce(x.to(torch.bfloat16), op=hvd.Max), torch.full((1000,), float(size)).bfloat16()))

    # Allgather: rank r sends r + 1 rows filled with r.
    gathered = hvd.allgather(torch.full((rank + 1, 3), rank, dtype=torch.int64))
    expected = torch.cat([torch.full((r + 1, 3), r, dtype=torch.int64) for r in range(size)])
    check("allgather with different first dimensions", torch.equal(gathered, expected))

    # Broadcast: everyone ends with rank 0's tensor.
    b = hvd.broadcast(torch.arange(5, dtype=torch.float32) * (rank + 1), root_rank=0)
    check("broadcast from rank 0", torch.equal(b, torch.arange(5, dtype=torch.float32)))

    hvd.shutdown()
    if failures:
        print(f"rank {rank}: FAILED: {failures}", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"all collectives verified on {size} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
