-- The commands page (pages/commands.py). Listings are newest first with keyset paging on
-- (created_at, id), on the index of their filter (sql/0060_web_listings.sql);
-- (%(after_at)s, %(after_id)s) is the last row of the previous page, ('infinity', '') on the
-- first, so the bound is always an index condition.

-- name: cursor
SELECT created_at, id FROM agentpost.commands WHERE id = %(id)s

-- name: list
-- Filtered by workspace, by state, by both or by neither: a filter given as NULL drops out
-- when Postgres plans the statement (the driver sends values inline, so `NULL IS NULL` is a
-- constant), so each combination is planned as if written alone, on its own index.
SELECT id, kind, workspace, action, state, reason, target_command_id, created_at, updated_at
  FROM agentpost.commands
 WHERE (%(workspace)s::text IS NULL OR workspace = %(workspace)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
   AND (created_at, id) < (%(after_at)s::timestamptz, %(after_id)s::text)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s

-- name: evidence
-- A command's evidence: its trail chain, in order (the chain's unique (chain, chain_seq)).
SELECT chain_seq, event, at, record, encode(hash, 'hex'), encode(mac, 'hex')
  FROM agentpost.trail
 WHERE chain = %(chain)s
 ORDER BY chain_seq
 LIMIT %(limit)s

-- name: last_transition
-- Who moved the command last: the newest state_change artifact of its chain.
SELECT chain_seq, at, record
  FROM agentpost.trail
 WHERE chain = %(chain)s
 ORDER BY chain_seq DESC
 LIMIT 20

-- name: saga
SELECT agentpost.saga_view(%(id)s)

-- name: saga_exists
SELECT EXISTS (SELECT 1 FROM agentpost.sagas WHERE id = %(id)s)

-- name: command_context
-- The context the command was submitted with (its first evidence entry): the agent tools
-- record there the run that submitted it (web/hitl.py).
SELECT t.record::jsonb -> 'body' -> 'context'
  FROM agentpost.trail t
 WHERE t.chain = 'command:' || %(id)s AND t.chain_seq = 1

-- name: decided_by
-- Whether the page decision whose confirmation envelope is %(id)s was taken (the envelope
-- exists, names the command and was consumed by the ledger when it decided).
SELECT EXISTS (SELECT 1 FROM agentpost.envelopes
                WHERE id = %(id)s AND consumed_at IS NOT NULL
                  AND content::jsonb ->> 'command_id' = %(command_id)s)
