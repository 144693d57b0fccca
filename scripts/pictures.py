"""Render the pictures of docs/images/: diagrams with Graphviz (``dot``), from the sources below,
and plots with matplotlib, from the JSON files benchmark runs wrote into docs/images/.

    python scripts/pictures.py           # (re)write docs/images/*.svg
    python scripts/pictures.py --check   # exit 1 when a picture differs from what this script draws

The election picture is computed with the core's own election (nocloudlb.core.election),
so it shows the order the speakers use. The plots are drawn from their run's JSON only, so a
plot is current exactly when it matches its data. The comparison ignores Graphviz's version comment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
OUT = TOP / "docs" / "images"

FONT = 'fontname="Helvetica"'
GRAPH = f'graph [{FONT} fontsize=11 bgcolor="white" pad=0.2]; node [{FONT} fontsize=10]; edge [{FONT} fontsize=9];'


def l2_failover() -> str:
    """The segment before and after the owner of a VIP fails: who answers ARP, what the client caches."""
    def side(tag: str, title: str, owner: str, dead: str | None, arp: str, cache: str) -> str:
        nodes = []
        for n, mac in (("n1", "02:00:00:00:00:11"), ("n2", "02:00:00:00:00:12"), ("n3", "02:00:00:00:00:13")):
            style = 'style="filled,dashed" fillcolor="#eeeeee" fontcolor="#888888"' if n == dead else \
                ('style=filled fillcolor="#c8e6c9"' if n == owner else 'style=filled fillcolor="#fff9c4"')
            role = "dead" if n == dead else ("owner: answers ARP" if n == owner else "backup: silent")
            nodes.append(f'{tag}{n} [shape=box {style} label="{n}  {mac}\\nVIP 198.51.100.200/32 on lo\\n{role}"];')
        return f"""
  subgraph cluster_{tag} {{
    label="{title}"; style=rounded; color="#999999";
    {tag}c1 [shape=box style=filled fillcolor="#bbdefb" label="client c1\\nARP cache: 198.51.100.200 -> {cache}"];
    {tag}sw [shape=ellipse label="segment lan (switch)"];
    {" ".join(nodes)}
    {tag}c1 -> {tag}sw [dir=both];
    {tag}sw -> {tag}n1 [dir=both]; {tag}sw -> {tag}n2 [dir=both]; {tag}sw -> {tag}n3 [dir=both];
    {tag}{owner} -> {tag}c1 [color="#2e7d32" penwidth=2 constraint=false label="{arp}"];
  }}"""
    from nocloudlb.core.election import election_order

    first, second = election_order(["n1", "n2", "n3"], "198.51.100.200")[:2]
    m1, m2 = f"02:..:1{first[1]}", f"02:..:1{second[1]}"
    return f"""digraph l2 {{ {GRAPH} rankdir=TB; compound=true;
  {side("b", f"before: {first} owns the VIP", first, None, f"ARP reply: 198.51.100.200 is-at {m1}", f"{m1} ({first})")}
  {side("a", f"after {first} fails: {second} is next in the election order", second, first,
        f"gratuitous ARP + reply: 198.51.100.200 is-at {m2}", f"{m2} ({second})")}
}}
"""


def bgp_ecmp() -> str:
    r1 = "router r1 (FRR)\\n203.0.113.10/32 via\\n198.51.100.11, .12, .13\\n(ECMP: one flow, one path)"
    nodes = "every eligible node announces the VIP (its FRR bgpd)"
    return f"""digraph bgp {{ {GRAPH} rankdir=LR;
  c2 [shape=box style=filled fillcolor="#bbdefb" label="client c2\\n192.0.2.10"];
  r1 [shape=box style=filled fillcolor="#e1bee7" label="{r1}"];
  subgraph cluster_nodes {{ label="{nodes}"; style=rounded; color="#999999";
    n1 [shape=box style=filled fillcolor="#c8e6c9" label="n1  198.51.100.11\\nVIP 203.0.113.10 on lo"];
    n2 [shape=box style=filled fillcolor="#c8e6c9" label="n2  198.51.100.12\\nVIP 203.0.113.10 on lo"];
    n3 [shape=box style=filled fillcolor="#eeeeee" label="n3  198.51.100.13\\ndrained: withdraws"];
  }}
  c2 -> r1 [label="to 203.0.113.10"];
  r1 -> n1 [label="next hop 1" color="#2e7d32"]; r1 -> n2 [label="next hop 2" color="#2e7d32"];
  n1 -> r1 [style=dashed label="BGP UPDATE 203.0.113.10/32" constraint=false];
  n2 -> r1 [style=dashed constraint=false]; n3 -> r1 [style=dashed color="#c62828" label="WITHDRAW" constraint=false];
}}
"""


def election() -> str:
    from nocloudlb.core.election import election_order  # the core itself, as the speakers run it

    nodes = ["n1", "n2", "n3"]
    rows = []
    for ip in ("198.51.100.200", "198.51.100.201", "2001:db8:1::200"):
        order = election_order(nodes, ip)
        cells = " | ".join(
            f"{{{i + 1}. {n}|{hashlib.sha256(f'{n}#{ip}'.encode()).hexdigest()[:8]}…}}" for i, n in enumerate(order))
        rows.append(f'"{ip}" [shape=record label="{{{ip}|{cells}}}"];')
    how = "\\n".join([
        "For each VIP every speaker sorts the candidates",
        "(alive or suspect members an L2Advertisement selects,",
        "not drained, healthy under Local policy)",
        'by sha256(node + \\"#\\" + ip), bytewise.',
        "The first announces; the next takes over when it goes.",
        "Same view -> same answer: no votes, no store."])
    return f"""digraph election {{ {GRAPH} rankdir=LR; node [style=filled fillcolor="#fafafa"];
  how [shape=note fillcolor="#fff9c4" label="{how}"];
  {" ".join(rows)}
}}
"""


def handover() -> str:
    return f"""digraph handover {{ {GRAPH} rankdir=LR;
  c1 [shape=box style=filled fillcolor="#bbdefb" label="client c1\\nARP now says: VIP -> n2"];
  subgraph cluster_new {{ label="n2: new owner (drain of n1)"; style=rounded; color="#999999";
    hook [shape=diamond style=filled fillcolor="#ffe0b2" label="nftables netdev\\ningress hook\\n(30 s grace)"];
    n2app [shape=box style=filled fillcolor="#c8e6c9" label="n2 sockets\\n(new connections)"];
  }}
  subgraph cluster_old {{ label="n1: old owner (still holds the VIP on lo)"; style=rounded; color="#999999";
    n1app [shape=box style=filled fillcolor="#fff9c4" label="n1 sockets\\n(connections in flight)"];
  }}
  c1 -> hook [label="packets to the VIP"];
  hook -> n2app [label="TCP SYN: start here" color="#2e7d32"];
  hook -> n1app [label="other TCP: forwarded at layer 2\\nto n1's MAC (source MAC rewritten)" color="#ef6c00"];
  n1app -> c1 [style=dashed label="replies" constraint=false];
  n2app -> c1 [style=dashed constraint=false];
}}
"""


PICTURES = {"l2-failover": l2_failover, "bgp-ecmp": bgp_ecmp, "election-order": election, "handover": handover}


# --------------------------------------------------------------------------- plots of benchmark runs

# The goals docs/benchmarks.md measures BGP withdrawals against (seconds; not in the run's JSON).
BGP_GOALS = {"drain": 0.1, "SIGTERM (withdraw_all)": 0.1, "bgpd frozen": 1.0, "node frozen": 0.4, "link down": 0.4}


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcdefaults()
    # The same data gives the same bytes: fixed ids, text as text (no font outlines), no date.
    plt.rcParams.update({"svg.hashsalt": "nocloudlb", "svg.fonttype": "none", "font.size": 9,
                         "font.family": "sans-serif"})
    return plt, plt.subplots(figsize=(width, height))


def _svg(plt, fig) -> str:
    import io

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buf.getvalue()


def bgp_withdrawal() -> str:
    """docs/images/bgp_withdrawal.json (benchmarks/bgp.py --parts withdrawal): each fault's runs and goal."""
    data = json.loads((OUT / "bgp_withdrawal.json").read_text())
    times = data["withdrawal"]["times"]
    cond = data["conditions"]
    plt, (fig, ax) = _figure(7.5, 3.4)
    faults = list(times)
    runs = max(len(v) for v in times.values())
    height = 0.8 / runs
    for r in range(runs):
        ys = [i + (r - (runs - 1) / 2) * height for i in range(len(faults))]
        xs = [times[f][r] if r < len(times[f]) else 0.0 for f in faults]
        bars = ax.barh(ys, xs, height=height * 0.9, label=f"run {r + 1}",
                       color=("#1f77b4", "#7fb3d5", "#aed6f1")[r % 3])
        ax.bar_label(bars, labels=[f"{x:.3f} s" for x in xs], padding=3, fontsize=8)
    for i, f in enumerate(faults):
        if f in BGP_GOALS:
            ax.plot([BGP_GOALS[f]] * 2, [i - 0.45, i + 0.45], color="#c62828", linewidth=1.5,
                    label="goal" if i == 0 else None)
    ax.set_yticks(range(len(faults)), faults)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("fault -> n1's next hop gone from the router's kernel table (s)")
    ax.set_title(f"BGP withdrawal at the router, FRR 8.4, BFD 100 ms x 3 (run of {cond['started'][:10]} "
                 f"{cond['started'][11:16]} UTC)", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(plt, fig)


def false_failovers() -> str:
    """docs/images/false_failovers.json (benchmarks/side_by_side.py --false-failover): takeovers per system."""
    rows = json.loads((OUT / "false_failovers.json").read_text())["false_failovers"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    names = {"loss": "{loss_pct} % loss each way", "cpu": "CPU hog beside the master ({hog})"}
    plt, (fig, ax) = _figure(7.5, 3.2)
    height = 0.8 / len(conditions)
    for c, cond in enumerate(conditions):
        got = {r["system"]: r for r in rows if r["condition"] == cond}
        ys = [i + (c - (len(conditions) - 1) / 2) * height for i in range(len(systems))]
        xs = [got[s]["takeovers"] if s in got else 0 for s in systems]
        first = next(iter(got.values()))
        hog = {"nice": "nice -20", "fifo": "SCHED_FIFO 50"}.get(first.get("hog") or "nice", first.get("hog"))
        label = names.get(cond, cond).format(loss_pct=first.get("loss_pct"), hog=hog)
        bars = ax.barh(ys, xs, height=height * 0.9, label=f"{label}, {first['minutes']:g} min",
                       color=("#ef6c00", "#6a1b9a")[c % 2])
        ax.bar_label(bars, labels=[str(x) for x in xs], padding=3, fontsize=8)
    ax.set_yticks(range(len(systems)), systems)
    ax.invert_yaxis()
    top = max(r["takeovers"] for r in rows)
    ax.set_xlim(0, max(1, top) * 1.15)
    ax.set_xlabel("false failovers: a non-master took the VIP (count)")
    ax.set_title("False failovers, every system and condition in one window (three nodes each)", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(plt, fig)


PLOTS = {"bgp_withdrawal": bgp_withdrawal, "false_failovers": false_failovers}


def render(dot_src: str) -> str:
    dot = shutil.which("dot")
    if not dot:
        raise SystemExit("pictures: Graphviz's dot is not installed (apt-get install graphviz; make deps does it)")
    proc = subprocess.run([dot, "-Tsvg"], input=dot_src, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"dot failed: {proc.stderr}")
    return proc.stdout


def normal(svg: str) -> str:
    return re.sub(r"<!-- Generated by graphviz version [^>]*-->", "", svg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    drawn = [(name, lambda source=source: render(source())) for name, source in PICTURES.items()]
    drawn += list(PLOTS.items())
    for name, draw in drawn:
        svg = draw()
        path = OUT / f"{name}.svg"
        if a.check:
            if not path.exists() or normal(path.read_text()) != normal(svg):
                stale.append(path.name)
        else:
            path.write_text(svg)
    if stale:
        print(f"docs/images/ is out of date ({', '.join(stale)}): run python scripts/pictures.py", file=sys.stderr)
        return 1
    print(f"docs/images/: {len(drawn)} pictures {'current' if a.check else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
