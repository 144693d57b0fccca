#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the action plugin nocloud.loadbalancer.vars_check (plugins/action/vars_check.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vars_check
short_description: Check the inventory's nocloudlb variables and a playbook's -e variables on the controller
version_added: "0.1.0"
description:
  - Checks every host's variables named in the given roles' argument specs (C(meta/argument_specs.yml),
    entry point C(main)) - types, required keys, choices, and the keys of every item of a list or mapping -
    and the playbook's C(-e) variables against O(extra_vars).
  - Refuses an unknown key with the closest known one (C(did you mean 'address'?)); each message names
    the variable, the item (index and name), the key and the value. The documented short forms pass - one
    string or port where a list is expected is a one-item list (C(ips=198.51.100.7), C(ports=443)).
  - Warns about C(nocloudlb_*) variables no role or playbook of the collection reads, and about C(-e)
    variables that look like a misspelt one, with the closest known name.
  - An action that runs on the controller only and never contacts a host, so a first play without facts
    (C(gather_facts=false)) refuses a bad inventory before anything else runs (see C(playbooks/site.yml)).
  - A value templated from something not known yet (facts, a host added later) is not checked here; the
    role's own argument validation checks it when it runs.
options:
  roles:
    description: The collection's roles whose argument specs (entry point C(main)) define the variables to check.
    type: list
    elements: str
    default: [speaker]
  hosts:
    description:
      - The hosts whose variables are checked (the one running the task through its task variables, so play
        variables count; the others through C(hostvars)). An empty list checks only the C(-e) variables.
      - "Default: every host of the play (C(ansible_play_hosts_all))."
    type: list
    elements: str
  extra_vars:
    description:
      - The playbook's own C(-e) variables, as an argument spec (name -> C(type), C(choices), C(required),
        C(elements), C(description)). Each one set is checked; a required one not set is refused, naming
        a misspelt C(-e) variable if there is one.
    type: dict
    default: {}
extends_documentation_fragment:
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.READ_ONLY
notes:
  - Run it once (C(run_once=true)); it checks all the hosts itself. It needs no connection.
seealso:
  - module: nocloud.loadbalancer.pool_validate
author:
  - nocloud.loadbalancer developers (@nocloud)
"""

EXAMPLES = r"""
# In a first play over the nodes with gather_facts false, so nothing is contacted before it
- name: Check the nodes' nocloudlb variables (and the keepalived role's, for keepalived.yml)
  nocloud.loadbalancer.vars_check:
    roles: [speaker, keepalived]
  run_once: true

# In a first play on localhost: a playbook's own -e variables
- name: Check -e target and -e state
  nocloud.loadbalancer.vars_check:
    hosts: []
    extra_vars:
      target: {type: str, required: true, description: "the nodes to drain, -e target=NODE"}
      state: {type: str, choices: [drained, undrained]}
"""

RETURN = r"""
errors:
  description: One line per problem, naming the variable, the item, the key and the value (and the hosts, when not all).
  type: list
  elements: str
  returned: always
  sample: ["nocloudlb_pools[0] (name: web4): unknown key 'adress' (did you mean 'addresses'?); the known keys are ..."]
checked_hosts:
  description: The hosts whose variables were checked.
  type: list
  elements: str
  returned: always
skipped:
  description: Variables not checked because they are templated from something not known yet, with their hosts.
  type: dict
  returned: always
  sample: {nocloudlb_memberlist_address: [n1, n2]}
"""
