"""Draw the data plane's packet paths (NAT, full-NAT, DR) as SVG with Graphviz's ``dot``.

    python3 docs/figures/dataplane_paths.py      # writes docs/figures/dataplane-{nat,fullnat,dr}.svg

Each picture: client C (192.0.2.10), the router, the director D (leads the VIP 198.51.100.200),
real server R (198.51.100.31). Solid arrows: the request; dashed: the reply. Labels: the
addresses (and for DR the MACs) each hop writes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

COMMON = """
  rankdir=LR; bgcolor="white"; fontname="Helvetica"; fontsize=12; labelloc=t;
  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica", fontsize=11];
  edge [fontname="Helvetica", fontsize=10];
  C [label="client C\\n192.0.2.10"];
  Rt [label="router\\n192.0.2.1 | 198.51.100.1"];
  D [label="director D (speaker)\\nleads VIP 198.51.100.200\\nnftables: %s", fillcolor="#fdf2e0"];
  R [label="real server R\\n198.51.100.31%s"];
"""

PATHS = {
    "nat": ("NAT: the director rewrites the destination; replies return through it (R's gateway)",
            "dnat + conntrack", "\\ndefault via the director (or the VIP)",
            """
  C -> Rt [label="C -> VIP:80"]; Rt -> D [label="C -> VIP:80"];
  D -> R [label="C -> R:8080 (dnat)", color="#1f5fbf"];
  R -> D [label="R:8080 -> C", style=dashed, color="#1f5fbf"];
  D -> Rt [label="VIP:80 -> C (un-dnat)", style=dashed]; Rt -> C [label="VIP:80 -> C", style=dashed];
"""),
    "fullnat": ("full-NAT: the director rewrites both addresses; R sees the director (or snatAddress)",
                "dnat + snat + conntrack", "\\nany route back to the director",
                """
  C -> Rt [label="C -> VIP:80"]; Rt -> D [label="C -> VIP:80"];
  D -> R [label="D -> R:8080 (dnat+snat)", color="#1f5fbf"];
  R -> D [label="R:8080 -> D", style=dashed, color="#1f5fbf"];
  D -> Rt [label="VIP:80 -> C (undone)", style=dashed]; Rt -> C [label="VIP:80 -> C", style=dashed];
"""),
    "dr": ("DR: the director rewrites only the destination MAC; R answers the client directly",
           "netdev ingress fwd (MAC)", "\\nVIP on lo, arp_ignore=1, arp_announce=2",
           """
  C -> Rt [label="C -> VIP:80"]; Rt -> D [label="C -> VIP:80\\nto MAC(D)"];
  D -> R [label="C -> VIP:80\\nto MAC(R) (same segment)", color="#1f5fbf"];
  R -> Rt [label="VIP:80 -> C\\nfrom MAC(R)", style=dashed, color="#bf1f1f"];
  Rt -> C [label="VIP:80 -> C", style=dashed];
"""),
}


def main() -> int:
    for name, (title, nft, rs, edges) in PATHS.items():
        dot = f'digraph {name} {{\n  label="{title}";\n' + COMMON % (nft, rs) + edges + "}\n"
        (HERE / f"dataplane-{name}.dot").write_text(dot)
        subprocess.run(["dot", "-Tsvg", "-o", str(HERE / f"dataplane-{name}.svg"), str(HERE / f"dataplane-{name}.dot")],
                       check=True)
        print(HERE / f"dataplane-{name}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
