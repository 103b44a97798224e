"""Shared by the tests of the hierarchical collectives (test_hierarchical_allreduce.py,
test_hierarchical_allgather.py): where the members of a process set run when ranks are spread over
emulated hosts, the core's rule for going hierarchical, stats deltas, and the auto/1/0 settings."""
import dataclasses

import pytest

from horo_core import config
from loopback_world import World


def world_per_layout(layouts):
    """A module-scoped fixture giving (World, hosts) for every entry of layouts ({name: host of
    every rank}): one in-process world per layout, shared by the module's tests."""
    @pytest.fixture(scope="module", params=list(layouts), ids=lambda k: k.replace(" ", "-"))
    def layout(request):
        hosts = layouts[request.param]
        with World(len(hosts), hosts=hosts) as world:
            yield world, hosts
    return layout


def hosts_of(hosts, ranks):
    """{host: [member index, ...]} of the members ranks (global ranks, in set order), hosts in the
    order of their first member."""
    out = {}
    for m, r in enumerate(ranks):
        out.setdefault(hosts[r], []).append(m)
    return out


def is_hierarchical(hosts, ranks):
    """The core's rule: the set spans hosts and some host has several of its members."""
    by_host = hosts_of(hosts, ranks)
    return len(by_host) > 1 and max(len(m) for m in by_host.values()) > 1


def process_sets_to_try(hosts):
    """Process sets of the world whose rank r runs on hosts[r]: all ranks but 0 (spanning the
    hosts, unevenly), the ranks of rank 0's host, and rank 0 with one rank of another host (one per
    host); duplicates and one-rank sets left out."""
    n = len(hosts)
    first_host = [r for r in range(n) if hosts[r] == hosts[0]]
    across = [0, next(r for r in range(n) if hosts[r] != hosts[0])]
    sets = []
    for ranks in (list(range(1, n)), first_host, across):
        if len(ranks) > 1 and sorted(ranks) not in [sorted(s) for s in sets]:
            sets.append(ranks)
    return sets


def delta(before, after):
    """What changed between two Runtime.stats(), as {field: difference}."""
    return {f.name: getattr(after, f.name) - getattr(before, f.name) for f in dataclasses.fields(after)}


def check_toggle_setting(monkeypatch, setting):
    """setting (e.g. HIERARCHICAL_ALLGATHER) defaults to auto, reads HOROVOD_<setting> as auto, 1 or
    0 in any spelling, and refuses other text in HORO_<setting> naming the variable."""
    monkeypatch.delenv(f"HORO_{setting}", raising=False)
    monkeypatch.delenv(f"HOROVOD_{setting}", raising=False)
    assert config.value(setting) == "auto"
    for text, value in (("1", "1"), ("true", "1"), ("0", "0"), ("off", "0"), ("AUTO", "auto")):
        monkeypatch.setenv(f"HOROVOD_{setting}", text)
        assert config.value(setting) == value
    monkeypatch.setenv(f"HORO_{setting}", "sometimes")
    with pytest.raises(ValueError, match=f"HORO_{setting}='sometimes'"):
        config.settings()
