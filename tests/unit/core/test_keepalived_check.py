# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the real ``keepalived -t -f FILE`` on a rendered config (tests only).

keepalived 2.2.7 reports problems on stderr; its exit status is 0 or, when the
config has vrrp_scripts and script security, SIGTERM (it signals itself at
the end of the check). So a config passes when keepalived exits 0 or by
SIGTERM *and* prints nothing; anything printed is a problem it would work
around (a reset port, an ignored keyword, a priority out of range).
The role's validate wrapper (roles/keepalived/files/keepalived-check) applies
the same rule.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

KEEPALIVED = shutil.which("keepalived") or "/usr/sbin/keepalived"


def keepalived_t(text: str) -> tuple[bool, str]:
    """(accepted, what keepalived printed) for config TEXT."""
    with tempfile.TemporaryDirectory(prefix="kad-t-") as tmp:
        conf = Path(tmp) / "keepalived.conf"
        conf.write_text(text, encoding="utf-8")
        proc = subprocess.run(
            [KEEPALIVED, "-t", "-f", str(conf), "-p", f"{tmp}/k.pid", "-r", f"{tmp}/v.pid", "-c", f"{tmp}/c.pid"],
            capture_output=True, text=True, timeout=60, start_new_session=True, check=False,
        )
    said = (proc.stdout + proc.stderr).strip()
    return proc.returncode in (0, -signal.SIGTERM) and not said, f"rc={proc.returncode} {said}"


def assert_keepalived_accepts(text: str) -> None:
    ok, said = keepalived_t(text)
    assert ok, f"keepalived -t refused the rendered config: {said}\n{text}"


def test_the_check_refuses_what_keepalived_would_only_work_around():
    good = "vrrp_instance a {\n    interface eth0\n    virtual_router_id 1\n    priority 100\n" \
           "    virtual_ipaddress {\n        198.51.100.9/32\n    }\n}\n"
    assert keepalived_t(good)[0]
    bad_priority = good.replace("priority 100", "priority 300")
    ok, said = keepalived_t(bad_priority)
    assert not ok and "Priority not valid" in said
    # with a vrrp_script keepalived 2.2.7 ends its check by SIGTERM: only what it prints tells
    script = "global_defs {\n    enable_script_security\n    script_user nobody\n}\n" \
             "vrrp_script chk {\n    script \"/bin/true\"\n    interval 1\n    weight 0\n}\n"
    tracked = good[:-2] + "    track_script {\n        chk\n    }\n}\n"
    assert keepalived_t(script + tracked)[0]
    ok, said = keepalived_t(script.replace("interval 1", "interval 0.5") + tracked)
    assert not ok and "interval" in said
