"""Autotune against fixed settings: the steady-state step time that HORO_AUTOTUNE reaches, compared
with the best of several fixed settings, on the same training-like workload, in one invocation.

The workload is the gradient allreduce of one training step of ResNet-50: its 161 parameter tensors
(25.6 M float32 values, optionally scaled down with --scale), submitted in backward order with
``horo_torch.allreduce_async_`` while a simulated backward pass runs (--compute-ms of sleep spread
over the layers, as GPU compute would leave the CPU free), then waited for, as
``DistributedOptimizer`` does. Every job checks the exact reduced values once.

Each configuration runs as its own job of --np ranks (settings are read at init):

* every fixed setting of --fixed (fusion threshold MiB / cycle time ms / small-message bytes);
* autotune: HORO_AUTOTUNE=1 with a log file; the job runs enough steps for the tuner to finish
  (the bound follows from the autotune options), then times --steps more steps with the setting it
  chose. The chosen setting is read from the log's "best" row.

A job's value is the slowest rank's median step time over the --steps timed steps (after --warmup
untimed ones). All configurations run --rounds times in a rotating order, and the table reports the
median over rounds, so that a neighbour's burst of load does not favour one configuration; the
ratio compares autotune with the best fixed setting measured in the same invocation.

    python examples/benchmarks/autotune_bench.py                 # 2 ranks, defaults
    python examples/benchmarks/autotune_bench.py --scale 1 --rounds 3
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

# Default fixed settings: Horo's defaults, no fusion, small buffers, Horovod's 1 ms cycle, a long
# batching delay, and the ring for every size.
DEFAULT_FIXED = "64/0/65536,0/0/65536,4/0/65536,64/1/65536,16/5/65536,64/0/0"
MEASUREMENTS_PER_SAMPLE = 5  # ThroughputSampler::kMeasurementsPerSample
CROSSOVER_CANDIDATES = 5     # ParameterManager::CrossoverCandidates


def resnet50_gradient_sizes():
    """Element counts of ResNet-50's parameters in definition order (conv weights, BN scale and bias)."""
    sizes = [7 * 7 * 3 * 64, 64, 64]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out = 4 * width
            sizes += [in_channels * width, width, width, 9 * width * width, width, width, width * out, out, out]
            if block == 0:
                sizes += [in_channels * out, out, out]  # projection shortcut
            in_channels = out
    sizes += [2048 * 1000, 1000]
    return sizes


def parse_fixed(text):
    settings = []
    for item in text.split(","):
        fusion_mb, cycle_ms, small = item.split("/")
        settings.append((float(fusion_mb), float(cycle_ms), int(small)))
    return settings


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--np", type=int, default=2, dest="np", help="ranks per job (default 2)")
    p.add_argument("--scale", type=float, default=0.25,
                   help="multiply every gradient's size by this (default 0.25: 6.4 M values, 26 MB)")
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated backward compute per step, spread over the layers (default 20)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing (default 10)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per job (default 40)")
    p.add_argument("--rounds", type=int, default=2, help="times every configuration runs (default 2)")
    p.add_argument("--fixed", default=DEFAULT_FIXED,
                   help="fixed settings to compare, comma-separated FUSION_MB/CYCLE_MS/SMALL_BYTES "
                        f"(default {DEFAULT_FIXED})")
    p.add_argument("--autotune-warmup-samples", type=int, default=1)
    p.add_argument("--autotune-steps-per-sample", type=int, default=3)
    p.add_argument("--autotune-bayes-opt-max-samples", type=int, default=12)
    p.add_argument("--autotune-gaussian-process-noise", type=float, default=0.8)
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = p.parse_args(argv)
    args.fixed = parse_fixed(args.fixed)
    return args


def tuning_step_bound(args):
    """Steps within which the tuner must finish: every sample takes 5 measurements, plus up to two
    steps to restart its window after a change of parameters."""
    samples = args.autotune_warmup_samples + args.autotune_bayes_opt_max_samples + CROSSOVER_CANDIDATES
    return samples * (MEASUREMENTS_PER_SAMPLE * args.autotune_steps_per_sample + 2)


# ---------------------------------------------------------------------------------------------------
# One job (runs on every rank)
# ---------------------------------------------------------------------------------------------------

def train_steps(sizes, untimed, timed, compute_ms):
    """Runs untimed + timed steps; returns this rank's median step time (s) over the timed ones."""
    import torch

    import horo_torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    grads = [torch.zeros(n) for n in sizes]
    # Sleep in a few chunks: one sleep per layer would cost more in timer slack than it simulates.
    chunks = 16
    pause = compute_ms / 1000.0 / chunks
    every = max(1, len(sizes) // chunks)
    for g in grads:
        g.fill_(rank + 1)
    for i, g in enumerate(grads):  # one exact check before anything is timed
        hvd.allreduce_(g, name=f"grad.{i}", op=hvd.Sum)
        if not bool((g == size * (size + 1) / 2).all()):
            raise AssertionError(f"rank {rank}: grad.{i} reduced to {g[:4].tolist()}")
    times = []
    for step in range(untimed + timed):
        t0 = time.perf_counter()
        handles = []
        for k, i in enumerate(reversed(range(len(grads)))):
            if k % every == 0 and pause > 0:
                time.sleep(pause)
            handles.append(hvd.allreduce_async_(grads[i], name=f"grad.{i}", op=hvd.Average))
        for h in handles:
            hvd.synchronize(h)
        if step >= untimed:
            times.append(time.perf_counter() - t0)
    hvd.shutdown()
    return statistics.median(times)


def run_job(args, sizes, env, untimed):
    import horo_runner

    medians = horo_runner.run(train_steps, args=(sizes, untimed, args.steps, args.compute_ms), np=args.np,
                              env=env)
    return max(medians)


def fixed_env(setting):
    fusion_mb, cycle_ms, small = setting
    return {"HORO_FUSION_THRESHOLD": str(int(fusion_mb * (1 << 20))), "HORO_CYCLE_TIME": f"{cycle_ms:g}",
            "HORO_SMALL_MESSAGE_BYTES": str(small)}


def describe(fusion_mb, cycle_ms, small):
    return f"fusion {fusion_mb:g} MiB, cycle {cycle_ms:g} ms, small msgs <= {small} B"


def run_autotune(args, sizes, log_dir, round_index):
    log = os.path.join(log_dir, f"autotune.{round_index}.csv")
    env = {"HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": log,
           "HORO_AUTOTUNE_WARMUP_SAMPLES": str(args.autotune_warmup_samples),
           "HORO_AUTOTUNE_STEPS_PER_SAMPLE": str(args.autotune_steps_per_sample),
           "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.autotune_bayes_opt_max_samples),
           "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": str(args.autotune_gaussian_process_noise)}
    seconds = run_job(args, sizes, env, tuning_step_bound(args) + args.warmup)
    with open(log, newline="") as f:
        rows = list(csv.reader(f))
    best = [r for r in rows if r and r[0] == "best"]
    if not best:
        raise RuntimeError(f"autotune did not finish within {tuning_step_bound(args)} steps (log {log})")
    _, cycle, fusion, small, _ = best[0]
    return seconds, (float(fusion), float(cycle), int(small)), len(rows) - 2


# ---------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    sizes = [max(1, int(n * args.scale)) for n in resnet50_gradient_sizes()]
    total_mb = sum(sizes) * 4 / 1e6
    print(f"autotune_bench: {len(sizes)} gradients, {total_mb:.1f} MB per step, {args.np} ranks, "
          f"{args.compute_ms:g} ms simulated compute; autotune needs at most {tuning_step_bound(args)} steps",
          flush=True)
    names = [describe(*s) for s in args.fixed] + ["autotune"]
    results = {n: [] for n in names}
    chosen = []
    with tempfile.TemporaryDirectory(prefix="autotune_bench.") as log_dir:
        for r in range(args.rounds):
            order = list(range(len(names)))
            order = order[r % len(order):] + order[:r % len(order)]
            for index in order:
                name = names[index]
                started = time.perf_counter()
                if name == "autotune":
                    seconds, setting, samples = run_autotune(args, sizes, log_dir, r)
                    chosen.append(setting)
                    detail = f"chose {describe(*setting)} after {samples} samples"
                else:
                    seconds = run_job(args, sizes, fixed_env(args.fixed[index]), args.warmup)
                    detail = ""
                results[name].append(seconds)
                print(f"autotune_bench: round {r + 1}: {name}: {seconds * 1e3:.2f} ms/step {detail} "
                      f"(job took {time.perf_counter() - started:.0f} s)", flush=True)

    medians = {n: statistics.median(v) for n, v in results.items()}
    best_fixed = min(medians[n] for n in names[:-1])
    best_name = min(names[:-1], key=lambda n: medians[n])
    print()
    print("| configuration | median step (ms) | vs best fixed |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {medians[n] * 1e3:.2f} | {medians[n] / best_fixed:.3f} |")
    ratio = medians["autotune"] / best_fixed
    print()
    print(f"autotune chose: {'; '.join(describe(*s) for s in chosen)}")
    print(f"autotune / best fixed ({best_name}) = {ratio:.3f}: "
          f"{'within' if ratio <= 1.10 else 'NOT within'} 10%")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["configuration", "median_step_ms", "vs_best_fixed"])
            for n in names:
                w.writerow([n, f"{medians[n] * 1e3:.3f}", f"{medians[n] / best_fixed:.4f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
