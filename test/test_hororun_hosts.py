"""hororun's hosts (-H, --hostfile, this machine's names) and CPU binding of the ranks."""
import json
import os
import re
import socket
import threading

import pytest

from hororun_helpers import hororun, worker


# ------------------------------------------------------------------------------- hosts


def own_address():
    """A non-loopback address of this machine, or None: the one the kernel would send from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # a UDP connect sends nothing; it needs a route only
            return s.getsockname()[0]
        except OSError:
            return None


def _raise(error):
    raise error


def test_this_machines_addresses_are_local_hosts(runner_path, child_env):
    # Hostfiles are often written with IP addresses: this machine's own was refused as remote.
    from horo_runner.hosts import is_local_host
    assert all(is_local_host(h) for h in ("localhost", "127.0.0.1", "[::1]", socket.gethostname()))
    with pytest.MonkeyPatch.context() as patch:  # no DNS server asked about a name it cannot know
        patch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: _raise(socket.gaierror(socket.EAI_NONAME, "")))
        assert not any(is_local_host(h) for h in ("203.0.113.7", "otherhost", "[2001:db8::1]"))
    own = own_address()
    if own is None or own.startswith("127."):
        return  # no route off this machine: the addresses above are all it can show
    assert is_local_host(own), own
    proc = hororun(child_env, "-np", "2", "-H", f"{own}:2", *worker("print('ran')"))
    assert proc.returncode == 0, proc.stderr.decode()


def test_names_that_resolve_to_this_machine_are_local_hosts(runner_path, monkeypatch):
    # An /etc/hosts alias, or the full name of a machine that calls itself by its short one: they
    # were refused as remote hosts, where horovodrun runs them here.
    from horo_runner import hosts
    table = {"alias": ["127.0.1.1"], "node01.cluster.local": ["127.0.0.1", "::1"],
             "elsewhere": ["203.0.113.7"], "half-here": ["127.0.0.1", "203.0.113.7"]}

    def getaddrinfo(name, port, *args, **kwargs):
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
                for a in table[name]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert [hosts.is_local_host(h) for h in table] == [True, True, False, False]
    assert hosts.remote_hosts([hosts.HostSlots("alias", 2), hosts.HostSlots("nowhere", 1)]) == ["nowhere"]
    # Names that do not answer are looked up side by side, within one shared time limit.
    monkeypatch.setattr(hosts, "_LOOKUP_TIMEOUT_S", 0.5)
    stuck = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: stuck.wait(30) and [])
    try:
        assert hosts.remote_hosts([hosts.HostSlots(f"slow{i}", 1) for i in range(6)] +
                                  [hosts.HostSlots("localhost", 1)]) == [f"slow{i}" for i in range(6)]
    finally:
        stuck.set()


def test_parse_hosts_and_hostfile(runner_path, tmp_path):
    from horo_runner.hosts import HostSlots, get_host_assignments, parse_hostfile, parse_hosts
    assert parse_hosts("localhost:2, node-2:4,n3") == [
        HostSlots("localhost", 2), HostSlots("node-2", 4), HostSlots("n3", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4 max_slots=8\n\nnode2:2  # mpich style\n"
                        "pod-0.job.ns.svc slots=1\nnode4\n")
    assert parse_hostfile(str(hostfile)) == [
        HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("pod-0.job.ns.svc", 1),
        HostSlots("node4", 1)]
    assert parse_hosts("localhost:0,b:2") == [HostSlots("localhost", 0), HostSlots("b", 2)]  # as horovodrun
    assert [s.hostname for s in get_host_assignments(parse_hosts("a:0,b:2"), 2)] == ["b", "b"]
    for bad, match in (("a:-1", "cannot have -1 slots"), ("a:x", "not an integer"),
                       ("a:1,a:2", "listed more than once"), ("", "no hosts")):
        with pytest.raises(ValueError, match=match):
            parse_hosts(bad)
    hostfile.write_text("node1 slots=2\nnode2 4\n")
    with pytest.raises(ValueError, match=r"hosts:2: expected 'host slots=N'"):
        parse_hostfile(str(hostfile))


def test_host_assignments_match_horovod(runner_path):
    from horo_runner.hosts import HostSlots, get_host_assignments
    slots = get_host_assignments([HostSlots("a", 2), HostSlots("b", 1), HostSlots("c", 3)], 5)
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            for s in slots] == [("a", 0, 0, 2, 0, 3), ("a", 1, 1, 2, 0, 2), ("b", 2, 0, 1, 1, 3),
                                ("c", 3, 0, 2, 2, 3), ("c", 4, 1, 2, 1, 2)]
    assert all(s.size == 5 for s in slots)


def test_hostfile_launch(child_env, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    code = "import os; print(os.environ['HORO_LOCAL_SIZE'], os.environ['HORO_HOSTNAME'])"
    proc = hororun(child_env, "-np", "2", "--hostfile", str(hostfile), *worker(code))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["[0]<stdout>:2 localhost",
                                                        "[1]<stdout>:2 localhost"]


# ------------------------------------------------------------------------------- CPU binding

AFFINITY = """
    import json, os
    print(json.dumps(sorted(os.sched_getaffinity(0))))
"""


def affinities(proc):
    assert proc.returncode == 0, proc.stderr
    found = {}
    for line in proc.stdout.decode().splitlines():
        prefix, _, payload = line.partition(":")
        found[int(prefix[1])] = set(json.loads(payload))
    return [found[r] for r in sorted(found)]


def fake_topology(siblings, packages=None):
    """A sysfs reader for CPUs whose SMT siblings and packages are given."""
    def read(cpu, item):
        if item == "thread_siblings_list":
            return ",".join(str(c) for c in siblings[cpu])
        if item == "physical_package_id":
            return str((packages or {}).get(cpu, 0))
        return None
    return read


def test_cpu_shares_keep_smt_siblings_and_packages_together(runner_path):
    from horo_runner.binding import physical_cores, rank_cpu_sets
    # 2 packages x 2 cores x 2 threads, numbered the way Linux usually does: siblings are n and n+4.
    siblings = {c: (c % 4, c % 4 + 4) for c in range(8)}
    packages = {c: (c % 4) // 2 for c in range(8)}
    read = fake_topology(siblings, packages)
    assert physical_cores(range(8), read) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert rank_cpu_sets("auto", 2, range(8), read) == [{0, 1, 4, 5}, {2, 3, 6, 7}]
    assert rank_cpu_sets("auto", 4, range(8), read) == [{0, 4}, {1, 5}, {2, 6}, {3, 7}]
    # More ranks than cores: auto gives each rank one core, neighbours sharing; core refuses and
    # says why.
    assert rank_cpu_sets("auto", 5, range(8), read) == [{0, 4}, {0, 4}, {1, 5}, {2, 6}, {3, 7}]
    assert rank_cpu_sets("auto", 4, [0, 1], lambda cpu, item: None) == [{0}, {0}, {1}, {1}]
    assert rank_cpu_sets("auto", 3, [0, 1], lambda cpu, item: None) == [{0}, {0}, {1}]
    with pytest.raises(ValueError, match=r"5 ranks on this host but only 4 physical cores .*0-7"):
        rank_cpu_sets("core", 5, range(8), read)
    # Uneven shares: the first ranks get the extra core; a restricted mask is respected.
    assert rank_cpu_sets("core", 2, [0, 1, 2, 4, 5, 6], read) == [{0, 1, 4, 5}, {2, 6}]
    # One rank: auto leaves it alone, core gives it every core; none never binds.
    assert rank_cpu_sets("auto", 1, range(8), read) == [None]
    assert rank_cpu_sets("core", 1, range(8), read) == [set(range(8))]
    assert rank_cpu_sets("none", 4, range(8), read) == [None] * 4
    # Without sysfs every CPU is a core of its own.
    assert rank_cpu_sets("auto", 2, [3, 5, 9], lambda cpu, item: None) == [{3, 5}, {9}]
    with pytest.raises(ValueError, match="--bind-to must be one of auto, core, none, got 'socket'"):
        rank_cpu_sets("socket", 2, range(8), read)


def test_ranks_start_bound_to_their_own_cpus(child_env):
    from horo_runner.binding import format_cpus, physical_cores, rank_cpu_sets
    allowed = sorted(os.sched_getaffinity(0))
    expected = rank_cpu_sets("auto", 2, allowed)
    proc = hororun(child_env, "--verbose", "-np", "2", *worker(AFFINITY))
    found = affinities(proc)
    assert found == expected
    if len(physical_cores(allowed)) >= 2:
        assert not found[0] & found[1]
    else:  # one core: the two ranks share it
        assert found == [set(allowed)] * 2
    assert (f"hororun:   CPUs (--bind-to auto): rank 0: {format_cpus(expected[0])}, "
            f"rank 1: {format_cpus(expected[1])}\n") in proc.stderr.decode()
    # Threads a rank starts before importing anything inherit its CPUs too.
    threads = """
        import json, os, threading
        seen = []
        t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        t.start(); t.join()
        print(json.dumps(seen[0]))
    """
    assert affinities(hororun(child_env, "-np", "2", *worker(threads))) == found
    # The launcher itself keeps its own CPUs (it binds only the thread that starts a rank, and only
    # while it does).
    from horo_runner import run
    assert run(lambda: sorted(os.sched_getaffinity(0)), num_proc=2, bind_to="none") == [allowed] * 2
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_bind_to_none_and_core(child_env):
    allowed = set(os.sched_getaffinity(0))
    assert affinities(hororun(child_env, "-np", "2", "--bind-to", "none", *worker(AFFINITY))) == [allowed] * 2
    # One rank bound to "core" gets every core it may use.
    assert affinities(hororun(child_env, "-np", "1", "--bind-to", "core", *worker(AFFINITY))) == [allowed]
    too_many = str(len(allowed) + 1)
    proc = hororun(child_env, "-np", too_many, "--bind-to", "core", *worker(AFFINITY))
    assert proc.returncode == 2
    assert re.search(rf"--bind-to core: {too_many} ranks on this host but only \d+ physical cores",
                     proc.stderr.decode())
    assert proc.stdout == b""
    # auto with more ranks than cores: one core per rank, ranks 0 and 1 sharing the first.
    from horo_runner.binding import rank_cpu_sets
    found = affinities(hororun(child_env, "-np", too_many, *worker(AFFINITY)))
    assert found == rank_cpu_sets("auto", int(too_many), sorted(allowed))
    assert found[0] == found[1] and set().union(*found) == allowed
    proc = hororun(child_env, "-np", "2", "--bind-to", "socket", *worker(AFFINITY))
    assert proc.returncode == 2 and "invalid choice: 'socket'" in proc.stderr.decode()
