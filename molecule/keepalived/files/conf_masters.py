"""Read keepalived.conf files (DIR/<node>/keepalived.conf) and print, as JSON, VIP -> the node
whose instance for it has the highest priority (VRRP's master when every node is up), plus
each VIP's priorities, so a verify play can compare the wire with what the config names."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

INSTANCE = re.compile(r"^vrrp_instance (\S+) \{\n(.*?)^\}", re.S | re.M)


def main() -> int:
    prios: dict[str, dict[str, int]] = {}
    for conf in sorted(Path(sys.argv[1]).glob("*/keepalived.conf")):
        node = conf.parent.name
        for _name, body in INSTANCE.findall(conf.read_text()):
            prio = int(re.search(r"^\s+priority (\d+)$", body, re.M).group(1))
            vips = re.search(r"virtual_ipaddress \{\n(.*?)\}", body, re.S).group(1).split()
            for vip in vips:
                prios.setdefault(vip.split("/")[0], {})[node] = prio
    masters = {vip: max(p, key=p.get) for vip, p in prios.items()}
    print(json.dumps({"masters": masters, "priorities": prios}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
