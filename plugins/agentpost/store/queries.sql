-- Read queries of the envelope store. Writes go through the functions in sql/.

-- name: get_envelope
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts, tags, headers, meta, redeliveries
  FROM agentpost.envelopes
 WHERE id = %(id)s

-- name: inbox
-- Processing order: blocking, urgent, normal; creation order within a level. While a blocking
-- envelope waits unconsumed, it holds back the rest of the inbox.
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts, tags, headers, meta, redeliveries
  FROM agentpost.envelopes e
 WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL
   AND (e.rank = 0 OR NOT EXISTS (
            SELECT 1 FROM agentpost.envelopes b
             WHERE b.recipient = %(ws)s AND b.status = 'acknowledged'
               AND b.consumed_at IS NULL AND b.rank = 0))
 ORDER BY e.rank, coalesce(e.queue_pos, e.seq)
 LIMIT %(limit)s

-- name: queued
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts, tags, headers, meta, redeliveries
  FROM agentpost.envelopes
 WHERE recipient = %(ws)s AND status = 'validated'
 ORDER BY seq

-- name: workspace
SELECT id, role, lineage, parent, originator, delegation, state, created_at, updated_at
  FROM agentpost.workspaces
 WHERE id = %(id)s

-- name: workspaces
SELECT id, role, lineage, parent, originator, delegation, state, created_at, updated_at
  FROM agentpost.workspaces
 ORDER BY created_at, id

-- name: signals
SELECT id, workspace_id, signal, ref, reason, emitted_by, at
  FROM agentpost.signals
 WHERE workspace_id = %(ws)s AND id > %(after)s
 ORDER BY id

-- name: rights
SELECT id, holder, target, kind, state, created_by, via_envelope
  FROM agentpost.port_rights
 WHERE holder = %(ws)s AND (%(all)s OR state = 'live')
 ORDER BY created_at, id

-- name: send_options
-- Before a send, in one round trip: whether the sender exists, the envelope types it may send
-- the recipient now, and the required fields of one type (NULL: not registered). A type is
-- sendable as the store's send decides it: a live right (send or send_once) of the sender to
-- a recipient that takes envelopes (not integrating, closed or failed), and a matrix row from
-- a role of the sender's lineage to one of the recipient's, or a delegation edge (WACP §2:
-- directive and feedback down to a delegating sender's children, query up to a delegating
-- parent). Reads only.
SELECT s.id IS NOT NULL,
       CASE WHEN s.id IS NULL OR t.id IS NULL
                 OR t.state IN ('integrating', 'closed', 'failed')
                 OR NOT EXISTS (SELECT 1 FROM agentpost.port_rights r
                                 WHERE r.holder = s.id AND r.target = t.id
                                   AND r.state = 'live')
            THEN '{}'::text[]
            ELSE ARRAY(SELECT DISTINCT p.type FROM agentpost.permissions p
                        WHERE p.sender_role = ANY (s.lineage)
                          AND p.receiver_role = ANY (t.lineage))
                 || CASE WHEN s.delegation AND t.parent IS NOT DISTINCT FROM s.id
                         THEN ARRAY['directive', 'feedback'] ELSE '{}'::text[] END
                 || CASE WHEN t.delegation AND s.parent IS NOT DISTINCT FROM t.id
                         THEN ARRAY['query'] ELSE '{}'::text[] END
       END,
       (SELECT ty.required_fields FROM agentpost.envelope_types ty WHERE ty.name = %(type)s)
  FROM (VALUES (1)) AS one(x)
  LEFT JOIN agentpost.workspaces s ON s.id = %(ws)s
  LEFT JOIN agentpost.workspaces t ON t.id = %(to)s

-- name: trail
-- A workspace's entries are its chain's and its consumer lanes' (sql/0083).
SELECT id, chain, chain_seq, event, envelope_id, at, record
  FROM agentpost.trail
 WHERE (%(chain)s::text IS NULL
        OR chain = ANY (ARRAY[%(chain)s::text] || agentpost.consumer_lanes(%(chain)s)))
   AND (%(envelope_id)s::text IS NULL OR envelope_id = %(envelope_id)s)
   AND (%(event)s::text IS NULL OR event = %(event)s)
   AND id > %(after)s
 ORDER BY id
 LIMIT %(limit)s

-- name: verify_chain
-- One chain's entries from a sequence number on: a range scan of the unique index
-- (chain, chain_seq), in its order (no sort), however long the chain.
SELECT id, chain, chain_seq, event, envelope_id,
       (extract(epoch FROM at) * 1000000)::bigint, record, prev_hash, hash, mac
  FROM agentpost.trail
 WHERE chain = %(chain)s AND chain_seq >= %(start)s
 ORDER BY chain_seq

-- name: verify_chains
-- Several short chains' entries, each from its own sequence number on: one range scan of the
-- unique index (chain, chain_seq) per chain. The order by chain, then sequence number, is
-- what the check needs; the scans deliver it, so the sort only confirms it chain by chain.
SELECT t.id, t.chain, t.chain_seq, t.event, t.envelope_id,
       (extract(epoch FROM t.at) * 1000000)::bigint, t.record, t.prev_hash, t.hash, t.mac
  FROM unnest(%(chains)s::text[], %(starts)s::bigint[]) WITH ORDINALITY AS p(chain, start, k)
 CROSS JOIN LATERAL (SELECT x.* FROM agentpost.trail x
                      WHERE x.chain = p.chain AND x.chain_seq >= p.start) t
 ORDER BY p.k, t.chain_seq

-- name: lifecycle_gaps
-- Rows whose state says a trail entry must exist in a given chain when it does not: what
-- cutting the end off a chain would leave behind. The parameter envelopes NULL: every
-- envelope; else only these (verification since a checkpoint: those its new entries name).
-- An inbox's consumed entries may be in one of its consumer lanes (sql/0083).
SELECT x.chain, e.id, e.status, x.event
  FROM agentpost.envelopes e
 CROSS JOIN LATERAL (VALUES
        ('envelope_created', e.sender, e.status IN ('validated', 'acknowledged', 'undeliverable')),
        ('envelope_delivered', e.recipient, e.status = 'acknowledged'),
        ('signal_emitted', e.recipient, e.status = 'acknowledged'),
        ('envelope_rejected', e.sender, e.status = 'rejected'),
        ('signal_emitted', e.sender, e.status IN ('rejected', 'undeliverable')),
        ('envelope_undeliverable', e.sender, e.status = 'undeliverable'),
        ('envelope_consumed', e.recipient, e.consumed_at IS NOT NULL)) AS x(event, chain, required)
 WHERE x.required
   AND (%(envelopes)s::text[] IS NULL OR e.id = ANY (%(envelopes)s::text[]))
   AND NOT EXISTS (SELECT 1 FROM agentpost.trail t
                    WHERE t.envelope_id = e.id AND t.event = x.event
                      AND agentpost.lane_inbox(t.chain) = x.chain)
 ORDER BY e.seq
 LIMIT 100

-- name: envelope_gaps
-- Envelope rows that differ from what the trail signed for them (WACP §3, Integrity): each
-- field of the row's state against its last lifecycle entry, each fixed field against its
-- creation entry (sql/0017_envelope_rows.sql). A row edited outside the store's functions, or
-- entries cut off the end of a chain, shows here, named by envelope and field. Entries written
-- before 0017 carry no state and are not compared. The parameter envelopes as in
-- lifecycle_gaps. (OFFSET 0 keeps the row's signed state computed once per row: inlined, it
-- was rebuilt, payload digest included, for each of the 18 fields compared, 7x the cost.)
SELECT coalesce(last.chain, born.chain), e.id, d.field, d.in_row, d.signed, d.entry
  FROM agentpost.envelopes e
 CROSS JOIN LATERAL (SELECT agentpost._envelope_row(e, true) AS now OFFSET 0) cur
  LEFT JOIN LATERAL (SELECT t.chain, t.chain_seq, t.record::jsonb -> 'body' -> 'row' AS row
                       FROM agentpost.trail t
                      WHERE t.envelope_id = e.id
                        AND t.event IN ('envelope_created', 'envelope_rejected',
                                        'envelope_delivered', 'envelope_delivery_failed',
                                        'envelope_undeliverable', 'envelope_leased',
                                        'lease_nacked', 'lease_expired', 'envelope_consumed',
                                        'envelope_requeued')
                      ORDER BY t.id DESC
                      LIMIT 1) last ON true
  LEFT JOIN LATERAL (SELECT t.chain, t.chain_seq, t.event,
                            t.record::jsonb -> 'body' -> 'row' -> 'fixed' AS fixed
                       FROM agentpost.trail t
                      WHERE t.envelope_id = e.id
                        AND t.event IN ('envelope_created', 'envelope_rejected')
                      ORDER BY t.id
                      LIMIT 1) born ON true
 CROSS JOIN LATERAL (
       SELECT k.key AS field, cur.now -> k.key AS in_row, k.value AS signed,
              format('its last lifecycle entry (%%s #%%s)', last.chain, last.chain_seq) AS entry
         FROM jsonb_each(last.row - 'fixed') k
        WHERE cur.now -> k.key IS DISTINCT FROM k.value
       UNION ALL
       SELECT k.key, cur.now -> 'fixed' -> k.key, k.value,
              format('its %%s entry (%%s #%%s)', born.event, born.chain, born.chain_seq)
         FROM jsonb_each(born.fixed) k
        WHERE cur.now -> 'fixed' -> k.key IS DISTINCT FROM k.value) d
 WHERE %(envelopes)s::text[] IS NULL OR e.id = ANY (%(envelopes)s::text[])
 ORDER BY e.seq, d.field
 LIMIT 100

-- name: record_gaps
-- Commands and routed envelopes whose row is not where their last trail entry left it: a row
-- edited outside the store's functions, or the end cut off a chain. (The trail's hashes cover
-- the entries; this covers the rows they describe.) The parameters commands / routes NULL:
-- every command / route; else only these ids.
SELECT 'command:' || c.id, c.id, c.state, 'command_state_change to ' || c.state
  FROM agentpost.commands c
 WHERE (%(commands)s::text[] IS NULL OR c.id = ANY (%(commands)s::text[]))
   AND c.state IS DISTINCT FROM (
       SELECT split_part(t.record::jsonb -> 'body' -> 'lifecycle' ->> 'transition', '→', 2)
         FROM agentpost.trail t
        WHERE t.chain = 'command:' || c.id AND t.event = 'command_state_change'
        ORDER BY t.chain_seq DESC
        LIMIT 1)
UNION ALL
SELECT 'route:' || r.id, r.envelope_id, coalesce(r.end_actor, r.phase, 'routed'),
       'route_progress at index ' || r.current
  FROM agentpost.routes r
 WHERE (%(routes)s::text[] IS NULL OR r.id = ANY (%(routes)s::text[]))
   AND NOT EXISTS (
       SELECT 1
         FROM (SELECT t.record::jsonb -> 'body' AS body
                 FROM agentpost.trail t
                WHERE t.envelope_id = r.envelope_id AND t.event = 'route_progress'
                ORDER BY t.id DESC
                LIMIT 1) last
        WHERE last.body ->> 'id' = r.id
          AND (last.body ->> 'current')::int = r.current
          AND last.body ->> 'end' IS NOT DISTINCT FROM r.end_actor
          AND last.body ->> 'phase' IS NOT DISTINCT FROM r.phase)
LIMIT 100

-- name: missing_rows
-- The rows the trail names that are gone (protocol/named_rows.py says which an entry names):
-- a row deleted outright leaves nothing for the row checks above to compare, only entries
-- that name it. Each parameter holds the ids of one kind named by the entries verified (all
-- of them, or those since a checkpoint), a batch at a time. Each id is one primary-key probe,
-- a scalar subquery: as an anti-join, a batch of thousands was planned as a hash join over
-- the whole table, once per batch. A rule is the one row the store deletes (remove_rule):
-- one whose last definition entry in the system chain is rule_removed is not missing (that
-- chain is read only for a rule whose row is gone). Returns (kind, id, step) per row missing.
SELECT 'envelope', n.id, NULL FROM unnest(%(envelopes)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.envelopes x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'command', n.id, NULL FROM unnest(%(commands)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.commands x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'saga', n.id, NULL FROM unnest(%(sagas)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.sagas x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'saga step', n.saga, n.step
  FROM unnest(%(step_sagas)s::text[], %(step_names)s::text[]) n(saga, step)
 WHERE (SELECT x.position FROM agentpost.saga_steps x
         WHERE x.saga_id = n.saga AND x.name = n.step) IS NULL
UNION ALL
SELECT 'rule', n.id, NULL FROM unnest(%(rules)s::text[]) n(id)
 WHERE CASE WHEN (SELECT x.id FROM agentpost.rules x WHERE x.id = n.id) IS NOT NULL THEN false
            ELSE (SELECT t.event FROM agentpost.trail t
                   WHERE t.chain = 'system' AND t.event IN ('rule_defined', 'rule_removed')
                     AND t.record::jsonb -> 'body' ->> 'id' = n.id
                   ORDER BY t.chain_seq DESC
                   LIMIT 1) IS DISTINCT FROM 'rule_removed' END
UNION ALL
SELECT 'workspace', n.id, NULL FROM unnest(%(workspaces)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.workspaces x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'route', n.id, NULL FROM unnest(%(routes)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.routes x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'port right', n.id, NULL FROM unnest(%(rights)s::text[]) n(id)
 WHERE (SELECT x.id FROM agentpost.port_rights x WHERE x.id = n.id) IS NULL
UNION ALL
SELECT 'role', n.id, NULL FROM unnest(%(roles)s::text[]) n(id)
 WHERE (SELECT x.name FROM agentpost.roles x WHERE x.name = n.id) IS NULL
UNION ALL
SELECT 'type', n.id, NULL FROM unnest(%(types)s::text[]) n(id)
 WHERE (SELECT x.name FROM agentpost.envelope_types x WHERE x.name = n.id) IS NULL

-- name: row_digests
-- Per kind of row the trail names (protocol/named_rows.py), the table's row count and the sum
-- of each row's keyed hash (protocol/row_digest.py: the first 8 bytes of HMAC-SHA256 under the
-- row key, given as its pads, as a signed bigint; the caller takes the sum modulo 2**64). One
-- index-only scan of each table's key; a kind with no rows has no line.
SELECT k.kind, count(*),
       sum(('x' || encode(substr(sha256(%(opad)s || sha256(%(ipad)s || k.key)), 1, 8),
                          'hex'))::bit(64)::bigint)
  FROM (SELECT 'envelope' AS kind, convert_to(id, 'UTF8') AS key FROM agentpost.envelopes
        UNION ALL SELECT 'command', convert_to(id, 'UTF8') FROM agentpost.commands
        UNION ALL SELECT 'saga', convert_to(id, 'UTF8') FROM agentpost.sagas
        UNION ALL SELECT 'saga step', convert_to(saga_id, 'UTF8') || '\x00'::bytea
                                      || convert_to(name, 'UTF8') FROM agentpost.saga_steps
        UNION ALL SELECT 'rule', convert_to(id, 'UTF8') FROM agentpost.rules
        UNION ALL SELECT 'workspace', convert_to(id, 'UTF8') FROM agentpost.workspaces
        UNION ALL SELECT 'route', convert_to(id, 'UTF8') FROM agentpost.routes
        UNION ALL SELECT 'port right', convert_to(id, 'UTF8') FROM agentpost.port_rights
        UNION ALL SELECT 'role', convert_to(name, 'UTF8') FROM agentpost.roles
        UNION ALL SELECT 'type', convert_to(name, 'UTF8') FROM agentpost.envelope_types) k
 GROUP BY k.kind

-- name: route_entries
-- The entries (chain, seq) of the `route_progress` events that name each route given by its
-- id: the run since a checkpoint asks whether one lies before the checkpoint (the route
-- existed then) or all after it (the route was created since). One probe of trail_route_rows
-- (sql/0073) per route.
SELECT n.id, t.chain, t.chain_seq
  FROM unnest(%(routes)s::text[]) n(id)
 CROSS JOIN LATERAL (SELECT t.chain, t.chain_seq FROM agentpost.trail t
                      WHERE t.event = 'route_progress'
                        AND (t.record::jsonb -> 'body' ->> 'id') = n.id) t

-- name: registry_before
-- For the rules and types given: the system chain's rule_defined / rule_removed /
-- type_registered entries up to seq %(seq)s (a checkpoint's head of the chain), in order, and
-- 'builtin' for each type a migration made (named by no entry). Whether each existed at the
-- checkpoint follows. A range of the system chain (registry changes only), read only when
-- entries since the checkpoint define a rule or a type.
SELECT t.chain_seq, t.event, coalesce(b.body ->> 'id', b.body ->> 'type')
  FROM agentpost.trail t
 CROSS JOIN LATERAL (SELECT t.record::jsonb -> 'body' AS body) b
 WHERE t.chain = 'system' AND t.chain_seq <= %(seq)s
   AND ((t.event IN ('rule_defined', 'rule_removed')
         AND b.body ->> 'id' = ANY (%(rules)s::text[]))
        OR (t.event = 'type_registered' AND b.body ->> 'type' = ANY (%(types)s::text[])))
UNION ALL
SELECT 0, 'builtin', x.name FROM agentpost.envelope_types x
 WHERE x.builtin AND x.name = ANY (%(types)s::text[])
 ORDER BY 1

-- name: envelopes_gone
-- Every envelope an entry names (its envelope_id) that is gone, with the smallest chain of an
-- entry naming it: the index trail_envelope read whole (index only) against the envelopes'
-- key. Run when a verification since a checkpoint finds the envelopes' digest changed.
SELECT n.id, (SELECT min(t.chain) FROM agentpost.trail t WHERE t.envelope_id = n.id)
  FROM (SELECT DISTINCT t.envelope_id AS id FROM agentpost.trail t
         WHERE t.envelope_id IS NOT NULL) n
 WHERE NOT EXISTS (SELECT 1 FROM agentpost.envelopes e WHERE e.id = n.id)

-- name: routes_gone
-- Every route a `route_progress` entry names (its id; a family's root is named by its own
-- entries too) that is gone, with the smallest chain naming it: trail_route_rows (sql/0073).
SELECT n.id, n.chain
  FROM (SELECT t.record::jsonb -> 'body' ->> 'id' AS id, min(t.chain) AS chain
          FROM agentpost.trail t WHERE t.event = 'route_progress'
         GROUP BY 1) n
 WHERE NOT EXISTS (SELECT 1 FROM agentpost.routes r WHERE r.id = n.id)

-- name: rights_gone
-- Every port right a port_right_* entry names that is gone, with the smallest chain naming
-- it: trail_right_rows (sql/0073).
SELECT n.id, n.chain
  FROM (SELECT t.record::jsonb -> 'body' ->> 'right_id' AS id, min(t.chain) AS chain
          FROM agentpost.trail t
         WHERE t.event IN ('port_right_created', 'port_right_transferred',
                           'port_right_consumed', 'port_right_revoked')
         GROUP BY 1) n
 WHERE n.id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM agentpost.port_rights r WHERE r.id = n.id)

-- name: saga_steps_gone
-- Every saga step an entry of a saga's chain names (its body's `step`) that is gone: a range
-- of the (chain, chain_seq) index over the `saga:` chains, a key probe per entry.
SELECT DISTINCT substr(t.chain, 6), b.body ->> 'step'
  FROM agentpost.trail t
 CROSS JOIN LATERAL (SELECT t.record::jsonb -> 'body' AS body) b
 WHERE t.chain >= 'saga:' AND t.chain < 'saga;'
   AND jsonb_typeof(b.body -> 'step') = 'string'
   AND (SELECT x.position FROM agentpost.saga_steps x
         WHERE x.saga_id = substr(t.chain, 6) AND x.name = b.body ->> 'step') IS NULL

-- name: system_entries
-- The system chain's entries of the events given (registry changes), for the rows their
-- bodies name.
SELECT t.chain, t.event, t.record FROM agentpost.trail t
 WHERE t.chain = 'system' AND t.event = ANY (%(events)s::text[])


-- name: send
CALL agentpost.send(%(drafts)s, %(origin)s, %(user)s, %(timeout_ms)s, NULL)

-- name: send_one
CALL agentpost.send_one(%(sender)s, %(recipient)s, %(type)s, %(format)s, %(content)s,
                        %(attachments)s, %(in_reply_to)s, %(priority)s, %(keys)s,
                        %(timeout_ms)s, NULL)

-- name: send_checked
CALL agentpost.send_checked(%(sender)s, %(recipient)s, %(type)s, %(format)s, %(content)s,
                            %(attachments)s, %(in_reply_to)s, %(priority)s, %(keys)s,
                            %(meta)s, %(timeout_ms)s, NULL)

-- name: transition
CALL agentpost.transition(%(ws)s, %(state)s, NULL)

-- name: redeliver
CALL agentpost.redeliver(%(timeout_ms)s, NULL)

-- name: recover
CALL agentpost.recover(NULL)

-- name: lease
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts, tags, headers, meta, redeliveries, lease_token, leases, lease_until,
       lease_holder
  FROM agentpost.lease(%(ws)s, %(max)s, %(ttl_ms)s, %(holder)s)

-- name: expire_leases
CALL agentpost.expire_leases(NULL)

-- name: fire_rules
CALL agentpost.fire_rules(%(timeout_ms)s, NULL)

-- name: dead_letters
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts, tags, headers, meta, redeliveries
  FROM agentpost.envelopes
 WHERE recipient = %(ws)s AND delivered_at IS NOT NULL AND status = 'undeliverable'
 ORDER BY seq DESC
 LIMIT %(limit)s

-- name: latest_per_agent
-- The last envelope delivered to each inbox: one probe of envelopes_delivered per workspace.
SELECT w.id, l.*
  FROM agentpost.workspaces w
 CROSS JOIN LATERAL (
        SELECT id, sender, recipient, originator, type, format, content, attachments,
               in_reply_to, rights, priority, created_at, origin, status, seq, reason,
               delivered_at, consumed_at, attempts, tags, headers, meta, redeliveries
          FROM agentpost.envelopes e
         WHERE e.recipient = w.id AND e.delivered_at IS NOT NULL
         ORDER BY e.seq DESC
         LIMIT 1) l
 WHERE %(ws)s::text IS NULL OR w.id = %(ws)s
 ORDER BY w.id

-- name: inbox_stats
-- Depth and in-flight from the inbox index; rates and enqueue -> first-lease latency from the
-- most recent deliveries (at most %(sample)s, within %(window_s)s seconds); counters from
-- inbox_counters.
WITH inbox AS (
    SELECT e.lease_token, e.lease_until
      FROM agentpost.envelopes e
     WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL
), recent AS (
    SELECT e.created_at, e.first_leased_at
      FROM agentpost.envelopes e
     WHERE e.recipient = %(ws)s AND e.delivered_at IS NOT NULL
     ORDER BY e.seq DESC
     LIMIT %(sample)s
), windowed AS (
    SELECT count(*) FILTER (WHERE created_at >= now() - %(window_s)s * interval '1 second')
               AS n_in,
           count(*) FILTER (WHERE first_leased_at >= now() - %(window_s)s * interval '1 second')
               AS n_out,
           count(*) AS n,
           min(created_at) AS oldest,
           max(created_at) AS last_ts,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM first_leased_at - created_at) * 1000) AS p50,
           percentile_cont(0.95) WITHIN GROUP (
               ORDER BY extract(epoch FROM first_leased_at - created_at) * 1000) AS p95
      FROM recent
)
SELECT jsonb_build_object(
    'depth', (SELECT count(*) FROM inbox),
    'in_flight', (SELECT count(*) FROM inbox
                   WHERE lease_token IS NOT NULL AND lease_until > now()),
    'delayed', (SELECT count(*) FROM inbox WHERE lease_token IS NULL AND lease_until > now()),
    'dead_lettered', coalesce(c.dead, 0),
    'enqueued', w.n_in, 'delivered', w.n_out,
    'acks', coalesce(c.acks, 0), 'nacks', coalesce(c.nacks, 0),
    'redeliveries', coalesce(c.redeliveries, 0), 'expiries', coalesce(c.expiries, 0),
    -- over the window, or over the span of a full sample when it covers less time
    'rate_in', round((w.n_in / greatest(0.001, CASE
        WHEN w.n >= %(sample)s THEN least(%(window_s)s,
                                          extract(epoch FROM now() - w.oldest))
        ELSE %(window_s)s END))::numeric, 3),
    'rate_out', round((w.n_out / greatest(0.001, CASE
        WHEN w.n >= %(sample)s THEN least(%(window_s)s,
                                          extract(epoch FROM now() - w.oldest))
        ELSE %(window_s)s END))::numeric, 3),
    'lat_p50_ms', round(w.p50::numeric, 3), 'lat_p95_ms', round(w.p95::numeric, 3),
    'last_ts', w.last_ts)
  FROM windowed w
  LEFT JOIN agentpost.inbox_counters c ON c.workspace_id = %(ws)s

-- name: rules
SELECT definition FROM agentpost.rules ORDER BY id

-- name: next_due
-- Seconds until the earliest lease expiry or end of a nack delay in an inbox.
SELECT greatest(0, extract(epoch FROM min(e.lease_until) - clock_timestamp()))::float8
  FROM agentpost.envelopes e
 WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL
   AND e.lease_until IS NOT NULL

-- name: leasable
-- How many envelopes lease() could take from an inbox now: a walk of the inbox's part of the
-- hot index (sql/0050_hot_path.sql).
SELECT agentpost.leasable(%(ws)s)

-- name: checkpoint_start
-- The first statement of a checkpoint's REPEATABLE READ transaction, so it fixes the
-- snapshot: the time, and a transactional WAL message. Committed synchronously, that message
-- flushes the WAL up to it, so every commit the snapshot sees (phase 2's asynchronous ones
-- too) is on disk before the checkpoint is handed out: a crash cannot take back an entry a
-- checkpoint anchors.
SELECT now(), set_config('synchronous_commit', 'on', true),
       pg_logical_emit_message(true, 'agentpost.trail-checkpoint', '')

-- name: verify_start
-- The first statement of a verification's REPEATABLE READ transaction: its snapshot's time,
-- and (on the primary) the same flush as checkpoint_start, since the heads a verification
-- checks become the checkpoint it hands out for the next run to verify since. On a standby
-- what it sees was flushed on the primary before it was sent.
SELECT now(),
       CASE WHEN NOT pg_is_in_recovery()
            THEN set_config('synchronous_commit', 'on', true) END,
       CASE WHEN NOT pg_is_in_recovery()
            THEN pg_logical_emit_message(true, 'agentpost.trail-verification', '') END

-- name: chain_heads
-- Every chain's head (its last entry): a skip scan of the unique index (chain, chain_seq),
-- one probe per chain instead of a pass over every entry.
WITH RECURSIVE c(chain) AS (
    (SELECT t.chain FROM agentpost.trail t ORDER BY t.chain LIMIT 1)
    UNION ALL
    SELECT (SELECT t.chain FROM agentpost.trail t WHERE t.chain > c.chain
             ORDER BY t.chain LIMIT 1)
      FROM c WHERE c.chain IS NOT NULL
)
SELECT c.chain, h.chain_seq, h.hash
  FROM c
 CROSS JOIN LATERAL (SELECT t.chain_seq, t.hash FROM agentpost.trail t WHERE t.chain = c.chain
                      ORDER BY t.chain_seq DESC LIMIT 1) h
 WHERE c.chain IS NOT NULL

-- name: anchored_entries
-- For each chain a checkpoint anchors at a sequence number: the hash of its entry at that
-- number (NULL: none), and its head now (0: no entries left).
SELECT a.chain, t.hash, coalesce(h.chain_seq, 0)
  FROM unnest(%(chains)s::text[], %(seqs)s::bigint[]) AS a(chain, seq)
  LEFT JOIN agentpost.trail t ON t.chain = a.chain AND t.chain_seq = a.seq
  LEFT JOIN LATERAL (SELECT x.chain_seq FROM agentpost.trail x WHERE x.chain = a.chain
                      ORDER BY x.chain_seq DESC LIMIT 1) h ON true

-- name: roles
SELECT name, inherits, lineage, builtin
  FROM agentpost.roles
 ORDER BY name

-- name: envelope_types
SELECT t.name, t.required_fields, t.builtin,
       coalesce(jsonb_agg(jsonb_build_object('sender', p.sender_role,
                                             'receiver', p.receiver_role)
                          ORDER BY p.sender_role, p.receiver_role)
                FILTER (WHERE p.type IS NOT NULL), '[]')
  FROM agentpost.envelope_types t
  LEFT JOIN agentpost.permissions p ON p.type = t.name
 GROUP BY t.name
 ORDER BY t.name
