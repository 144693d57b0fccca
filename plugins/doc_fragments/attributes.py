# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Descriptions of the attributes every module of the collection documents.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    # For modules that only read their input and compute a result.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: The module never changes anything; it runs the same way in check mode and always returns C(changed=false).
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
"""
