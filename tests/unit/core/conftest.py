# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared helpers for the core tests: fixture manifests and document builders."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from nocloudlb.core.errors import ConfigError
from nocloudlb.core.schema import parse_resources

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"


def load_manifest(name: str) -> list[dict]:
    """The documents of tests/unit/fixtures/NAME, read with a YAML 1.1 loader as Ansible does."""
    with open(FIXTURES / name, encoding="utf-8") as handle:
        return list(yaml.safe_load_all(handle))


def pool(name: str, *addresses: str, **spec) -> dict:
    return {
        "apiVersion": "metallb.io/v1beta1",
        "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": "metallb-system"},
        "spec": {"addresses": list(addresses), **spec},
    }


def l2adv(name: str, **spec) -> dict:
    return {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": name}, "spec": spec}


def bgpadv(name: str, **spec) -> dict:
    return {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": name}, "spec": spec}


def peer(name: str = "router", **spec) -> dict:
    base = {"myASN": 64500, "peerASN": 64501, "peerAddress": "198.51.100.1"}
    base.update(spec)
    base = {k: v for k, v in base.items() if v is not None}
    return {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": name}, "spec": base}


def bfd(name: str = "bfd", **spec) -> dict:
    return {"apiVersion": "metallb.io/v1beta1", "kind": "BFDProfile", "metadata": {"name": name}, "spec": spec}


def community(name: str = "communities", **aliases) -> dict:
    items = [{"name": k, "value": v} for k, v in aliases.items()]
    return {"apiVersion": "metallb.io/v1beta1", "kind": "Community", "metadata": {"name": name},
            "spec": {"communities": items}}


def service(name: str = "web", namespace: str = "prod", annotations: dict | None = None, labels: dict | None = None,
            status_ips: list[str] | None = None, **spec) -> dict:
    body = {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]}
    body.update(spec)
    doc: dict = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}, "labels": labels or {}},
        "spec": body,
    }
    if status_ips is not None:
        doc["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in status_ips]}}
    return doc


def errors_of(docs: list) -> list[str]:
    """The errors parse_resources reports for DOCS (fails the test when there are none)."""
    with pytest.raises(ConfigError) as info:
        parse_resources(docs)
    assert str(info.value) == "\n".join(info.value.errors)
    return info.value.errors


@pytest.fixture
def manifest():
    return load_manifest
