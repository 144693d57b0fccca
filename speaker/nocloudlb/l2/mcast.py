"""Solicited-node multicast memberships of the interfaces the announcer answers IPv6 VIPs on.

Groups are joined with IPV6_JOIN_GROUP, so the kernel also sends MLD reports and MLD-snooping
switches forward NS to this port. Each join or leave makes the kernel send MLD reports, so the
memberships follow the wanted counts through the same paced queue as the gratuitous frames
(pacing.py): ``join``/``leave`` only count and queue, ``reconcile`` (called when the queued entry
leaves) changes the kernel's membership. A socket holds a limited number of groups (optmem_max),
so more sockets are opened as needed; where IPv6 is disabled on the interface,
PACKET_MR_MULTICAST on the raw socket stands in (no MLD then).
"""

from __future__ import annotations

import errno
import logging
import socket
import struct

from . import ndp
from .bpf import set_link_multicast
from .tables import Iface

IPV6_JOIN_GROUP = getattr(socket, "IPV6_JOIN_GROUP", 20)
IPV6_LEAVE_GROUP = getattr(socket, "IPV6_LEAVE_GROUP", 21)


class Groups:
    """Wanted counts per group and the kernel memberships that follow them."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    @staticmethod
    def join(iface: Iface, group: bytes) -> None:
        iface.groups[group] += 1
        if iface.groups[group] == 1:
            iface.urgent.append(("", 0, group, "mcast", 0))  # answering NS needs it: before re-announcements

    @staticmethod
    def leave(iface: Iface, group: bytes) -> None:
        if iface.groups[group] <= 0:
            return
        iface.groups[group] -= 1
        if iface.groups[group] == 0:
            del iface.groups[group]
            iface.urgent.append(("", 0, group, "mcast", 0))  # the same queue as joins: their order is kept

    def reconcile(self, iface: Iface, group: bytes) -> bool:
        """Make the kernel membership of ``group`` match the wanted count; True if it changed."""
        wanted, joined = iface.groups.get(group, 0) > 0, group in iface.holder
        if wanted == joined:
            return False
        mreq = group + struct.pack("@I", iface.index)
        if not wanted:
            holder = iface.holder.pop(group)
            try:
                if holder is not None:
                    holder.setsockopt(socket.IPPROTO_IPV6, IPV6_LEAVE_GROUP, mreq)
                else:
                    set_link_multicast(iface.sock, iface.index, ndp.multicast_mac(group), False)
            except OSError:
                pass
            return True
        for attempt in range(2):
            if not iface.mcast or attempt:
                try:
                    iface.mcast.append(socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
                except OSError:
                    break
            try:
                iface.mcast[-1].setsockopt(socket.IPPROTO_IPV6, IPV6_JOIN_GROUP, mreq)
                iface.holder[group] = iface.mcast[-1]
                return True
            except OSError as exc:
                if exc.errno not in (errno.ENOBUFS, errno.ENOMEM):
                    break
        try:
            set_link_multicast(iface.sock, iface.index, ndp.multicast_mac(group), True)
            iface.holder[group] = None
        except OSError as exc:
            self.log.warning("multicastJoinFailed", extra={"event": "multicastJoinFailed", "iface": iface.name,
                                                           "error": str(exc)})
        return True
