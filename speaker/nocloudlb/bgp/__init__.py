"""BGP mode: the node's FRR configuration rendered from MetalLB's resources, applied with
FRR's own reload tool, and FRR watched (see ``mode.BgpMode``)."""
