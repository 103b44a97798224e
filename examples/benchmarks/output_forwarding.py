"""How fast hororun forwards what its ranks print, against the same ranks' output read straight from
their pipes.

    python examples/benchmarks/output_forwarding.py
    python examples/benchmarks/output_forwarding.py --mb 64 --repeats 7

Each run starts 2 ranks that write --mb MB to stdout in one of three shapes, and times the whole
job until its output has reached /dev/null:

* ``lines``: 80-byte lines (logs, progress);
* ``long``: one line of --mb MB (a JSON dump, binary output without newlines);
* ``cr``: 80-byte pieces ending in a lone carriage return (progress bars).

``hororun`` is ``hororun -np 2 python -c <writer>``; ``direct`` starts the same two writers with
subprocess and drains their pipes in 64 KiB reads, the least any launcher that keeps the ranks'
output apart must do. The table gives medians of --repeats runs and hororun's time over direct's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

WRITER = """
import sys
shape, total = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
if shape == "long":
    piece = b"x" * (1 << 20)
    for _ in range(total // len(piece)):
        out.write(piece)
    out.write(b"\\n")
else:
    end = b"\\n" if shape == "lines" else b"\\r"
    block = (b"y" * 79 + end) * 8192
    for _ in range(total // len(block)):
        out.write(block)
out.flush()
"""


def hororun_seconds(shape, total):
    command = [sys.executable, "-m", "horo_runner.launch", "-np", "2", sys.executable, "-c", WRITER, shape, str(total)]
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def direct_seconds(shape, total):
    def drain(pipe):
        while os.read(pipe.fileno(), 65536):
            pass

    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, shape, str(total)], stdout=subprocess.PIPE)
             for _ in range(2)]
    readers = [threading.Thread(target=drain, args=(p.stdout,)) for p in procs]
    for reader in readers:
        reader.start()
    for reader, proc in zip(readers, procs):
        reader.join()
        proc.wait()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=32, help="MB each rank writes (default 32)")
    p.add_argument("--repeats", type=int, default=5, help="runs per cell; the median counts (default 5)")
    p.add_argument("--shapes", default="lines,long,cr", help="comma-separated: lines, long, cr")
    args = p.parse_args()
    total = args.mb << 20
    print(f"2 ranks, {args.mb} MB each; medians of {args.repeats} runs")
    print(f"| shape | hororun | direct | hororun / direct | hororun MB/s (both ranks) |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        times = {"hororun": [], "direct": []}
        for _ in range(args.repeats):  # interleaved, so that a slow period hits both
            times["hororun"].append(hororun_seconds(shape, total))
            times["direct"].append(direct_seconds(shape, total))
        h, d = (statistics.median(times[k]) for k in ("hororun", "direct"))
        print(f"| {shape} | {h:.2f} s | {d:.2f} s | {h / d:.2f} | {2 * args.mb / h:.0f} |", flush=True)


if __name__ == "__main__":
    main()
