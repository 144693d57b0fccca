"""nocloudlb: the speaker daemon and its command line."""

__version__ = "0.3.0"

#: The number of the wire protocol speakers speak to each other: heartbeat datagrams, gossip metadata
#: and the peer-view queries and replies. A minor release may only add to it what an older speaker
#: ignores (a flag, a metadata key, a JSON field); a new number comes only with a major release, which
#: still reads the previous protocol for that release (docs/speaker.md, "Wire compatibility").
#: Published in the gossip metadata (key ``p``) and in the control socket's ``status`` answer, beside
#: ``__version__``.
WIRE_VERSION = 1
