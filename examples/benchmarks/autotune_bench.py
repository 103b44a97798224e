"""Autotune against fixed settings: the step time that HORO_AUTOTUNE ends at, compared with the best
of several fixed settings measured in the same invocation, on the same training-like workload.

Workload: the gradient allreduce of one training step of ResNet-50, its 161 parameter tensors
(25.6 M float32 values; --scale shrinks every tensor), submitted in backward order with
``horo_torch.allreduce_async_`` while a simulated backward pass runs (--compute-ms of sleep spread
over the layers, as GPU compute would leave the CPU free), then waited for, as
``DistributedOptimizer`` does. Every configuration's first step is checked for exact values.

Everything runs in one job of --np ranks, which re-initialises Horo for each configuration (the
settings are read at init):

1. Tuning, --tunings times: init with HORO_AUTOTUNE=1, run as many steps as the tuner can need
   (the bound follows from the autotune options) and then --steps timed steps with the setting it
   chose ("autotune run": the literal steady state after tuning). The chosen setting is read from
   the autotune log's "best" row.
2. Comparison, --rounds times, in an order that rotates every round: every fixed setting of --fixed
   and every setting the tuner chose, each for --warmup untimed and --steps timed steps.

A configuration's value in one round is the slowest rank's median step time; the table shows the
median over rounds. Interleaving the configurations inside one job, instead of running them as
jobs one after the other, keeps a neighbour's burst of load on a shared host from favouring one of
them. The verdict compares each tuned setting with the best fixed setting.

    python examples/benchmarks/autotune_bench.py                   # 2 ranks, 5-10 minutes here
    python examples/benchmarks/autotune_bench.py --scale 1 --rounds 5
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

# Fixed settings (fusion MiB / cycle ms / small-message bytes): Horo's defaults, no fusion, small
# buffers, Horovod's 1 ms cycle, a long batching delay, and the ring for every size.
DEFAULT_FIXED = "64/0/65536,0/0/65536,4/0/65536,64/1/65536,16/5/65536,64/0/0"
MEASUREMENTS_PER_SAMPLE = 5  # ThroughputSampler::kMeasurementsPerSample
CROSSOVER_CANDIDATES = 5     # ParameterManager::CrossoverCandidates
SETTING_VARS = ("HORO_FUSION_THRESHOLD", "HORO_CYCLE_TIME", "HORO_SMALL_MESSAGE_BYTES", "HORO_AUTOTUNE",
                "HORO_AUTOTUNE_LOG", "HORO_AUTOTUNE_WARMUP_SAMPLES", "HORO_AUTOTUNE_STEPS_PER_SAMPLE",
                "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE")


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
    p.add_argument("-np", "--np", type=int, default=2, dest="np", help="ranks (default 2)")
    p.add_argument("--scale", type=float, default=0.25,
                   help="multiply every gradient's size by this (default 0.25: 6.4 M values, 26 MB)")
    p.add_argument("--compute-ms", type=float, default=20.0,
                   help="simulated backward compute per step, spread over the layers (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per configuration and round (default 5)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration and round (default 20)")
    p.add_argument("--rounds", type=int, default=6, help="rounds over all configurations (default 6)")
    p.add_argument("--tunings", type=int, default=2, help="independent autotune runs (default 2)")
    p.add_argument("--fixed", default=DEFAULT_FIXED,
                   help="fixed settings to compare, comma-separated FUSION_MB/CYCLE_MS/SMALL_BYTES "
                        f"(default {DEFAULT_FIXED})")
    # The autotune options default to Horo's (and Horovod's) defaults.
    p.add_argument("--autotune-warmup-samples", type=int, default=3)
    p.add_argument("--autotune-steps-per-sample", type=int, default=10)
    p.add_argument("--autotune-bayes-opt-max-samples", type=int, default=20)
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


def describe(setting):
    fusion_mb, cycle_ms, small = setting
    return f"fusion {fusion_mb:g} MiB, cycle {cycle_ms:g} ms, small msgs <= {small} B"


# ---------------------------------------------------------------------------------------------------
# On every rank
# ---------------------------------------------------------------------------------------------------

class Workload:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.sizes = [max(1, int(n * args.scale)) for n in resnet50_gradient_sizes()]
        self.grads = [torch.zeros(n) for n in self.sizes]
        # Sleep in a few chunks: one sleep per layer would cost more in timer slack than it simulates.
        chunks = 16
        self.pause = args.compute_ms / 1000.0 / chunks
        self.every = max(1, len(self.sizes) // chunks)

    def check(self, hvd):
        rank, size = hvd.rank(), hvd.size()
        for i, g in enumerate(self.grads):
            g.fill_(rank + 1)
            hvd.allreduce_(g, name=f"grad.{i}", op=hvd.Sum)
            if not bool((g == size * (size + 1) / 2).all()):
                raise AssertionError(f"rank {rank}: grad.{i} reduced to {g[:4].tolist()}")

    def step(self, hvd):
        handles = []
        for k, i in enumerate(reversed(range(len(self.grads)))):
            if k % self.every == 0 and self.pause > 0:
                time.sleep(self.pause)
            handles.append(hvd.allreduce_async_(self.grads[i], name=f"grad.{i}", op=hvd.Average))
        for h in handles:
            hvd.synchronize(h)

    def run(self, hvd, untimed, timed):
        """Checks once, runs the steps; returns the slowest rank's median timed step (s)."""
        self.check(hvd)
        times = []
        for step in range(untimed + timed):
            t0 = time.perf_counter()
            self.step(hvd)
            if step >= untimed:
                times.append(time.perf_counter() - t0)
        median = self.torch.tensor([statistics.median(times)], dtype=self.torch.float64)
        return float(hvd.allreduce(median, name="bench.median", op=hvd.Max)[0])


def with_settings(env, fn):
    """Runs fn() between hvd.init() and hvd.shutdown() with these HORO_* settings."""
    import horo_torch as hvd

    for var in SETTING_VARS:
        os.environ.pop(var, None)
    os.environ.update(env)
    hvd.init()
    try:
        return fn(hvd)
    finally:
        hvd.shutdown()


def fixed_env(setting):
    fusion_mb, cycle_ms, small = setting
    return {"HORO_FUSION_THRESHOLD": str(int(fusion_mb * (1 << 20))), "HORO_CYCLE_TIME": f"{cycle_ms:g}",
            "HORO_SMALL_MESSAGE_BYTES": str(small)}


def tune(args, workload, log):
    """One autotune run; returns (chosen setting, samples logged, median step after tuning)."""
    env = {"HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": log,
           "HORO_AUTOTUNE_WARMUP_SAMPLES": str(args.autotune_warmup_samples),
           "HORO_AUTOTUNE_STEPS_PER_SAMPLE": str(args.autotune_steps_per_sample),
           "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.autotune_bayes_opt_max_samples),
           "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": str(args.autotune_gaussian_process_noise)}

    def body(hvd):
        seconds = workload.run(hvd, tuning_step_bound(args), args.steps)
        chosen = None
        if hvd.rank() == 0:
            with open(log, newline="") as f:
                rows = list(csv.reader(f))
            best = [r for r in rows if r and r[0] == "best"]
            if best:
                _, cycle, fusion, small, _ = best[0]
                chosen = ((float(fusion), float(cycle), int(small)), len(rows) - 2)
        chosen = hvd.broadcast_object(chosen, root_rank=0, name="bench.chosen")
        if chosen is None:
            raise RuntimeError(f"autotune did not finish within {tuning_step_bound(args)} steps (log {log})")
        return chosen[0], chosen[1], seconds

    return with_settings(env, body)


def bench(args):
    """The whole benchmark on one rank; rank 0's return value is the report."""
    workload = Workload(args)
    rank = int(os.environ.get("HORO_RANK", "0"))
    say = (lambda text: print(f"autotune_bench: {text}", flush=True)) if rank == 0 else (lambda text: None)
    say(f"{len(workload.sizes)} gradients, {sum(workload.sizes) * 4 / 1e6:.1f} MB per step, {args.np} ranks, "
        f"{args.compute_ms:g} ms simulated compute; autotune needs at most {tuning_step_bound(args)} steps")
    tuned = []
    with tempfile.TemporaryDirectory(prefix="autotune_bench.") as log_dir:
        for t in range(args.tunings):
            started = time.perf_counter()
            setting, samples, seconds = tune(args, workload, os.path.join(log_dir, f"rank{rank}.{t}.csv"))
            tuned.append((setting, seconds))
            say(f"autotune run {t + 1}: chose {describe(setting)} after {samples} samples; "
                f"{seconds * 1e3:.2f} ms/step after tuning ({time.perf_counter() - started:.0f} s)")
    configs = [("fixed", s) for s in args.fixed] + [(f"autotune {t + 1}", s) for t, (s, _) in enumerate(tuned)]
    results = [[] for _ in configs]
    for r in range(args.rounds):
        started = time.perf_counter()
        order = list(range(len(configs)))
        order = order[r % len(order):] + order[:r % len(order)]
        for index in order:
            seconds = with_settings(fixed_env(configs[index][1]),
                                    lambda hvd: workload.run(hvd, args.warmup, args.steps))
            results[index].append(seconds)
        say(f"round {r + 1}/{args.rounds} took {time.perf_counter() - started:.0f} s")
    return configs, results, tuned


def report(args, configs, results, tuned):
    medians = [statistics.median(v) for v in results]
    fixed = [i for i, (kind, _) in enumerate(configs) if kind == "fixed"]
    best = min(fixed, key=lambda i: medians[i])
    rows = [(f"{kind}: {describe(s)}", medians[i] * 1e3, medians[i] / medians[best])
            for i, (kind, s) in enumerate(configs)]
    print()
    print(f"{args.np} ranks, median over {args.rounds} rounds of the slowest rank's median step:")
    print("| configuration | step (ms) | vs best fixed |")
    print("|---|---:|---:|")
    for name, ms, ratio in rows:
        print(f"| {name} | {ms:.2f} | {ratio:.3f} |")
    print()
    for t, (setting, seconds) in enumerate(tuned):
        ratio = medians[len(args.fixed) + t] / medians[best]
        print(f"autotune {t + 1}: steady state {ratio:.3f} x the best fixed setting "
              f"({'within' if ratio <= 1.10 else 'NOT within'} 10%); its own run after tuning: "
              f"{seconds * 1e3:.2f} ms/step")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["configuration", "median_step_ms", "vs_best_fixed"])
            for name, ms, ratio in rows:
                w.writerow([name, f"{ms:.3f}", f"{ratio:.4f}"])


def main(argv=None):
    import horo_runner

    args = parse_args(argv)
    configs, results, tuned = horo_runner.run(bench, args=(args,), num_proc=args.np)[0]
    report(args, configs, results, tuned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
