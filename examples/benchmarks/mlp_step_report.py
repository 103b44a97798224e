"""What tf1_session_step.py and tf2_tape_step.py share: the MLP's options and the report of the
modes' step times (each mode's median on every rank; the job's is the slowest rank's)."""
import argparse


def parse_args(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode and repeat")
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args()


def report(api, args, size, slowest):
    """Prints the job's step time per mode and horo's throughput against local's.

    Args:
        api: "TF1" or "TF2", for the heading.
        size: the number of ranks.
        slowest: every rank's {mode: median step time in seconds}.
    """
    job = {m: max(r[m] for r in slowest) for m in slowest[0]}
    params = args.layers * args.width * args.width
    print(f"{api} MLP: {args.layers} x {args.width}^2 ({params / 1e6:.1f}M parameters, {4 * params / 1e6:.0f} MB "
          f"of gradients), batch {args.batch_size} per rank, {size} ranks, {args.repeats} x {args.steps} "
          f"steps per mode")
    for m, seconds in job.items():
        print(f"{m:6s} step {1e3 * seconds:7.2f} ms   {size * args.batch_size / seconds:8.0f} samples/s")
    print(f"horo / local throughput: {job['local'] / job['horo']:.2f}")
