"""``DistributedDataParallel.join()``: training on inputs of different lengths on different ranks.

It builds on Horo's join: a rank that leaves the context joins its process set, and from then on
the core answers the other ranks' allreduces for it with zeros. Broadcasts cannot be answered that
way, so inside the context forward finds the ranks still training with an allreduce and sends the
buffers as a sum to which only the highest of them contributes (torch DDP's choice of the rank whose
buffers count); the bucket order is agreed the same
way. When every rank has joined, all take the model of the rank that left last (torch DDP's rule).

``JoinMixin`` holds the context and the collectives it needs; ``horo_torch.ddp.DistributedDataParallel``
inherits it and provides the state it reads (``process_set``, ``_prefix``, the buckets, ``_broadcast``).
"""
import contextlib

import torch

from horo_core import basics
from horo_torch import mpi_ops
from horo_torch._ddp_gradients import on_the_wire, wait_all


class EarlyTermination(RuntimeError):
    """join(throw_on_early_termination=True) found a rank that ran out of inputs first."""


class JoinMixin:
    """The join() context of DistributedDataParallel and its collectives while ranks have left it."""

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
        """Context manager for inputs of different lengths on different ranks (torch DDP's join).

        Train inside it as usual. A rank whose inputs run out leaves the context and waits there,
        taking part in the others' gradient allreduces with zeros, until every rank has left; then
        every rank takes the parameters and buffers of the rank that left last.

        Args:
            divide_by_initial_world_size: average gradients over every rank of the set (True), or
                over the ranks still training in that step (False).
            enable: False makes the context do nothing (every rank has the same inputs).
            throw_on_early_termination: raise a RuntimeError on every rank as soon as one rank's
                inputs run out, instead of going on with the others.
        Raises:
            RuntimeError: with throw_on_early_termination, when a rank's inputs ran out first.
        """
        if not enable or self.process_set.size() == 1:
            yield
            return
        self._join = {"divide_by_initial_world_size": bool(divide_by_initial_world_size),
                      "throw": bool(throw_on_early_termination)}
        raised = failed = False
        try:
            yield
        except EarlyTermination:
            raised = failed = True
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self._join = None
            self._grad_scale = 1.0
            last = mpi_ops.join_set(self.process_set)
            # Every rank has joined: they are all here, and ordinary collectives work again.
            self._agree_on_buckets(last)
            if throw_on_early_termination:
                flag = torch.tensor([1 if raised else 0], dtype=torch.int32)
                mpi_ops.allreduce_(flag, name=f"{self._prefix}.join.terminated", op=mpi_ops.Sum,
                                   process_set=self.process_set)
                early = int(flag) > 0
            else:
                early = False
            tensors = [("final.param", i, p) for i, p in enumerate(self._params_to_sync())]
            tensors += [("final.buffer", i, b) for i, b in enumerate(self._buffers_to_sync())]
            self._broadcast(tensors, root=last)
            if early and not failed:
                raise EarlyTermination("DistributedDataParallel.join(throw_on_early_termination=True): a rank ran "
                                        "out of inputs before the others")

    def _agree_on_buckets(self, last):
        """After join(): a rank that joined before the first synchronised backward missed the bucket
        rebuild the others did then; it takes their buckets from the rank that left last (which
        trained longest, so took part in any rebuild)."""
        rebuilt = torch.tensor([1 if self._rebuilt else 0], dtype=torch.int32)
        mpi_ops.allreduce_(rebuilt, name=f"{self._prefix}.join.rebuilt", op=mpi_ops.Sum, process_set=self.process_set)
        if int(rebuilt) in (0, self.process_set.size()):
            return
        layout = torch.tensor([self._generation] + [i for b in self._buckets for i in b.indices], dtype=torch.int64)
        mpi_ops.broadcast_(layout, last, name=f"{self._prefix}.join.buckets", process_set=self.process_set)
        if not self._rebuilt:
            self._generation = int(layout[0])
            self._set_buckets(self._layout(layout[1:].tolist()))
            self._rebuilt = True
            self._reset_iteration()

    def _sync_while_joining(self):
        """forward's collectives inside join(): ranks that left the context answer only allreduces
        (with zeros), so the ranks still training find each other with one, and the buffers travel as
        a sum to which only the highest of them contributes."""
        members = self.process_set.ranks if self.process_set.process_set_id != 0 else list(range(basics.size()))
        training = torch.zeros(len(members), dtype=torch.int32)
        training[members.index(basics.rank())] = 1
        mpi_ops.allreduce_(training, name=f"{self._prefix}.join.training", op=mpi_ops.Sum,
                           process_set=self.process_set)
        count = int(training.sum())
        if self._join["throw"] and count < len(members):
            raise EarlyTermination("DistributedDataParallel.join(throw_on_early_termination=True): rank(s) "
                                    f"{[m for m, t in zip(members, training.tolist()) if not t]} ran out of inputs "
                                    "before the others")
        self._grad_scale = 1.0 if self._join["divide_by_initial_world_size"] else len(members) / count
        # The highest rank still training sends its buffers (torch DDP's authoritative rank).
        source = self._join["source"] = max(m for m, t in zip(members, training.tolist()) if t)
        if not self.will_sync_module_buffers():
            return
        buffers = self._buffers_to_sync()
        with torch.no_grad():
            if basics.rank() != source:
                for b in buffers:
                    b.zero_()
            handles = [mpi_ops.allreduce_async_(on_the_wire(b), name=f"{self._prefix}.join.buffer.{i}",
                                                op=mpi_ops.Sum,
                                                process_set=self.process_set) for i, b in enumerate(buffers)]
            wait_all(handles)
