# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one exception the core raises for a bad configuration."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration that cannot be used.

    ``errors`` holds every problem found, not just the first one. Each entry
    names the resource (kind and name), the field and the bad value, using
    MetalLB's wording where MetalLB has one. ``str(error)`` joins them with
    newlines.
    """

    def __init__(self, errors: list[str] | str) -> None:
        if isinstance(errors, str):
            errors = [errors]
        self.errors: list[str] = list(errors)
        super().__init__("\n".join(self.errors))

    def __str__(self) -> str:
        return "\n".join(self.errors)
