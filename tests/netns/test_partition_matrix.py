"""The partition matrix: one owner per VIP when nodes disagree, on the wire.

Real speakers (``fast`` profile) in namespaces, three nodes (four for the partial partition, two
for the two-node row); each fault is made with nftables rules inside the nodes' namespaces, held
10 s and healed (partition_matrix.py), while the client asks for every VIP every 0.1 s with a
broadcast ARP request and records every MAC that answers (arp_sampler.py). Asserted per row, over
every VIP, from the fault until the cluster is steady again:

| fault | two owners | no owner | after healing |
| --- | --- | --- | --- |
| owner drops everything it receives from its peers | <= 1 s | <= 1.5 s | one owner within 3 s |
| owner cut from its peers both ways, client segment intact | <= 1 s | <= 1.5 s | one owner within 3 s |
| partial partition a<->b, a<->c (4 nodes) | <= 1 s | <= 1.5 s | one owner within 3 s |
| every pair of nodes cut, every node still reaches the client | <= 1 s | <= 1.5 s | one owner within 3 s |
| one node boots while cut from its peers | 0 | - | one owner within 3 s |
| daemon frozen (SIGSTOP of the daemon, not of its children) | <= 1 s | <= 1.5 s | - |
| two-node cluster (the client as witness): one node kill -9'd | 0 | <= 1.5 s | - |

"One owner after healing" is the elected node's MAC alone in every sample from then on (watched
until it held 1.5 s, at least 4 s after healing). One cluster per size serves its rows in turn; a
row that leaves it in disagreement gets it restarted before the next one. The whole file takes
about 2 minutes. The same rows for both profiles, with pictures: ``make chaos-partitions``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from arp_sampler import figures, longest, steady_from
from partition_matrix import ROWS, Matrix, Row, run_row, witness_problem

pytestmark = pytest.mark.timeout(180)
WITNESS_REFUSED = witness_problem()


class Clusters:
    """One Matrix per (size, witness), made on first use, closed at the end of the module."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.factory = tmp_path_factory
        self.made: dict[tuple[int, bool], Matrix] = {}

    def get(self, row: Row) -> Matrix:
        key = (row.nodes, row.witness)
        if key not in self.made:
            t = time.time()
            self.made[key] = Matrix(self.factory.mktemp(f"matrix{row.nodes}"), nodes=row.nodes, profile="fast",
                                    witness=row.witness)
            print(f"cluster of {row.nodes} started in {time.time() - t:.1f} s")
        return self.made[key]

    def close(self) -> None:
        for m in self.made.values():
            m.close()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    cs = Clusters(tmp_path_factory)
    try:
        yield cs
    finally:
        cs.close()


def _param(row: Row):
    return pytest.param(row, id=row.key)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_row(clusters: Clusters, row: Row, capsys: pytest.CaptureFixture[str]) -> None:
    assert not (row.witness and WITNESS_REFUSED), f"memberlist.witness refused by this build: {WITNESS_REFUSED}"
    m = clusters.get(row)
    result = run_row(m, row)
    with capsys.disabled():  # the figures belong in make test's output, passed or not
        print(f"\n  {result.line()}")
    problems = result.problems()
    assert not problems, f"{row.title}: {'; '.join(problems)}; owners seen {result.owners()}"


# -- the analysis itself (pure) --------------------------------------------------------------------

A, B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"


def _series(*macs: tuple[str, ...], t0: float = 100.0) -> list[tuple[float, tuple[str, ...]]]:
    return [(t0 + i * 0.1, m) for i, m in enumerate(macs)]


def test_windows_are_runs_of_consecutive_samples_as_time() -> None:
    s = _series((A,), (A, B), (A, B), (A,), (), (), (), (B,))
    assert longest(s, (len(m) >= 2 for _t, m in s), 101.0) == pytest.approx(0.2)
    assert longest(s, (len(m) == 0 for _t, m in s), 101.0) == pytest.approx(0.3)
    tail = _series((A,), (A, B), (A, B))
    assert longest(tail, (len(m) >= 2 for _t, m in tail), 100.4) == pytest.approx(0.3)  # to the period's end


def test_healing_counts_only_a_steady_leader_to_the_end() -> None:
    s = _series((A, B), (B,), (A,), (A,), (A,))
    assert steady_from(s, A, 100.0, 100.5) == pytest.approx(0.2)
    assert steady_from(s, B, 100.0, 100.5) is None  # B answered alone once, but not at the end
    f = figures({"198.51.100.200": s}, 100.0, 100.5, heal=100.0, leaders={"198.51.100.200": A})
    assert (f.two_owner, f.no_owner, f.healed_after) == (pytest.approx(0.1), 0.0, pytest.approx(0.2))
    assert f.owners == {"198.51.100.200": sorted([A, B])}
