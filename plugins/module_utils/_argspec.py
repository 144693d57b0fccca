# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs shared by the collection's modules, as plain dicts.

Each matches a doc fragment in plugins/doc_fragments (sanity checks that a
module's argument_spec and its documentation agree).
"""

from __future__ import annotations

# The `resources` option: MetalLB-shaped documents (doc fragment nocloud.loadbalancer.resources).
RESOURCES = {"type": "list", "elements": "dict", "required": True}


def resources_spec() -> dict:
    """A fresh argument_spec holding the `resources` option (callers may add their own)."""
    return {"resources": dict(RESOURCES)}
