"""Fuzz what other parties hand the speaker: a member's gossip metadata, control-socket requests and
config files. Each is refused with a bounded message, never a crash; ``nocloudlb validate`` and a reload
refuse exactly the same files, and a refused reload keeps the last good config."""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path

import pytest
import yaml
from fuzzcfg import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nocloudlb.cli import main as cli_main
from nocloudlb.config import MAX_ERROR_CHARS
from nocloudlb.control import ControlServer
from nocloudlb.daemon import Speaker
from nocloudlb.membership import generate_key
from nocloudlb.metadata import MetaCodec

SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])

CODEC = MetaCodec(["prod/a", "prod/b", "prod/c"], {"zone", "node.kubernetes.io/exclude-from-external-load-balancers"},
                  "abcd1234")
GOOD_META = CODEC.encode({"zone": "a"}, {"prod/a"})

# -- gossip metadata ------------------------------------------------------------------------------
text = st.text(max_size=600)
meta_values = st.one_of(text, st.just("[" * 3000 + "]" * 3000), st.just('{"zone":' * 900 + "1" + "}" * 900),
                        st.builds(lambda s: s * 40, st.sampled_from(["eJw", "AAAA", "%%", "\x00"])))


@SETTINGS
@given(st.dictionaries(st.sampled_from(["v", "c", "s", "h", "l", "x"]) | text, meta_values, max_size=7),
       st.booleans())
def test_metadata_decode_never_raises(meta, keep_good):
    if keep_good:
        meta = {**GOOD_META, **{k: v for k, v in meta.items() if k not in ("v", "s")}}
    info = CODEC.decode(meta)
    assert isinstance(info.labels, dict) and all(isinstance(v, str) for v in info.labels.values())
    assert info.healthy <= frozenset(CODEC.order)
    assert len(info.error) < 2000


def test_metadata_regressions():
    # a labels field nested deeper than json's recursion limit: RecursionError escaped decode
    deep = {**GOOD_META, "l": "[" * 100000 + "]" * 100000}
    assert CODEC.decode(deep).error
    bomb = {**GOOD_META, "h": "not base64 ✓"}
    assert CODEC.decode(bomb).error


# -- control socket -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speaker_socket(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctl")
    cfg = d / "config.yaml"
    cfg.write_text(yaml.safe_dump({"node": {"name": "n1"}, "memberlist": {"bind": "198.51.100.11:7946"},
                                   "stateDir": str(d / "state"), "metrics": {"bind": ""}}))
    sp = Speaker(str(cfg))
    ok, c = sp._load()
    assert ok
    sp.cfg = c
    from nocloudlb.state import LabelStore

    sp.labels = LabelStore(c.state_dir)
    srv = ControlServer(str(d / "s.sock"), sp.handle, read_timeout=2.0)
    srv.start()
    yield str(d / "s.sock")
    srv.stop()


def _roundtrip(path: str, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return data


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=20)
requests = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda cmd, rest: json.dumps({"cmd": cmd, **rest}).encode(),
              # not "reload": without a running loop it waits its 10 s for a reload that never comes
              # (hypothesis draws string constants of the code under test, so it found it: 50 s a run)
              st.sampled_from(["label", "status", "keys", "nope"])
              | st.text(max_size=10).filter(lambda c: c != "reload"),
              st.dictionaries(st.sampled_from(["set", "unset", "x"]), json_values, max_size=3)),
)


@SETTINGS
@given(st.lists(requests, min_size=1, max_size=3))
def test_control_protocol_answers_every_line_or_closes(speaker_socket, reqs):
    payload = b"".join(r.replace(b"\n", b" ") + b"\n" for r in reqs)
    data = _roundtrip(speaker_socket, payload)
    for line in data.splitlines():
        resp = json.loads(line)
        assert isinstance(resp, dict)
        if resp.get("ok") is False:
            assert "internal error" not in resp["error"], resp
            assert len(resp["error"]) < 2000
    # still serving
    assert json.loads(_roundtrip(speaker_socket, b'{"cmd": "keys"}\n'))["ok"] is True


# -- config files ---------------------------------------------------------------------------------
# a cluster (join names another member) needs a key file; removed at exit
_KEY_DIR = tempfile.TemporaryDirectory(prefix="nocloudlb-fuzz-key-")
KEY_FILE = Path(_KEY_DIR.name) / "memberlist.key"
KEY_FILE.write_text(generate_key() + "\n")
GOOD = {"node": {"name": "n1", "labels": {"zone": "a"}},
        "memberlist": {"bind": "198.51.100.11:7946", "join": ["198.51.100.12:7946"], "keyFile": str(KEY_FILE),
                       "probeInterval": 0.5},
        "metrics": {"bind": ""}, "handover": {"grace": 5},
        "resources": [
            {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "default"},
             "spec": {"addresses": ["198.51.100.200-198.51.100.220"]}},
            {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "default"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod",
             "annotations": {"nocloud.io/health-check": "tcp://127.0.0.1:80"}},
             "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                      "ports": [{"port": 80, "protocol": "TCP"}]},
             "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.200"}]}}}]}
PATHS = [("node", "name"), ("node", "labels"), ("memberlist", "bind"), ("memberlist", "probeInterval"),
         ("memberlist", "join"), ("metrics", "bind"), ("handover", "grace"), ("logLevel",), ("resources",),
         ("resources", 0, "spec", "addresses"), ("resources", 2, "metadata", "annotations", "nocloud.io/health-check"),
         ("resources", 2, "spec", "ports", 0, "port"), ("resources", 2, "metadata", "name")]
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
           | st.sampled_from(["\x1b[31m", "a\nb", "\u202e", "NaN", "1e999", "-1", "0.000001"]))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                      max_leaves=8)


def _set(doc, path, value):
    cur = doc
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value


YAML_SNIPPETS = [b"a: &a [*a]\n", b"&x [*x, *x]", b"k: !!python/object:os.system {}\n", b"- - - - - - [\n",
                 b"x: " + b"[" * 200 + b"]" * 200, b"\xff\xfe\x00", b"%YAML 9.9\n---\n", b"--- 1\n--- 2\n",
                 b"a: *nope\n", b"? [a, b]\n: 1\n", b"\t\x07node: x"]


def _check_same(tmp_path, data: bytes, capsys) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    sp = Speaker(str(good))
    ok, cfg = sp._load()
    assert ok
    sp.cfg = cfg
    sp.holder.path = sp.config_path = str(tmp_path / "new.yaml")
    (tmp_path / "new.yaml").write_bytes(data)
    reload_ok, in_use = sp._load()  # never raises
    capsys.readouterr()
    rc = cli_main(["validate", str(tmp_path / "new.yaml")])
    err = capsys.readouterr().err
    assert (rc == 0) == reload_ok, (data[:300], err[:500], sp.holder.errors[:3])
    if not reload_ok:
        assert in_use is cfg and sp.holder.status()["digest"] == cfg.digest
        assert 0 < len(err) <= MAX_ERROR_CHARS + 200
        assert 0 < sum(len(e) + 1 for e in sp.holder.errors) <= MAX_ERROR_CHARS


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3))
def test_config_mutations_validate_and_reload_agree(tmp_path, capsys, changes):
    doc = json.loads(json.dumps(GOOD))
    for path, value in changes:
        _set(doc, path, value)
    _check_same(tmp_path, yaml.safe_dump(doc, allow_unicode=True).encode(), capsys)


@SETTINGS
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode),
                 st.lists(st.sampled_from(YAML_SNIPPETS), min_size=1, max_size=4).map(b"".join),
                 st.tuples(st.sampled_from(YAML_SNIPPETS), st.integers(0, 500)).map(
                     lambda t: yaml.safe_dump(GOOD).encode()[: t[1]] + t[0])))
def test_arbitrary_bytes_validate_and_reload_agree(tmp_path, capsys, data):
    _check_same(tmp_path, data, capsys)
