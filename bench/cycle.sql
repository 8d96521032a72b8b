-- One claim-next + inline commit cycle (claim-v1.md §9) in raw SQL: the same two transactions, statements, rows and
-- locks as claims.services (task_claim_next, task_commit with the result inline), without Python. Run by
-- bench/claims.py and bench/sidebyside.py:
--   pgbench -n -M simple -f bench/cycle.sql -D nsid=<namespace id> ...
-- claim: namespace FOR SHARE, claim the oldest READY task (SKIP LOCKED), attempt + event in one statement
BEGIN;
SELECT scheduler_epoch AS epoch, statement_timestamp() FROM claims_namespace WHERE id = :nsid FOR SHARE \gset
UPDATE claims_task SET state = 'CLAIMED', claim_generation = claim_generation + 1, state_version = state_version + 1, scheduler_epoch = :epoch, attempt_id = gen_random_uuid(), owner_id = 'pgbench', lease_expires_at = now() + interval '300 seconds', updated_at = now() WHERE task_id = (SELECT c.task_id FROM claims_task c WHERE c.namespace_id = :nsid AND c.state = 'READY' ORDER BY c.created_at, c.task_id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) RETURNING task_id AS tid, attempt_id AS aid, claim_generation AS gen, cancel_generation AS cg, input_digest AS idig \gset
WITH a AS (INSERT INTO claims_attempt (attempt_id, task_id, namespace_id, owner_id, pool, claim_generation, scheduler_epoch, cancel_generation, input_digest, fences, started_at) VALUES (':aid', ':tid', :nsid, 'pgbench', 'v1', :gen, :epoch, :cg, ':idig', '{}', now())) INSERT INTO claims_taskevent (namespace_id, task_id, kind, at, attempt_id, claim_generation, scheduler_epoch, owner_id, principal, point, via, detail) VALUES (:nsid, ':tid', 'claimed', now(), ':aid', :gen, :epoch, 'pgbench', 'pgbench', 'claim', '', '{}');
COMMIT;
-- commit: task FOR NO KEY UPDATE + namespace FOR SHARE, stage the inline result (if this attempt has not), flip it to canonical, then task + attempt + event in one statement (or, with successors, one by one around the successor check)
BEGIN;
SELECT t.*, t.has_successors::int AS hs, n.name, n.scheduler_epoch, n.claims_paused, statement_timestamp() FROM claims_task t JOIN claims_namespace n ON n.id = t.namespace_id WHERE t.task_id = ':tid' FOR NO KEY UPDATE OF t FOR SHARE OF n \gset
WITH first AS (INSERT INTO claims_stagedresult (staged_result_id, task_id, attempt_id, result, result_digest, staged_at, canonical) VALUES (gen_random_uuid(), ':tid', ':aid', '{"r": 1}', 'sha256:b244c53fcd627a24c82563c4a800c51a4246ec9efbb0e6b6d22dab146d7ff3d5', now(), false) ON CONFLICT DO NOTHING RETURNING 1) INSERT INTO claims_taskevent (namespace_id, task_id, kind, at, attempt_id, claim_generation, scheduler_epoch, owner_id, principal, via, detail) SELECT :nsid, ':tid', 'result_staged', now(), ':aid'::uuid, :gen, :epoch, 'pgbench', 'pgbench', '', '{}'::jsonb FROM first;
UPDATE claims_stagedresult SET canonical = true, commit_id = gen_random_uuid(), committed_at = now(), unblocked = '[]' WHERE attempt_id = ':aid' AND result_digest = 'sha256:b244c53fcd627a24c82563c4a800c51a4246ec9efbb0e6b6d22dab146d7ff3d5' RETURNING *;
\if :hs
UPDATE claims_task SET state = 'COMMITTED', state_version = state_version + 1, result_commit_id = gen_random_uuid(), result_digest = 'sha256:b244c53fcd627a24c82563c4a800c51a4246ec9efbb0e6b6d22dab146d7ff3d5', result = '{"r": 1}', lease_expires_at = NULL, updated_at = now() WHERE task_id = ':tid';
UPDATE claims_attempt SET ended_at = now(), end_reason = 'COMMITTED' WHERE attempt_id = ':aid';
SELECT t.task_id FROM claims_task t JOIN claims_taskdependency d ON d.task_id = t.task_id WHERE d.depends_on_id = ':tid' AND t.state = 'BLOCKED' ORDER BY t.task_id FOR NO KEY UPDATE OF t;
INSERT INTO claims_taskevent (namespace_id, task_id, kind, at, attempt_id, claim_generation, scheduler_epoch, owner_id, principal, point, via, detail) VALUES (:nsid, ':tid', 'result_committed', now(), ':aid', :gen, :epoch, 'pgbench', 'pgbench', 'commit', '', '{}');
\else
WITH u AS (UPDATE claims_task SET state = 'COMMITTED', state_version = state_version + 1, result_commit_id = gen_random_uuid(), result_digest = 'sha256:b244c53fcd627a24c82563c4a800c51a4246ec9efbb0e6b6d22dab146d7ff3d5', result = '{"r": 1}', lease_expires_at = NULL, updated_at = now() WHERE task_id = ':tid'), a AS (UPDATE claims_attempt SET ended_at = now(), end_reason = 'COMMITTED' WHERE attempt_id = ':aid') INSERT INTO claims_taskevent (namespace_id, task_id, kind, at, attempt_id, claim_generation, scheduler_epoch, owner_id, principal, point, via, detail) VALUES (:nsid, ':tid', 'result_committed', now(), ':aid', :gen, :epoch, 'pgbench', 'pgbench', 'commit', '', '{}');
\endif
COMMIT;
