"""Plots bus bandwidth against message size from the CSV files of allreduce_bench.py.

Each CSV holds one run (one world size); every peer in it (horo, gloo, mpi) becomes a line, styled
by peer and labelled with the run's label:

    python examples/benchmarks/allreduce_bench.py -np 2 --csv /tmp/np2.csv
    python examples/benchmarks/allreduce_bench.py -np 4 --csv /tmp/np4.csv
    python examples/benchmarks/plot_busbw.py "2 ranks=/tmp/np2.csv" "4 ranks=/tmp/np4.csv" -o docs/busbw.png

Needs matplotlib (``pip install matplotlib``); nothing else in Horo does.
"""
import argparse
import csv

_PEER_COLOURS = {"horo": "tab:blue", "gloo": "tab:orange", "mpi": "tab:green"}
_RUN_STYLES = ["-", "--", ":", "-."]


def read_run(path):
    """{peer: [(size_bytes, busbw_GBps), ...]} of one allreduce_bench CSV."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    peers = [key[:-len("_busbw_GBps")] for key in rows[0] if key.endswith("_busbw_GBps")]
    return {p: [(int(r["size_bytes"]), float(r[f"{p}_busbw_GBps"])) for r in rows] for p in peers}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="LABEL=CSV_PATH, one per allreduce_bench run")
    p.add_argument("-o", "--output", default="busbw.png", help="PNG to write (default busbw.png)")
    p.add_argument("--title", default="Allreduce bus bandwidth (float32 sum), one host")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for index, spec in enumerate(args.runs):
        label, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"run {spec!r}: expected LABEL=CSV_PATH")
        style = _RUN_STYLES[index % len(_RUN_STYLES)]
        for peer, points in read_run(path).items():
            sizes, busbw = zip(*points)
            ax.plot(sizes, busbw, style, marker="o", markersize=3, color=_PEER_COLOURS.get(peer),
                    label=f"{peer}, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s) = size / latency * 2(n-1)/n")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
