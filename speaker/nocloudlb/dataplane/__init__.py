"""The data plane: VIP:port forwarded to real servers (NAT, full-NAT, DR) with nftables."""

from .mode import DataplaneMode

__all__ = ["DataplaneMode"]
