"""Runtime labels (``nocloudlb label``, the control socket's ``label`` command) follow the rules of
``node.labels`` in the config: they are gossiped and logged, so control and escape characters are
refused with a message naming the label and the bad character. Before this (main at 8b916d6), the
socket accepted ``{"set": {"zone": "a\\u001b[31m"}}`` and put it in the journal, the state file and
gossip: ``test_control_socket_refuses_control_characters_and_changes_nothing`` fails there with
``{'ok': True, 'labels': {'zone': 'a\\x1b[31m'}}``.
"""

from __future__ import annotations

import json

import pytest
from inproc_speaker import pool_docs
from nocloudlb.core.control_client import request
from test_speaker_config_state import base

BAD = [
    ({"zone": "a\x1b[31m"}, "label 'zone' value: 'a\\x1b[31m' holds control characters (U+001B at 1)"),
    ({"zone": "a\nb"}, "label 'zone' value: 'a\\nb' holds control characters (U+000A at 1)"),
    ({"zo\x07ne": "a"}, "label key: 'zo\\x07ne' holds control characters (U+0007 at 2)"),
    ({"zone": "a\u2028b"}, "label 'zone' value: 'a\\u2028b' holds control characters (U+2028 at 1)"),
    ({"": "a"}, "label: key '' must be a non-empty string"),
    ({"a=b": "c"}, "label: bad key 'a=b' (no '=' or whitespace, at most 317 characters)"),
    ({"zone": "x" * 64}, "label 'zone': value '" + "x" * 64 + "' must be a string of at most 63 characters"),
    ({"zone": 5}, "label 'zone': value 5 must be a string of at most 63 characters"),
]


@pytest.mark.parametrize(("labels", "message"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_runtime_label_rules(labels, message):
    from nocloudlb.config import runtime_label_problem

    (key, value), = labels.items()
    problem = runtime_label_problem(key, value)
    assert problem is not None and problem.startswith(message), problem
    assert problem.isprintable() and len(problem) < 300


def test_the_same_characters_are_refused_in_the_config():
    from nocloudlb.config import parse, runtime_label_problem

    for labels, _message in BAD[:4]:
        with pytest.raises(Exception) as info:  # noqa: PT011 - ConfigError, whatever its text
            parse(base(node={"name": "n1", "labels": labels}))
        assert "holds control characters (U+" in str(info.value)
    assert runtime_label_problem("node.kubernetes.io/exclude-from-external-load-balancers", "") is None
    assert runtime_label_problem("zone", "a b-c_d.e") is None  # spaces are printable: allowed in both


def test_control_socket_refuses_control_characters_and_changes_nothing(harness):
    sp = harness.speaker("s", pool_docs(), labels={"zone": "a"})
    srv_labels = (harness.tmp / "s" / "state" / "labels.json")
    for labels, message in BAD[:4]:
        res = request(sp.cfg.socket, {"cmd": "label", "set": labels}, 5.0)
        assert res["ok"] is False, res
        assert set(res) == {"ok", "error"} and res["error"].startswith(message), res
    res = request(sp.cfg.socket, {"cmd": "label", "unset": ["zo\x1bne"]}, 5.0)
    assert not res["ok"] and "U+001B at 2" in res["error"], res
    assert sp.my_labels() == {"zone": "a"} and not srv_labels.exists()
    res = request(sp.cfg.socket, {"cmd": "label", "set": {"zone": "b"}}, 5.0)
    assert res["ok"] and res["labels"] == {"zone": "b"}
    assert json.loads(srv_labels.read_text())["set"] == {"zone": "b"}
