"""scripts/run-steps.py (what `make test` runs): each step through make, output streamed, a
final table of results and times, the first failure stops the run, exit 1 then."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

MAKEFILE = """\
good:
\t@echo "==== 3 passed, 1 skipped in 0.12s ===="
bad:
\t@echo broken; exit 3
why:
\t@echo 'TASK [count]'; echo 'fatal: [n1]: FAILED! => {"msg": "lost 3 requests"}'; echo detail; \\
\t  for i in $$(seq 1 100); do echo "filler msg $$i"; done; echo 'ERROR the scenario failed'; exit 2
never:
\t@touch ran-never
"""


def run(tmp_path: Path, *args: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "Makefile").write_text(MAKEFILE + extra)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run-steps.py"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)


def test_table_of_steps_and_stop_at_first_failure(tmp_path):
    res = run(tmp_path, "--title", "make test", "--json", "r.json", "good", "bad", "never")
    assert res.returncode == 1
    out = res.stdout
    assert "broken" in out  # the step's own output streams through
    table = out[out.index("===== make test: 1 of 3 passed"):].splitlines()
    assert table[1].split() == ["STEP", "RESULT", "TIME", "WHAT", "IT", "SAID"]
    assert table[2].split()[:2] == ["good", "passed"] and table[2].endswith("3 passed, 1 skipped")
    assert table[3].split()[:3] == ["bad", "failed", "(exit"]
    assert table[4].split()[:3] == ["never", "not", "run"]
    assert not (tmp_path / "ran-never").exists()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [s["result"] for s in doc["steps"]] == ["passed", "failed (exit 2)", "not run"] and not doc["ok"]


def test_keep_going_runs_every_step_and_all_passed_exits_0(tmp_path):
    assert run(tmp_path, "--keep-going", "bad", "never").returncode == 1
    assert (tmp_path / "ran-never").exists()
    res = run(tmp_path, "good", "never")
    assert res.returncode == 0 and "===== steps: all passed in" in res.stdout


def test_a_failed_step_says_why_at_the_end_above_the_table(tmp_path):
    res = run(tmp_path, "--keep-going", "--json", "r.json", "why", "good")
    assert res.returncode == 1
    out = res.stdout
    why_at = out.index("===== why why failed")
    # the why-excerpt and the table are the log's last lines: a CI report showing only the tail has both
    assert why_at > out.index("filler msg 100") and why_at < out.index("===== steps: 1 of 2 passed")
    why = out[why_at:out.index("===== steps: 1 of 2 passed")].strip().splitlines()
    assert why[1] == 'fatal: [n1]: FAILED! => {"msg": "lost 3 requests"}' and why[2] == "detail"
    # an excerpt, not the step's whole output
    assert "filler msg 40" not in why and len(why) < 40
    # the tool's closing ERROR line names no failure: not shown when a line did
    assert "ERROR the scenario failed" not in why
    assert "===== why good" not in out  # nothing for steps that passed
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["steps"][0]["why"][0].startswith("fatal:") and doc["steps"][1]["why"] == []


def test_the_first_and_the_last_failure_and_closing_errors_only_without_one(tmp_path):
    (tmp_path / "Makefile").write_text(MAKEFILE)
    script = tmp_path / "two.sh"
    script.write_text("echo 'E   assert 1 == 2'; for i in $(seq 1 60); do echo pad $i; done\n"
                      "echo 'FAILED tests/x.py::t2'; echo after-last; exit 1\n")
    weak = tmp_path / "weak.sh"
    weak.write_text("echo 'ERROR: sanity failed'; echo 'names pylint'; exit 1\n")
    with (tmp_path / "Makefile").open("a") as fh:
        fh.write("two:\n\t@sh two.sh\nweak:\n\t@sh weak.sh\n")
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "run-steps.py"), "--keep-going", "two", "weak"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    out = res.stdout
    two = out[out.index("===== why two failed"):out.index("===== why weak failed")].splitlines()
    assert two[1] == "E   assert 1 == 2" and "[...]" in two and "FAILED tests/x.py::t2" in two
    assert "after-last" in two and "pad 45" not in two
    weak_why = out[out.index("===== why weak failed"):].splitlines()
    assert weak_why[1:3] == ["ERROR: sanity failed", "names pylint"]


def test_a_group_runs_side_by_side_keeps_each_output_whole_and_stops_after_it(tmp_path):
    # each sleeper says it begins, sleeps 1 s, says it finished: run one after another they take 3 s
    sleepers = "".join(f"{name}:\n\t@echo {name}-begin; sleep 1; echo {name}-finish\n" for name in ("s1", "s2", "s3"))
    res = run(tmp_path, "--json", "r.json", "s1+s2+s3", "good", extra=sleepers)
    assert res.returncode == 0, res.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [s["step"] for s in doc["steps"]] == ["s1", "s2", "s3", "good"]
    assert all(s["result"] == "passed" and 0.9 < s["seconds"] < 3 for s in doc["steps"][:3]), doc
    # two at a time: about 2 s for the three, not 3 (the group's own line says how long together)
    assert doc["seconds"] < 2.9, doc["seconds"]
    out = res.stdout
    assert "s1, s2, s3 took" in out
    for name in ("s1", "s2", "s3"):  # each step's output printed whole, not interleaved
        start = out.index(f"{name}-begin")
        assert out.index(f"{name}-finish") == start + len(f"{name}-begin\n")
    # a failure in a group: the group ends, the next step does not run, the table has a row per step
    res = run(tmp_path, "--json", "r.json", "bad+s1", "never", extra=sleepers)
    assert res.returncode == 1 and not (tmp_path / "ran-never").exists()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [(s["step"], s["result"]) for s in doc["steps"]] == [
        ("bad", "failed (exit 2)"), ("s1", "passed"), ("never", "not run")]
