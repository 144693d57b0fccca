"""Who answers ARP for each VIP, sampled from a client: every MAC that replies, not just the first.

Run inside the client's namespace (standard library only, so it needs nothing but Python)::

    python arp_sampler.py IFACE INTERVAL WINDOW VIP [VIP ...]

Every INTERVAL seconds (0.1) it sends one broadcast ARP request (who-has VIP tell <client>) per VIP
and collects, for WINDOW seconds (0.08), every ARP reply addressed to this client whose sender
address is one of the VIPs. It prints one JSON line per VIP and round, ``{"t": <send time, epoch s>,
"vip": ip, "macs": [mac, ...]}`` (sorted, empty when nobody answered), until SIGTERM. Replies that
arrive after a round's window are read and dropped before the next round, so a late answer is never
counted in the wrong round; gratuitous announcements (broadcast, not addressed to the client) are no
answers either. The logic is the chaos lab's prober (tests/chaos/prober.py), IPv4 only, one request
per round.

The rest of the module is the analysis, pure functions over the samples: :func:`load` reads the
lines back, :func:`figures` gives the longest two-owner and no-owner windows of a period and the
time after healing until one MAC (the elected leader) answers steadily.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

Sample = tuple[float, tuple[str, ...]]  # (send time, the MACs that answered, sorted)


def _mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _my_ipv4(iface: str) -> bytes:
    import fcntl  # noqa: PLC0415

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))[20:24]  # SIOCGIFADDR
    finally:
        s.close()


def sample(iface: str, interval: float, window: float, vips: Sequence[str]) -> None:
    """The sampler's loop (see the module docstring); returns on SIGTERM/SIGINT."""
    if not 0 < window < interval:
        raise ValueError(f"window {window!r} must be positive and shorter than interval {interval!r}")
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    sock.bind((iface, 0x0806))
    mac = sock.getsockname()[4]
    src = _my_ipv4(iface)
    targets = {socket.inet_aton(ip): ip for ip in vips}
    frames = [b"\xff" * 6 + mac + b"\x08\x06"
              + struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, src, b"\x00" * 6, packed)
              for packed in targets]

    def read(deadline: float, answers: dict[str, set[str]] | None) -> None:
        while True:
            left = deadline - time.time()
            if left <= 0:
                return
            if not select.select([sock], [], [], left)[0]:
                return
            data = sock.recv(128)
            if answers is None or len(data) < 42 or data[0:6] != mac or data[20:22] != b"\x00\x02":
                continue
            ip = targets.get(data[28:32])
            if ip is not None:
                answers[ip].add(_mac_text(data[22:28]))

    out = sys.stdout
    next_round = time.time()
    while not stop:
        t0 = time.time()
        answers: dict[str, set[str]] = {ip: set() for ip in vips}
        for frame in frames:
            sock.send(frame)
        read(t0 + window, answers)
        for ip in vips:
            out.write(json.dumps({"t": round(t0, 4), "vip": ip, "macs": sorted(answers[ip])}) + "\n")
        out.flush()
        next_round += interval
        if next_round < time.time():  # we fell behind (a stalled machine): skip, never burst
            next_round = time.time() + interval
        read(next_round, None)  # late replies of this round are dropped
    sock.close()


# -- analysis ---------------------------------------------------------------------------------------

def load(path: Path | str, since: float = 0.0, until: float = float("inf")) -> dict[str, list[Sample]]:
    """Samples per VIP from the sampler's output (a half-written last line is skipped), time-ordered."""
    out: dict[str, list[Sample]] = {}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if since <= rec["t"] <= until:
            out.setdefault(rec["vip"], []).append((rec["t"], tuple(rec["macs"])))
    for samples in out.values():
        samples.sort()
    return out


def longest(samples: Sequence[Sample], bad: Iterable[bool], end: float) -> float:
    """The longest run of consecutive samples for which ``bad`` is true, as time: from the run's first
    sample to the first sample after it (``end`` when the run lasts to the end). 0.0 when none."""
    best, start = 0.0, None
    flags = list(bad)
    for i, (t, _macs) in enumerate(samples):
        if flags[i] and start is None:
            start = t
        elif not flags[i] and start is not None:
            best, start = max(best, t - start), None
    if start is not None:
        best = max(best, end - start)
    return best


def steady_from(samples: Sequence[Sample], mac: str, since: float, end: float) -> float | None:
    """Seconds after ``since`` from which every sample up to ``end`` is exactly ``[mac]``; None when the
    last sample is not (no steady owner at the end)."""
    after = [s for s in samples if s[0] >= since]
    if not after or after[-1][1] != (mac,):
        return None
    first = len(after) - 1
    while first > 0 and after[first - 1][1] == (mac,):
        first -= 1
    return max(0.0, after[first][0] - since)


@dataclass
class Figures:
    two_owner: float  # longest window with two or more MACs answering one VIP (s)
    no_owner: float  # longest window with none (s)
    healed_after: float | None  # after healing until the leader alone answers to the end; None: never
    steady_for: float  # how long that steady stretch was observed (s)
    samples: int
    owners: dict[str, list[str]]  # per VIP, every MAC seen in the period


def figures(per_vip: dict[str, list[Sample]], start: float, end: float, heal: float | None = None,
            leaders: dict[str, str] | None = None) -> Figures:
    """The worst over every VIP of the period ``[start, end]``; with ``heal`` and ``leaders`` (VIP ->
    the MAC that must answer after healing) also the time to one steady owner after ``heal``."""
    two = none = 0.0
    healed: float | None = 0.0
    steady = float("inf")
    count = 0
    owners: dict[str, list[str]] = {}
    for vip, all_samples in sorted(per_vip.items()):
        samples = [s for s in all_samples if start <= s[0] <= end]
        count += len(samples)
        owners[vip] = sorted({m for _t, macs in samples for m in macs})
        two = max(two, longest(samples, (len(m) >= 2 for _t, m in samples), end))
        none = max(none, longest(samples, (len(m) == 0 for _t, m in samples), end))
        if heal is not None and leaders is not None:
            got = steady_from(samples, leaders[vip], heal, end)
            if got is None or healed is None:
                healed = None
            else:
                healed = max(healed, got)
                steady = min(steady, end - heal - got)
    if heal is None or healed is None:
        steady = 0.0
    return Figures(round(two, 3), round(none, 3), None if heal is None or healed is None else round(healed, 3),
                   round(steady, 3), count, owners)


if __name__ == "__main__":
    sample(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])
