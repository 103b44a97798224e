"""What recording the timeline costs: allreduce step time with the timeline off and on, in one job.

Each rank alternates blocks of steps with the timeline off and on (start_timeline / stop_timeline
on every rank, HORO_TIMELINE=DYNAMIC), so both are measured under the same machine load. A step is
either one allreduce of a small tensor (negotiation dominates) or a grouped allreduce of many small
tensors (one fused response, every tensor traced). Per block the slowest rank's mean step time
counts, and so does the CPU time all ranks used per step (every thread: background loops, rank 0's
writer), which a busy machine disturbs less than wall time; the table shows medians over the
blocks and the ratios on/off.

    python examples/benchmarks/timeline_overhead.py -np 2 --steps 300 --blocks 5
"""
import argparse
import os
import statistics
import tempfile
import time

import horo_runner


def measure(steps, blocks, tensors, elements, directory):
    import torch

    import horo_torch as hvd
    hvd.init()
    rank = hvd.rank()
    workloads = {
        "1 allreduce": lambda: hvd.allreduce(torch.ones(elements), name="single", op=hvd.Sum),
        f"{tensors} fused": lambda: hvd.grouped_allreduce([torch.ones(elements) for _ in range(tensors)],
                                                         name="group", op=hvd.Sum),
    }
    times = {(w, mode): [] for w in workloads for mode in ("off", "on")}
    cpu = {(w, mode): [] for w in workloads for mode in ("off", "on")}
    for block in range(blocks):
        for mode in ("off", "on") if block % 2 == 0 else ("on", "off"):
            if mode == "on":
                hvd.start_timeline(os.path.join(directory, f"timeline_{block}.json"), mark_cycles=True)
            for name, step in workloads.items():
                step()  # warm-up (and response cache)
                begin, begin_cpu = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    step()
                times[(name, mode)].append((time.perf_counter() - begin) / steps)
                cpu[(name, mode)].append((time.process_time() - begin_cpu) / steps)
            if mode == "on":
                hvd.stop_timeline()
    sizes = [os.path.getsize(os.path.join(directory, f"timeline_{b}.json")) for b in range(blocks)] if rank == 0 else []
    hvd.shutdown()
    return {"times": times, "cpu": cpu, "file_bytes": sizes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="steps per block and workload")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per mode")
    parser.add_argument("--tensors", type=int, default=32, help="tensors of the fused workload")
    parser.add_argument("--elements", type=int, default=256, help="float32 elements per tensor")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        reports = horo_runner.run(measure, args=(args.steps, args.blocks, args.tensors, args.elements, directory),
                                  num_proc=args.np, env={"HORO_TIMELINE": "DYNAMIC"})
    keys = reports[0]["times"].keys()
    # A collective goes at the pace of its slowest rank.
    slowest = {k: [max(r["times"][k][b] for r in reports) for b in range(args.blocks)] for k in keys}
    cpu = {k: [sum(r["cpu"][k][b] for r in reports) for b in range(args.blocks)] for k in keys}
    print(f"{args.np} ranks, {args.steps} steps x {args.blocks} blocks, {args.elements} float32 per tensor")
    print(f"{'workload':<14}{'wall off':>10}{'wall on':>10}{'on/off':>8}{'cpu off':>10}{'cpu on':>10}{'on/off':>8}"
          "   (us per step; cpu: all ranks)")
    for name in dict.fromkeys(k[0] for k in keys):
        off, on = (statistics.median(slowest[(name, m)]) * 1e6 for m in ("off", "on"))
        cpu_off, cpu_on = (statistics.median(cpu[(name, m)]) * 1e6 for m in ("off", "on"))
        print(f"{name:<14}{off:>10.1f}{on:>10.1f}{on / off:>8.2f}{cpu_off:>10.1f}{cpu_on:>10.1f}{cpu_on / cpu_off:>8.2f}")
    per_block = statistics.median(reports[0]["file_bytes"])
    print(f"timeline file per block: {per_block / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
