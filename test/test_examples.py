"""The shipped examples run under hororun and verify their own results."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = ["allreduce Sum", "allreduce Average", "allreduce Max (bfloat16)",
          "allgather with different first dimensions", "broadcast from rank 0"]


def test_pytorch_collectives_demo_under_hororun():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    demo = os.path.join(ROOT, "examples", "pytorch", "pytorch_collectives_demo.py")
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "2", sys.executable, demo], env=env,
                          text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = [f"[{r}]<stdout>:rank {r}/2: {check}: ok" for r in range(2) for check in CHECKS]
    want.append("[0]<stdout>:all collectives verified on 2 ranks")
    assert sorted(proc.stdout.splitlines()) == sorted(want)
    assert "FAILED" not in proc.stderr


def test_allreduce_bench_under_hororun_with_and_without_binding():
    """The benchmark checks every peer's sums before timing; here Horo and the memory floor, two small
    sizes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "allreduce_bench.py")
    from horo_runner.binding import physical_cores
    enough_cores = len(physical_cores(sorted(os.sched_getaffinity(0)))) >= 2
    bindings = ["none", "auto", "core"] if enough_cores else ["none", "auto"]
    for bind in bindings:
        proc = subprocess.run([sys.executable, bench, "-np", "2", "--launcher", "hororun", "--peers", "horo,floor",
                               "--sizes", "4,4K", "--repeats", "1", "--bind-to", bind], env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"-np 2 --bind-to {bind} " in proc.stdout
        rows = [line for line in proc.stdout.splitlines() if line.startswith(("| 4 B |", "[0]<stdout>:| 4 B |",
                                                                              "| 4 KB |", "[0]<stdout>:| 4 KB |"))]
        assert len(rows) == 2, proc.stdout
        assert "horo/floor |" in proc.stdout and all(row.count("|") == 7 for row in rows), proc.stdout


def test_allreduce_bench_times_the_other_collectives_with_checked_results():
    """--collective: every peer's broadcast, allgather, alltoall and reducescatter result is checked
    exactly before timing (gloo's too for the last two); 3 ranks, so that each rank's part of a result
    has its own value."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "allreduce_bench.py")
    for collective, peers in (("broadcast", "horo,floor"), ("allgather", "horo,floor"), ("alltoall", "horo,gloo"),
                              ("reducescatter", "horo,gloo")):
        proc = subprocess.run([sys.executable, bench, "-np", "3", "--launcher", "hororun", "--peers", peers,
                               "--sizes", "12,12K", "--repeats", "1", "--collective", collective], env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"[0]<stdout>:{collective} float32, 3 ranks;" in proc.stdout, proc.stdout
        rows = [line for line in proc.stdout.splitlines() if line.startswith(("[0]<stdout>:| 12 B |",
                                                                              "[0]<stdout>:| 12 KB |"))]
        assert len(rows) == 2 and all(row.count("|") == 7 for row in rows), proc.stdout
    proc = subprocess.run([sys.executable, bench, "-np", "3", "--launcher", "hororun", "--peers", "horo",
                           "--sizes", "16", "--repeats", "1", "--collective", "reducescatter"], env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode != 0 and "reducescatter sizes must be multiples of 4 * 3 bytes" in proc.stdout + proc.stderr


def test_average_bench_checks_its_results_on_three_ranks():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "average_bench.py")
    # 3 ranks: uneven ring blocks, and an average (2.0) that is not the sum (6.0).
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "3", sys.executable, bench,
                           "--tensors", "3", "--elements", "70001", "--rounds", "2", "--warmup", "1"], env=env,
                          text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for label in ("Average", "Sum"):
        assert f"[0]<stdout>:{label}: " in proc.stdout and "per round of 3 tensors (0.8 MB), 3 ranks" in proc.stdout


def run_benchmark(script, *args, np=None):
    """Runs examples/benchmarks/script with args, on np ranks through the launcher (None: alone),
    without the test run's own Horo settings; returns the finished process, checked to exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    launch = [sys.executable, "-m", "horo_runner.launch", "-np", str(np)] if np else []
    bench = os.path.join(ROOT, "examples", "benchmarks", script)
    proc = subprocess.run([*launch, sys.executable, bench, *args], env=env, text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


CALL_OVERHEAD_LAYERS = ["hvd.allreduce_", "hvd.allreduce_ unwrapped", "Runtime.run_prepared", "bound run",
                        "lib.horo_run_at + reads", "lib.horo_run_at (cffi)"]


def test_call_overhead_times_each_layer_on_one_rank():
    proc = run_benchmark("call_overhead.py", "--calls", "300", "--repeats", "1", "--bytes", "64")
    labels = [line.split("  ")[0] for line in proc.stdout.splitlines() if line.endswith("us per call")]
    assert labels == CALL_OVERHEAD_LAYERS, proc.stdout


def test_call_overhead_times_each_layer_on_two_ranks():
    proc = run_benchmark("call_overhead.py", "--calls", "200", "--repeats", "2", np=2)
    lines = [line.split(":", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    labels = [line.split("  ")[0] for line in lines if line.endswith("us per call")]
    assert labels == CALL_OVERHEAD_LAYERS, proc.stdout
    assert "(2 ranks: median over 2 repeats of the slowest rank)" in lines, proc.stdout


def test_async_step_checks_its_values_on_two_ranks():
    proc = run_benchmark("async_step.py", "--tensors", "5", "--steps", "3", "--repeats", "1", "--warmup", "1", np=2)
    assert "[0]<stdout>:2 ranks: " in proc.stdout and "per step of 5 async allreduces" in proc.stdout, proc.stdout


def test_wait_at_once_times_each_entry_point_on_two_ranks():
    proc = run_benchmark("wait_at_once.py", "--calls", "50", "--repeats", "1", np=2)
    lines = [line.split(":", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    timed = [line for line in lines if line.endswith(" background passes per call")]
    assert [line.split("  ")[0] for line in timed] == [
        "allreduce_", "allreduce", "allreduce_async_ + synchronize", "allreduce_async + synchronize"], proc.stdout
    assert all(float(line.split(", ")[1].split()[0]) >= 0 for line in timed), proc.stdout  # the passes per call


def test_poll_loop_bench_checks_each_way_of_waiting():
    proc = run_benchmark("poll_loop_bench.py", "--calls", "20", "--repeats", "1", np=2)
    for way in ("synchronize", "busy poll", "poll and sleep 0.1 ms"):
        assert f"[0]<stdout>:| {way} | " in proc.stdout, proc.stdout


def test_tight_loop_reports_what_a_call_costs():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "tight_loop.py")
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "2", "--bind-to", "none", sys.executable,
                           bench, "--one-core", "--calls", "300", "--blocks", "2", "--warmup", "100"], env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split(":", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    assert lines[0].startswith("2 ranks, 4 B: per-call us ") and " median " in lines[0], proc.stdout
    words = lines[1].split()
    assert lines[1].startswith("per call, mean over ranks: ") and words[6:] == [
        "rounds,", words[7], "caller", "passes,", words[10], "polls,", words[12], "yields,", words[14], "involuntary",
        "switches"], proc.stdout
    # Every call takes a round at least (test_caller_progress.py checks that it takes about one).
    assert float(words[5]) >= 0.99, proc.stdout


def test_allreduce_bench_under_mpirun_binds_its_ranks_as_hororun_does():
    """Started by mpirun (--bind-to none), each rank binds itself to the CPUs hororun --bind-to auto
    gives it: here 3 ranks, more than CI's 2 cores, so neighbouring ranks share a core."""
    from horo_runner.binding import format_cpus, rank_cpu_sets
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "allreduce_bench.py")
    proc = subprocess.run([sys.executable, bench, "-np", "3", "--launcher", "mpirun", "--peers", "horo,mpi",
                           "--sizes", "4", "--repeats", "1"], env=env, text=True, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    allowed = sorted(os.sched_getaffinity(0))
    expected = [format_cpus(c if c is not None else allowed) for c in rank_cpu_sets("auto", 3, allowed)]
    assert f"allreduce_bench: CPUs of the ranks: {' / '.join(expected)}\n" in proc.stdout, proc.stdout
    assert "horo/mpi |" in proc.stdout, proc.stdout


def test_small_call_cost_checks_every_pattern_under_mpirun():
    """The benchmark relaunches itself under mpirun and checks each pattern's sum before timing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "benchmarks", "small_call_cost.py")
    proc = subprocess.run([sys.executable, bench, "-np", "2", "--calls", "200", "--blocks", "2", "--extra-us", "1"],
                          env=env, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["pattern", "horo", "mpi", "mpi+work", "exchange", "doubling"], proc.stdout
    assert "2 ranks, 4 B, extra work 1 us, pin none" in proc.stdout, proc.stdout


def test_pytorch_synthetic_benchmark_reports_ratios_and_checks_replicas():
    """A tiny model through all three modes: the table, both ceiling ratios, and the end-of-job check
    that Horo's and DDP's replicas agree on every rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    bench = os.path.join(ROOT, "examples", "pytorch", "pytorch_synthetic_benchmark.py")
    proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "-np", "2", sys.executable, bench,
                           "--width", "32", "--layers", "3", "--num-warmup", "1", "--num-iters", "2", "--repeats", "2",
                           "--no-cuda"],
                          env=env, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [line.split(":", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[0]<stdout>:")]
    modes = ("compute only", "horo", "ddp (gloo)")
    rows = {line[:14].strip(): line[14:].split() for line in out if line[:14].strip() in modes}
    assert sorted(rows) == ["compute only", "ddp (gloo)", "horo"], proc.stdout
    assert all(len(v) == 3 and all(float(x) > 0 for x in v) for v in rows.values()), rows  # median + 2 runs
    paired = [line for line in out if line.startswith("horo / ceiling per repeat: ")]
    assert len(paired) == 1 and paired[0].count("(median ") == 1, proc.stdout
    assert "parameters agree across ranks: horo, ddp (gloo)" in out, proc.stdout


def example_scripts():
    """Every example a user runs: the .py files under examples/ with a __main__ block."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "examples")):
        for f in sorted(files):
            path = os.path.join(folder, f)
            if not f.endswith(".py"):
                continue
            with open(path) as source:
                if 'if __name__ == "__main__":' in source.read():
                    found.append(path)
    return sorted(found)


# Runs each script given on the command line with --help, one after the other in this process, and
# prints one JSON line per script: its exit code, what it printed, and the error that ended it.
_HELP_OF_EACH = """
import contextlib, io, json, os, runpy, sys, traceback
for path in sys.argv[1:]:
    out, code, error = io.StringIO(), None, ""
    sys.argv, sys.path[0] = [path, "--help"], os.path.dirname(path)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as ended:
        code = ended.code
    except BaseException:
        error = traceback.format_exc()
    print(json.dumps({"path": path, "code": code, "stdout": out.getvalue(), "error": error}), flush=True)
"""


def _framework_of(path):
    """The framework a script imports at its top ("tensorflow", "torch" or ""), so that scripts that
    import the same one share a process: importing TensorFlow takes 9 s of CPU here, torch 3 s."""
    with open(path) as f:
        tops = [line.split()[1].split(".")[0] for line in f if line.startswith(("import ", "from "))]
    if {"tensorflow", "horo_tf", "keras"} & set(tops):
        return "tensorflow"
    return "torch" if {"torch", "horo_torch"} & set(tops) else ""


def test_every_example_answers_help():
    # Two demos had no argument parser and ran the whole job on --help; five help texts stopped
    # mid-sentence. --help also imports each script, so a broken import shows here first. Scripts
    # that import the same framework run in one process, each as its own __main__ (runpy).
    from concurrent.futures import ThreadPoolExecutor

    scripts = example_scripts()
    assert len(scripts) >= 20
    groups = {}
    for path in scripts:
        groups.setdefault(_framework_of(path), []).append(path)
    assert len(groups["torch"]) >= 5 and len(groups["tensorflow"]) >= 3, groups

    def help_of(paths):
        return subprocess.run([sys.executable, "-c", _HELP_OF_EACH, *paths], capture_output=True, text=True,
                              timeout=300)

    answered = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for paths, done in zip(groups.values(), pool.map(help_of, groups.values())):
            assert done.returncode == 0, (paths, done.stderr)
            answered += [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["path"] for a in answered] == [p for paths in groups.values() for p in paths]
    for a in answered:
        name = os.path.basename(a["path"])
        assert a["code"] == 0 and not a["error"], (name, a["code"], a["error"])
        assert a["stdout"].startswith(f"usage: {name}"), (name, a["stdout"])
        description = a["stdout"].split("\n\n")[1]
        assert description.rstrip().endswith((".", ")")), (name, description)


def test_pytorch_digits_refuses_zero_epochs():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "pytorch", "pytorch_digits.py"),
                          "--epochs", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "--epochs must be at least 1, got 0" in out.stderr, out.stderr
