"""The rollout's services — the only writers of rollout records — by concern:

- ``state``: each namespace's stage and protocol minimum (the rollout's own record), and creating a namespace
  with it;
- ``routing``: who decides a claim.v1 worker operation in each stage, and what is mirrored;
- ``legacy_api``: the legacy protocol's operations, mirrored where legacy decides;
- ``shadow``: the comparison of the two stores' verdicts;
- ``reviews``: mismatch review and explain rules;
- ``stages``: gates, drain snapshots, advance and rollback;
- ``fences``: on-call's epoch fences as durable requests with their self-check;
- ``workers``: registration, heartbeats, refusal of old protocols;
- ``jobs``: what the periodic jobs do beyond the above.

The claim.v1 core is called through ``claims.services`` only; the core never imports this package.
"""
