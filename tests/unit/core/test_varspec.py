# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The variable checker (plugins/module_utils/_varspec.py) on its own: the speaker role's real argument
spec, Ansible's tagged values, the short forms and the messages (tests/unit/modules/test_vars_check.py
runs it through the playbooks)."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from nocloudlb.core._varspec import VarSpec, closest, native, show, unknown_variables

SPEC = pathlib.Path(__file__).resolve().parents[3] / "roles" / "speaker" / "meta" / "argument_specs.yml"
OPTIONS = yaml.safe_load(SPEC.read_text())["argument_specs"]["main"]["options"]


@pytest.fixture(scope="module")
def spec() -> VarSpec:
    return VarSpec(OPTIONS)


def test_every_list_or_dict_variable_has_typed_suboptions_or_is_free_form():
    free = {"nocloudlb_node_labels"}  # label names are the user's own
    for name, opt in OPTIONS.items():
        if opt.get("type") == "dict" or (opt.get("type") == "list" and opt.get("elements") == "dict"):
            assert name in free or opt.get("options"), name
            for sub, sub_opt in (opt.get("options") or {}).items():
                assert sub_opt.get("type"), f"{name}.{sub}"


def test_short_forms_become_one_item_lists(spec):
    out, errors = spec.check("nocloudlb_services", [{"name": "web", "ports": 443, "ips": "198.51.100.7"}])
    assert errors == [] and out == [{"name": "web", "ports": [443], "ips": ["198.51.100.7"]}]
    out, errors = spec.check("nocloudlb_pools", [{"name": "p", "addresses": "198.51.100.0/28"}])
    assert errors == [] and out[0]["addresses"] == ["198.51.100.0/28"]


def test_ansible_tagged_values_show_no_internal_type_name(spec):
    """Values read from an inventory are tagged (ansible-core 2.19: _AnsibleTaggedStr, _AnsibleTaggedInt)."""
    tags = pytest.importorskip("ansible._internal._datatag._tags")
    origin = tags.Origin(path="/inv/group_vars/all.yml", line_num=3)
    tagged = [{"name": origin.tag("web"), "ports": origin.tag(70000), "ips": origin.tag(5)}]
    assert type(tagged[0]["ports"]).__name__.startswith("_Ansible")
    _out, errors = spec.check("nocloudlb_services", tagged)
    assert errors == ["nocloudlb_services[0] (name: web): ports[0]: 70000 is not a port number (1-65535)"]
    assert "_Ansible" not in repr(native(tagged)) and type(native(tagged)[0]["name"]).__name__ == "str"


def test_messages_name_variable_item_key_and_value(spec):
    _out, errors = spec.check("nocloudlb_services", [{"name": "web", "ports": [80]},
                                                     {"name": "api", "ports": [{"port": "x"}]}])
    assert errors == ["nocloudlb_services[1] (name: api): ports[0]: port: 'x' is not a port number (1-65535)"]


def test_closest_and_unknown_variables():
    assert closest("adress", ["address", "port"]) == "address"
    assert closest("zzz", ["address", "port"]) is None
    assert unknown_variables(["nocloudlb_pool", "nocloudlb_pools", "other"], ["nocloudlb_pools"]) == [
        "unknown variable nocloudlb_pool, ignored (did you mean 'nocloudlb_pools'?)"]


def test_show_is_short_and_yaml_like():
    assert show({"a": [1, True, None]}) == "{a: [1, true, null (nothing)]}"
    assert len(show("x" * 500)) == 80


def test_a_secret_is_never_shown():
    spec = VarSpec({"nocloudlb_gossip_key": {"type": "str"}})
    _out, errors = spec.check("nocloudlb_gossip_key", {"k": "c2VjcmV0"})
    assert errors == ["nocloudlb_gossip_key: not a str (the value is not shown, it is a secret)"]
