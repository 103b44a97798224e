"""Tests of launcher auto-detection (horo_core/launch_env.py). Pure functions of a dict."""
import hashlib
import json

import pytest

from horo_core.launch_env import (HORO_KV, HOROVOD_HTTP, compute_local_topology, detect,
                                  expand_slurm_nodelist, expand_slurm_tasks_per_node,
                                  local_topologies, routable_address)

SECRET_HEX = "ab" * 32


def hororun_env(rank=1, size=4, **extra):
    env = {
        "HORO_RANK": str(rank), "HORO_SIZE": str(size),
        "HORO_LOCAL_RANK": str(rank), "HORO_LOCAL_SIZE": str(size),
        "HORO_CROSS_RANK": "0", "HORO_CROSS_SIZE": "1",
        "HORO_HOSTNAME": "nodeA",
        "HORO_RENDEZVOUS_ADDR": "127.0.0.1", "HORO_RENDEZVOUS_PORT": "4567",
        "HORO_SECRET": SECRET_HEX,
    }
    env.update(extra)
    return env


def torchrun_env(rank=3, **extra):
    env = {"RANK": str(rank), "WORLD_SIZE": "8", "LOCAL_RANK": str(rank % 4),
           "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": str(rank // 4), "GROUP_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "job-42"}
    env.update(extra)
    return env


def slurm_env(**extra):
    env = {"SLURM_JOB_ID": "1234567", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_NUM_TASKS": "7",
           "SLURM_STEP_NODELIST": "gnode[10-12],gnode20", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
           "SLURMD_NODENAME": "gnode12", "HORO_BIND_ADDR": "10.0.0.12"}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------- families


def test_single_process_by_default():
    info = detect({})
    assert (info.family, info.rank, info.size) == ("single", 0, 1)
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (0, 1, 0, 1)
    assert info.rendezvous is None and info.secret is None and not info.hosts_rendezvous
    assert info.bind_host == "127.0.0.1" and not info.needs_mpi_bootstrap
    assert info.topology_known


def test_hororun_family():
    info = detect(hororun_env())
    assert (info.family, info.rank, info.size) == ("hororun", 1, 4)
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (1, 4, 0, 1)
    assert info.hostname == "nodeA"
    assert info.rendezvous == ("127.0.0.1", 4567) and info.rendezvous_protocol == HORO_KV
    assert not info.hosts_rendezvous
    assert info.secret == bytes.fromhex(SECRET_HEX) and not info.secret_is_weak
    assert info.bind_host == "127.0.0.1"
    assert SECRET_HEX not in repr(info)


def test_hororun_without_local_topology_marks_it_unknown():
    env = hororun_env()
    for name in ("HORO_LOCAL_RANK", "HORO_LOCAL_SIZE", "HORO_CROSS_RANK", "HORO_CROSS_SIZE"):
        del env[name]
    info = detect(env)
    assert info.local_rank is None and info.cross_size is None and not info.topology_known


@pytest.mark.parametrize("drop, missing", [
    ("HORO_SIZE", "HORO_SIZE"),
    ("HORO_RANK", "HORO_RANK"),
    ("HORO_RENDEZVOUS_PORT", "HORO_RENDEZVOUS_PORT"),
    ("HORO_SECRET", "HORO_SECRET"),
])
def test_hororun_half_set_raises_naming_missing(drop, missing):
    env = hororun_env()
    del env[drop]
    with pytest.raises(ValueError, match=f"incomplete hororun launch environment: {missing}"):
        detect(env)


def test_horovod_family_points_at_horovods_http_store():
    env = {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0",
           "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "2", "HOROVOD_CROSS_SIZE": "3",
           "HOROVOD_HOSTNAME": "h3", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": "5555"}
    info = detect(env)
    assert (info.family, info.rank, info.size, info.hostname) == ("horovod", 2, 3, "h3")
    assert (info.cross_rank, info.cross_size) == (2, 3)
    assert info.rendezvous == ("127.0.0.1", 5555)
    assert info.rendezvous_protocol == HOROVOD_HTTP
    assert info.secret is None
    with pytest.raises(ValueError, match="HOROVOD_GLOO_RENDEZVOUS_PORT is not set"):
        detect({k: v for k, v in env.items() if k != "HOROVOD_GLOO_RENDEZVOUS_PORT"})
    with pytest.raises(ValueError, match="HOROVOD_SIZE"):
        detect({"HOROVOD_RANK": "0"})
    assert detect({**env, "HOROVOD_SECRET": "cd" * 16}).secret == bytes.fromhex("cd" * 16)


def test_torchrun_rank0_hosts_on_master_port_plus_one():
    info = detect(torchrun_env(rank=0))
    assert (info.family, info.rank, info.size) == ("torchrun", 0, 8)
    assert info.rendezvous == ("127.0.0.1", 29501) and info.rendezvous_protocol == HORO_KV
    assert info.hosts_rendezvous
    other = detect(torchrun_env(rank=5))
    assert not other.hosts_rendezvous
    assert (other.local_rank, other.local_size, other.cross_rank, other.cross_size) == (1, 4, 1, 2)
    assert other.rendezvous == info.rendezvous


def test_horo_hostname_overrides_every_family():
    assert detect({**torchrun_env(rank=1), "HORO_HOSTNAME": "node-b"}).hostname == "node-b"
    assert detect({"HORO_HOSTNAME": "solo"}).hostname == "solo"


def test_torchrun_secret_is_weak_and_shared_by_the_job():
    a, b = detect(torchrun_env(rank=0)), detect(torchrun_env(rank=7))
    assert a.secret == b.secret and len(a.secret) == 32 and a.secret_is_weak
    other_job = detect(torchrun_env(rank=0, TORCHELASTIC_RUN_ID="job-43"))
    assert other_job.secret != a.secret
    strong = detect(torchrun_env(rank=0, HORO_SECRET=SECRET_HEX))
    assert strong.secret == bytes.fromhex(SECRET_HEX) and not strong.secret_is_weak


def test_torchrun_rendezvous_overrides():
    info = detect(torchrun_env(rank=0, HORO_RENDEZVOUS_PORT="7000"))
    assert info.rendezvous == ("127.0.0.1", 7000) and info.hosts_rendezvous
    moved = detect(torchrun_env(rank=0, HORO_RENDEZVOUS_ADDR="localhost",
                                HORO_RENDEZVOUS_PORT="7001"))
    assert moved.rendezvous == ("localhost", 7001)


def test_torchrun_without_local_world_size_is_unknown_topology():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
    info = detect(env)  # e.g. a Kubeflow PyTorchJob: one process per pod, no LOCAL_*
    assert info.family == "torchrun" and info.local_rank is None and not info.topology_known


@pytest.mark.parametrize("env, missing", [
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "2"}, "RANK"),
    ({"TORCHELASTIC_RUN_ID": "x"}, "RANK, WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT"),
])
def test_torchrun_half_set(env, missing):
    with pytest.raises(ValueError, match=f"incomplete torchrun launch environment: {missing}"):
        detect(env)


@pytest.mark.parametrize("family, env", [
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}),
    ("pmi", {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "4"}),
    ("mvapich", {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "4",
                 "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "4"}),
    ("pmix", {"PMIX_RANK": "0", "SLURM_STEP_NUM_TASKS": "4"}),
])
def test_mpi_families_need_mpi_bootstrap(family, env):
    info = detect(env)
    assert (info.family, info.rank, info.size) == (family, 0, 4)
    assert info.rendezvous is None and info.rendezvous_protocol is None
    assert info.needs_mpi_bootstrap and info.hosts_rendezvous
    assert info.secret is None and not info.secret_is_weak
    assert not info.topology_known  # cross rank/size come from the hostname exchange
    if family != "pmix":
        assert (info.local_rank, info.local_size) == (0, 4)
        assert info.bind_host == "127.0.0.1"  # every rank on this host


@pytest.mark.parametrize("env, missing", [
    ({"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
    ({"PMI_RANK": "1"}, "PMI_SIZE"),
    ({"MV2_COMM_WORLD_SIZE": "2"}, "MV2_COMM_WORLD_RANK"),
])
def test_mpi_half_set(env, missing):
    with pytest.raises(ValueError, match=f"{missing} is not set"):
        detect(env)


def test_pmix_without_size_raises():
    with pytest.raises(ValueError, match="PMIX_RANK is set but the world size is not"):
        detect({"PMIX_RANK": "0"})


def test_mpi_rank_other_than_zero_does_not_host():
    info = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                   "HORO_BIND_ADDR": "10.1.1.1"})
    assert not info.hosts_rendezvous and info.local_rank is None
    assert info.bind_host == "10.1.1.1"


def test_slurm_step():
    info = detect(slurm_env())
    assert (info.family, info.rank, info.size) == ("slurm", 5, 7)
    # nodes gnode10..12 have 2 tasks, gnode20 has 1: local rank 1 exists on the first three only
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (1, 2, 2, 3)
    assert info.hostname == "gnode12"
    assert info.rendezvous == ("gnode10", 31072) and not info.hosts_rendezvous  # 15000 + (job * 16 + step) % 17000
    assert info.secret_is_weak
    assert info.secret == detect(slurm_env(SLURM_PROCID="0", SLURM_LOCALID="0",
                                           SLURM_NODEID="0")).secret
    assert info.bind_host == "10.0.0.12"


def test_slurm_first_node_first_task_hosts():
    info = detect(slurm_env(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                            SLURMD_NODENAME="gnode10"))
    assert info.hosts_rendezvous and info.rendezvous == ("gnode10", 31072)
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (0, 2, 0, 4)


def test_slurm_port_override_and_short_job_id():
    assert detect(slurm_env(HORO_RENDEZVOUS_PORT="23456")).rendezvous == ("gnode10", 23456)
    assert detect(slurm_env(SLURM_JOB_ID="77")).rendezvous == ("gnode10", 16232)
    assert detect(slurm_env(HORO_RENDEZVOUS_PORT="23456")).rendezvous_origin == "HORO_RENDEZVOUS_PORT"
    assert "Slurm job 1234567 step 0" in detect(slurm_env()).rendezvous_origin


def test_two_steps_of_one_slurm_job_get_their_own_port_and_key():
    """srun ... & srun ... & wait: two steps of one job run at once and must not meet."""
    first, second = detect(slurm_env()), detect(slurm_env(SLURM_STEP_ID="1"))
    assert (first.rendezvous, second.rendezvous) == (("gnode10", 31072), ("gnode10", 31073))
    assert first.secret != second.secret


@pytest.mark.parametrize("mpi", [{"PMIX_RANK": "5"}, {"PMI_RANK": "5", "PMI_SIZE": "7"}])
def test_srun_with_an_mpi_plugin_takes_the_slurm_route(mpi):
    """srun --mpi=pmix (or pmi2) sets its MPI plugin's variables besides Slurm's; the step is the
    job, and Slurm's route needs no mpi4py."""
    info = detect({**slurm_env(), **mpi})
    assert (info.family, info.rank, info.size) == ("slurm", 5, 7) and not info.needs_mpi_bootstrap


def test_an_mpi_launcher_inside_a_step_is_still_mpi():
    """srun -n1 mpiexec -n 4 ...: the step has one task, the MPI job four."""
    step = slurm_env(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="1",
                     SLURM_STEP_TASKS_PER_NODE="1")
    assert detect({**step, "PMI_RANK": "0", "PMI_SIZE": "4"}).family == "pmi"
    assert detect({**step, "PMI_RANK": "2", "PMI_SIZE": "4"}).family == "pmi"


def test_slurm_batch_script_without_srun_is_single_process():
    env = {"SLURM_JOB_ID": "99", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert detect(env).family == "single"
    assert detect({**env, "SLURM_STEP_ID": "batch"}).family == "single"
    assert detect({**env, "SLURM_STEP_ID": "4294967294"}).family == "single"


def test_slurm_half_set():
    env = slurm_env()
    del env["SLURM_STEP_NUM_TASKS"]
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_TASKS is not set"):
        detect(env)


def test_launcher_variables_beat_slurm():
    inside_sbatch = {**slurm_env(), **torchrun_env(rank=2)}
    assert detect(inside_sbatch).family == "torchrun"
    mpirun_in_sbatch = {**slurm_env(), "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "7"}
    info = detect(mpirun_in_sbatch)
    assert (info.family, info.rank) == ("openmpi", 6)


def test_cross_of_nodes_is_horovods_split_by_local_rank():
    from horo_core.launch_env import cross_of_nodes
    # Nodes of 3, 1 and 2 processes: local rank 0 on all three, 1 on nodes 0 and 2, 2 on node 0.
    nodes = [0, 0, 0, 1, 2, 2]
    assert [cross_of_nodes(nodes, r) for r in range(6)] == [(0, 3), (0, 2), (0, 1), (1, 3), (2, 3), (1, 2)]
    assert [cross_of_nodes([0, 0, 1, 1], r) for r in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert detect(torchrun_env(rank=5)).node == 1  # init exchanges it to correct the cross values


def test_leftover_torch_variables_under_mpirun_are_refused():
    """RANK=0 WORLD_SIZE=1 left in the shell, then mpirun -np 2: each rank would train alone."""
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(ValueError, match="RANK/WORLD_SIZE say rank 0 of 1, but the MPI launcher's "
                                         "OMPI_COMM_WORLD_SIZE is 2"):
        detect({**mpirun, "RANK": "0", "WORLD_SIZE": "1"})
    with pytest.raises(ValueError, match="RANK/WORLD_SIZE say rank 0 of 2, but the MPI launcher's "
                                         "OMPI_COMM_WORLD_RANK is 1"):  # two ranks would be rank 0
        detect({**mpirun, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    # DDP over MPI: RANK/WORLD_SIZE exported from the MPI launcher's own, no MASTER_*: mpirun's job
    # (it failed with "incomplete torchrun launch environment").
    exported = detect({**mpirun, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (exported.family, exported.rank, exported.size) == ("openmpi", 1, 2)
    # Agreeing by hand, or torchrun started by mpirun (one agent per MPI rank), stay torchrun's.
    agreeing = {**mpirun, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert detect(agreeing).family == "torchrun"
    assert detect({**torchrun_env(rank=3), **mpirun}).family == "torchrun"


def test_precedence_order():
    everything = {**hororun_env(rank=0, size=2), "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
                  "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                  "HOROVOD_GLOO_RENDEZVOUS_PORT": "1", **torchrun_env(rank=1),
                  "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_RANK": "1",
                  "PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_NTASKS": "2",
                  "MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2", **slurm_env(),
                  "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                           "task": {"type": "worker", "index": 1}})}
    order = ["hororun", "horovod", "torchrun", "openmpi", "pmix", "pmi", "mvapich", "slurm",
             "tf_config", "single"]
    markers = {
        "hororun": ["HORO_RANK", "HORO_SIZE"],
        "horovod": ["HOROVOD_RANK", "HOROVOD_SIZE"],
        "torchrun": ["RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"],
        "openmpi": ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"],
        "pmix": ["PMIX_RANK"],
        "pmi": ["PMI_RANK", "PMI_SIZE"],
        "mvapich": ["MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"],
        "slurm": ["SLURM_STEP_ID"],
        "tf_config": ["TF_CONFIG"],
    }
    env = dict(everything)
    env["HORO_BIND_ADDR"] = "10.9.9.9"  # keep routing out of the picture
    for family in order:
        assert detect(env).family == family
        for name in markers.get(family, []):
            env.pop(name)


def test_tf_config_chief_and_workers():
    cluster = {"chief": ["host0:2222"], "worker": ["host0:2223", "host1:2222", "host1:2223"]}
    env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}),
           "HORO_BIND_ADDR": "10.0.0.2"}
    info = detect(env)
    assert (info.family, info.rank, info.size, info.hostname) == ("tf_config", 2, 4, "host1")
    assert (info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (0, 2, 1, 2)
    assert info.rendezvous == ("host0", 2223) and not info.hosts_rendezvous
    assert info.secret_is_weak
    chief = detect({**env, "TF_CONFIG": json.dumps({"cluster": cluster,
                                                    "task": {"type": "chief", "index": 0}})})
    assert chief.rank == 0 and chief.hosts_rendezvous and chief.secret == info.secret


@pytest.mark.parametrize("tf_config, match", [
    ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}},
     "'ps' is not a Horo rank"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}},
     "not in its cluster spec"),
    ({"cluster": {"worker": ["a:1"]}}, "not a valid cluster spec"),
])
def test_tf_config_errors(tf_config, match):
    with pytest.raises(ValueError, match=match):
        detect({"TF_CONFIG": json.dumps(tf_config)})


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("env, match", [
    (hororun_env(rank=4, size=4), "rank 4 is out of range for size 4"),
    (hororun_env(HORO_RANK="x"), "HORO_RANK='x' is not an integer"),
    (hororun_env(HORO_RENDEZVOUS_PORT="99999"), "not a valid TCP port"),
    (hororun_env(HORO_LOCAL_RANK="4"), "local rank 4 is out of range"),
    (hororun_env(HORO_SECRET="zz"), "HORO_SECRET is not a hex string"),
    (hororun_env(HORO_SECRET="abcd"), "at least 16 bytes"),
])
def test_malformed_values(env, match):
    with pytest.raises(ValueError, match=match):
        detect(env)


def test_bad_secret_is_never_echoed():
    secret_like = "not-hex-" + "9" * 40
    with pytest.raises(ValueError) as info:
        detect(hororun_env(HORO_SECRET=secret_like))
    assert secret_like not in str(info.value)


def test_bind_host():
    assert detect(hororun_env()).bind_host == "127.0.0.1"
    assert detect(hororun_env(HORO_RENDEZVOUS_ADDR="localhost")).bind_host == "127.0.0.1"
    assert detect(hororun_env(HORO_BIND_ADDR="192.168.5.5")).bind_host == "192.168.5.5"
    assert routable_address("127.0.0.1") == "127.0.0.1"


# ---------------------------------------------------------------------------- helpers


def test_expand_slurm_nodelist():
    assert expand_slurm_nodelist("gnode[10-12,20]") == ["gnode10", "gnode11", "gnode12",
                                                        "gnode20"]
    assert expand_slurm_nodelist("n[008-010],login1") == ["n008", "n009", "n010", "login1"]
    assert expand_slurm_nodelist("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02",
                                                           "rack2-n01", "rack2-n02"]
    assert expand_slurm_nodelist("single") == ["single"]
    for bad in ("n[1-", "n1]", "n[a-b]", "n[5-3]"):
        with pytest.raises(ValueError):
            expand_slurm_nodelist(bad)


def test_expand_slurm_tasks_per_node():
    assert expand_slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_slurm_tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        expand_slurm_tasks_per_node("2(3)")


def test_compute_local_topology_matches_horovod():
    # hosts a:2, b:1, c:3 -> ranks a a b c c c
    hosts = ["a", "a", "b", "c", "c", "c"]
    expected = [(0, 2, 0, 3), (1, 2, 0, 2), (0, 1, 1, 3), (0, 3, 2, 3), (1, 3, 1, 2),
                (2, 3, 0, 1)]
    assert [compute_local_topology(hosts, r) for r in range(6)] == expected
    assert [tuple(vars(t).values()) for t in local_topologies(hosts)] == expected
    # interleaved placement: order of hosts is by lowest rank
    assert compute_local_topology(["x", "y", "x", "y"], 3) == (1, 2, 1, 2)
    with pytest.raises(ValueError):
        compute_local_topology(hosts, 6)
    with pytest.raises(ValueError):
        compute_local_topology([], 0)


def test_weak_secret_is_not_the_plain_job_id_hash():
    info = detect(slurm_env())
    assert info.secret != hashlib.sha256(b"1234567").digest()
