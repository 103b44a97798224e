"""Process sets: subsets of the ranks that run collectives among themselves.

``global_process_set`` (id 0) holds every rank. Sets given to ``init(process_sets=[...])`` are
registered during init; with dynamic process sets (``init(process_sets="dynamic")`` or
``HORO_DYNAMIC_PROCESS_SETS=1``) ``add_process_set`` and ``remove_process_set`` change them later.
Both are collective: every rank of the job calls them, in the same order, with the same ranks.
"""
from typing import List, Optional

from horo_core.errors import HoroInvalidArgument

# Refused in a job whose ranks init(comm=[ranks]) listed: no communicator numbers them.
COMM_SETS_NEED_A_COMMUNICATOR = ("process sets built from MPI communicators need init(comm=<mpi4py communicator>) "
                                 "or init() under mpirun, not init(comm=[ranks])")


class ProcessSet:
    """A set of global ranks. Sets compare and hash by identity, as Horovod's: registering or
    removing one changes its id, never its place in a dict or set.

    Args:
        ranks_or_comm: a list of global ranks, or an mpi4py communicator whose members form the set
            (its ranks are those in init's communicator once init has registered it; each rank may
            pass a different one, as from comm.Split).
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id: Optional[int] = None
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks = ranks_of_comm(ranks_or_comm)
        else:
            ranks = [int(r) for r in ranks_or_comm]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"process set ranks contain duplicates: {ranks}")
            self.ranks: List[int] = sorted(ranks)

    def _members(self):
        from horo_core import basics
        if self.process_set_id == 0:
            return list(range(basics.size()))
        return self.ranks

    def size(self) -> Optional[int]:
        """Number of ranks in the set (None if the set is not registered)."""
        if self.process_set_id is None:
            return None
        return len(self._members())

    def rank(self) -> Optional[int]:
        """This process's position in the set (None if the set is not registered).

        Raises:
            ValueError: this process is not a member (as Horovod's).
        """
        if self.process_set_id is None:
            return None
        from horo_core import basics
        members = self._members()
        me = basics.rank()
        if me not in members:
            raise ValueError(f"rank {me} is not part of process set {self.process_set_id} (ranks {members})")
        return members.index(me)

    def included(self) -> Optional[bool]:
        """Whether this process is a member (None if not registered)."""
        if self.process_set_id is None:
            return None
        from horo_core import basics
        return basics.rank() in self._members()

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


def ranks_of_comm(comm, job=None):
    """The sorted ranks in job (an mpi4py communicator; MPI_COMM_WORLD if None) of comm's members.

    Raises:
        ValueError: a member of comm is not in job.
    """
    from mpi4py import MPI
    job_group, group = (job or MPI.COMM_WORLD).Get_group(), comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job_group)
    finally:
        group.Free()
        job_group.Free()
    if MPI.UNDEFINED in ranks:
        raise ValueError("the communicator holds processes outside the job")
    return sorted(ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set) -> ProcessSet:
    """Registers a new process set on every rank (collective). Needs dynamic process sets.

    Args:
        process_set: a ProcessSet or a list of global ranks.
    Returns:
        The registered ProcessSet (with its process_set_id).
    Raises:
        ValueError: dynamic process sets are off, the set is already registered, a set with the
            same ranks exists, or the set is an MPI communicator's in a job that init(comm=[ranks])
            made (no communicator numbers its ranks).
    """
    from horo_core import basics
    basics.require_dynamic_process_sets("add_process_set")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    if ps.mpi_comm is not None:  # ranks of the job's communicator, which init(comm=...) may have given
        if basics.job_has_no_communicator():
            raise HoroInvalidArgument(COMM_SETS_NEED_A_COMMUNICATOR)
        ps.ranks = ranks_of_comm(ps.mpi_comm, global_process_set.mpi_comm)
    basics.register_process_set(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set on every rank (collective). Needs dynamic process sets.

    Returns:
        True if it was removed, False if it was not registered or is the global set.
    """
    from horo_core import basics
    basics.require_dynamic_process_sets("remove_process_set")
    if process_set.process_set_id in (None, 0):
        return False
    basics.runtime().remove_process_set(process_set.process_set_id)
    basics.forget_process_set(process_set)
    process_set.process_set_id = None
    return True
