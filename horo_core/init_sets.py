"""The process sets that ``init(process_sets=[...])`` registers: what each rank posts about its
sets at the rendezvous, the checks that every rank's fit together, and the ids they get (Horovod's
numbering). horo_core/basics.py's ``init`` calls these; the sets added later are
horo_core/process_sets.py's ``add_process_set``.
"""
import json

from horo_core.errors import HoroInvalidArgument
from horo_core.process_sets import COMM_SETS_NEED_A_COMMUNICATOR, ProcessSet, global_process_set, ranks_of_comm

# What init's MPI communicators need: under hororun or torchrun each process's MPI world holds that
# process alone, so a communicator cannot number the job's ranks.
MPI_LAUNCHED = ("ranks that MPI launched (mpirun, or srun with PMI), but {} launched this job, so each "
                "process's MPI world holds that process alone")


def launched_by_mpi(info):
    """Whether MPI's world is the job's processes (mpi4py imported: the caller holds a communicator)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_size() == info.size


def built_from_comm(ps):
    """Whether init takes ps as a set of an MPI communicator (the global set, whose communicator is
    init's own, is not one)."""
    return ps.mpi_comm is not None and ps is not global_process_set


def listed_sets(static_sets, info, mpi_comm, members, size):
    """This rank's process sets for init: {"comms": the ranks of each set built from an MPI
    communicator (ranks of init's communicator, or of MPI_COMM_WORLD under mpirun), "lists": the
    ranks of the others, "problem": what makes them unusable, or None}."""
    listed = {"comms": [], "lists": [], "problem": None}
    from_comms = []
    for entry, ps in enumerate(static_sets):
        if built_from_comm(ps):
            from_comms.append((entry, ps.mpi_comm))
        else:  # the global set's ranks are set later in init, for this job
            listed["lists"].append(list(range(size)) if ps is global_process_set else ps.ranks)
    if not from_comms:
        return listed
    if members is not None:
        listed["problem"] = COMM_SETS_NEED_A_COMMUNICATOR
        return listed
    if not launched_by_mpi(info):
        listed["problem"] = (f"process sets built from MPI communicators need {MPI_LAUNCHED.format(info.family)}; "
                             "list the ranks instead, e.g. ProcessSet([0, 2])")
        return listed
    for entry, comm in from_comms:
        try:
            listed["comms"].append(ranks_of_comm(comm, mpi_comm))
        except ValueError as e:
            listed["problem"] = f"process_sets[{entry}]: {e}"
            break
    return listed


def register_static_sets(static_sets, mine, everyone, size, add_process_set, registered, aliases):
    """Registers init's process sets with Horovod's ids: first those built from MPI communicators,
    where each rank may pass its own (a set per rank from comm.Split), every rank's i-th such set
    taken together and the distinct ones registered in sorted order, i by i; then the sets listed
    by their ranks, in list order. A set with the ranks of one registered before (or of every
    rank) stands for it: Horovod does not register it twice either, and refusing it would stop
    scripts whose sets coincide at a small size ("the even ranks" and [0] on 2 ranks). A set that
    only another rank's communicator made gets an object of its own here.

    Args:
        static_sets: init's ProcessSet objects; mine, everyone: this rank's and every rank's
            listed_sets(); size: the job's; add_process_set(ranks): the core's, returns the id;
            registered: {id: ProcessSet}, filled in; aliases: the sets that stand for another, appended to.
    Raises:
        HoroInvalidArgument: on every rank, when the ranks' lists do not fit together (see
            check_listed_sets).
    """
    check_listed_sets(everyone, mine)
    from_comms = [ps for ps in static_sets if built_from_comm(ps)]
    for ps, ranks in zip(from_comms, mine["comms"]):
        ps.ranks = ranks
    order = [ranks for i in range(len(from_comms)) for ranks in sorted({tuple(e["comms"][i]) for e in everyone})]
    order.extend(tuple(ranks) for ranks in mine["lists"])
    ids = {tuple(range(size)): 0}
    for ranks in order:
        if ranks not in ids:
            ids[ranks] = add_process_set(list(ranks))
    for ps in static_sets:
        ps.process_set_id = ids[tuple(ps.ranks)]
        if ps.process_set_id in registered:
            aliases.append(ps)
        else:
            registered[ps.process_set_id] = ps
    for ranks, set_id in ids.items():
        if set_id not in registered:
            registered[set_id] = ProcessSet(ranks)
            registered[set_id].process_set_id = set_id


def check_listed_sets(everyone, mine):
    """Checks that every rank registers the same sets in the same order.

    Raises:
        HoroInvalidArgument: on every rank alike, naming the ranks: a rank's problem, different
            numbers of sets built from MPI communicators (each rank's i-th is taken with the others'
            i-th), or different sets listed by their ranks (Horovod needs the same list on every rank).
    """
    problems = ranks_by_value([e["problem"] for e in everyone])
    problems.pop("null", None)
    if problems:
        raise HoroInvalidArgument("init: " + "; ".join(f"{ranks}: {json.loads(problem)}"
                                                       for problem, ranks in problems.items()))
    counts = [len(e["comms"]) for e in everyone]
    if len(set(counts)) > 1:
        raise HoroInvalidArgument(
            "init: every rank must pass as many process sets built from MPI communicators (each rank's i-th one is "
            "taken with the others' i-th), got " + ", ".join(f"rank {r} {c}" for r, c in enumerate(counts)))
    if any(e["lists"] != mine["lists"] for e in everyone):
        lists = ranks_by_value([e["lists"] for e in everyone])
        raise HoroInvalidArgument("init: every rank must list the same process sets by their ranks, got " +
                                  ", ".join(f"{ranks} {listed}" for listed, ranks in lists.items()))


def ranks_by_value(values):
    """{JSON of a value: "rank 3" or "ranks 0, 1, 2" that have it}, in order of first rank."""
    ranks = {}
    for r, value in enumerate(values):
        ranks.setdefault(json.dumps(value), []).append(str(r))
    return {value: ("ranks " if len(rs) > 1 else "rank ") + ", ".join(rs) for value, rs in ranks.items()}
