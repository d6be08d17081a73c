-- The agents page (pages/agents.py): a seat's tool calls. Every branch walks an index
-- backwards and stops at its LIMIT: the trail's unique (chain, chain_seq) for the
-- workspace's own chain (the envelopes it sent, the leases and acks of its inbox), the
-- envelopes' primary key, commands_workspace_newest and the command chains' first entry.

-- name: workspaces
SELECT w.id
  FROM agentpost.workspaces w
 WHERE w.id > %(after)s
 ORDER BY w.id
 LIMIT %(limit)s

-- name: calls
-- kind, at, sort key, tool, envelope id, command id, type or action, to, the run (the
-- recorded RunInfo, or the lease holder), state, mark id and its space, newest first. Envelopes, leases and acks
-- are looked for among the last %(window)s entries of the seat's chain and of each of its
-- consumer lanes (every envelope it sent or received adds some), commands among its last
-- %(scan)s.
WITH recent AS MATERIALIZED (  -- the last %(window)s entries of the chain and of each of
    -- its consumer lanes (sql/0083: leases and acks made while another consumer held the
    -- chain): a bounded walk of each
    SELECT l.*
      FROM unnest(ARRAY[%(ws)s::text] || agentpost.consumer_lanes(%(ws)s)) AS c(chain)
     CROSS JOIN LATERAL (SELECT t.id, t.chain_seq, t.at, t.event, t.envelope_id, t.record
                           FROM agentpost.trail t
                          WHERE t.chain = c.chain
                          ORDER BY t.chain_seq DESC
                          LIMIT %(window)s) l
)
SELECT * FROM (
    SELECT 'envelope' AS kind, s.at, lpad(s.id::text, 20, '0') AS key,
           e.meta -> 'tool_call' ->> 'tool' AS tool, e.id AS envelope_id,
           NULL::text AS command_id, e.type AS what, e.recipient AS "to",
           e.meta -> 'tool_call' -> 'run' AS run, NULL::text AS holder, e.status AS state,
           NULL::text AS mark_id, NULL::text AS space
      FROM (SELECT t.id, t.at, t.envelope_id
              FROM recent t
             WHERE t.event = 'envelope_created'
               AND EXISTS (SELECT 1 FROM agentpost.envelopes x
                            WHERE x.id = t.envelope_id AND x.meta ? 'tool_call')
             ORDER BY t.id DESC
             LIMIT %(limit)s) s
      JOIN agentpost.envelopes e ON e.id = s.envelope_id
    UNION ALL
    SELECT CASE s.event WHEN 'envelope_leased' THEN 'lease' ELSE 'ack' END, s.at,
           lpad(s.id::text, 20, '0'),
           CASE s.event WHEN 'envelope_leased' THEN 'read_inbox' ELSE 'ack' END,
           s.envelope_id, NULL, e.type, e.recipient, NULL,
           s.record::jsonb -> 'body' ->> 'holder', NULL, NULL, NULL
      FROM (SELECT t.id, t.at, t.event, t.envelope_id, t.record
              FROM recent t
             WHERE (t.event = 'envelope_leased'
                    OR (t.event = 'envelope_consumed'
                        AND t.record::jsonb -> 'body' ->> 'via' = 'ack'))
             ORDER BY t.id DESC
             LIMIT %(limit)s) s
      LEFT JOIN agentpost.envelopes e ON e.id = s.envelope_id
    UNION ALL
    SELECT 'command', c.created_at, c.id, ctx -> 'tool_call' ->> 'tool', NULL, c.id,
           c.action, c.executor, ctx -> 'tool_call' -> 'run', NULL, c.state, NULL, NULL
      FROM (SELECT x.* FROM agentpost.commands x
             WHERE x.workspace = %(ws)s
             ORDER BY x.created_at DESC, x.id DESC
             LIMIT %(scan)s) c
      CROSS JOIN LATERAL (
            SELECT t.record::jsonb -> 'body' -> 'context' AS ctx
              FROM agentpost.trail t
             WHERE t.chain = 'command:' || c.id AND t.chain_seq = 1) f
     WHERE ctx ? 'tool_call'
    UNION ALL
    SELECT 'mark', r.recorded_at, r.mark_id::text, r.tool, NULL, NULL,
           m.mark_type || ' in ' || m.scope, m.resource, r.run, NULL, NULL,
           r.mark_id::text, r.space
      FROM (SELECT x.* FROM agentpost.mark_runs x
             WHERE x.workspace = %(ws)s
             ORDER BY x.recorded_at DESC
             LIMIT %(limit)s) r
      LEFT JOIN agentpost.marks m ON m.space = r.space AND m.id = r.mark_id
) calls
 ORDER BY at DESC, kind, key DESC
 LIMIT %(limit)s
