"""Data-parallel training of a small MLP on scikit-learn's 8x8 handwritten digits.

The data set ships inside scikit-learn (nothing is downloaded). Every rank trains on its own shard
of the training set; gradients are averaged by DistributedOptimizer; the test accuracy is computed
on every rank's shard of the test set and combined with hvd.allreduce. Rank 0 alone prints progress
and writes the checkpoint.

    pip install scikit-learn      # or, in a checkout of Horo: pip install -e '.[examples]'
    hororun -np 2 python examples/pytorch/pytorch_digits.py
"""
import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horo_torch as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.001, help="Adam learning rate of one rank; scaled by the "
                                                                  "number of ranks")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "horo-digits", "checkpoint.pt"),
                        help="where rank 0 writes the trained model and optimizer state")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    return args


def load_data(seed):
    """Pixels scaled to [0, 1]; a fixed, stratified 75/25 train/test split (the same on every rank)."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(range(len(y)), test_size=0.25, stratify=digits.target, random_state=seed)
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 64)
        self.fc3 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def evaluate(model, test_set):
    """Loss and accuracy over the whole test set: each rank scores every size-th sample from its
    rank on, and the sums are combined across ranks with allreduce."""
    x, y = test_set.tensors
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model.eval()
    with torch.no_grad():
        logits = model(x)
        totals = torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                               (logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    loss_sum, correct, count = hvd.allreduce(totals, op=hvd.Sum, name="test_metrics").tolist()
    return loss_sum / count, correct / count


def main():
    args = parse_args()
    torch.set_num_threads(1)  # one thread per rank: ranks share the machine's cores
    hvd.init()
    torch.manual_seed(args.seed)

    train_set, test_set = load_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = MLP()
    # The usual Horovod lines: scale the learning rate by the number of ranks, wrap the optimizer,
    # and start every rank from rank 0's parameters and optimizer state.
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        test_loss, accuracy = evaluate(model, test_set)
        if hvd.rank() == 0:
            print(f"epoch {epoch}/{args.epochs}: test loss {test_loss:.4f}, test accuracy {accuracy:.4f}", flush=True)

    if hvd.rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
        torch.save({"epoch": args.epochs, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "test_accuracy": accuracy}, args.checkpoint)
        print(f"final test accuracy: {accuracy:.4f} on {len(test_set)} samples, {hvd.size()} ranks", flush=True)
        print(f"checkpoint written to {args.checkpoint}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
