-- Read queries of the envelope store. Writes go through the functions in sql/.

-- name: get_envelope
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts
  FROM agentpost.envelopes
 WHERE id = %(id)s

-- name: inbox
-- Processing order: blocking, urgent, normal; creation order within a level. While a blocking
-- envelope waits unconsumed, it holds back the rest of the inbox.
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts
  FROM agentpost.envelopes e
 WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL
   AND (e.rank = 0 OR NOT EXISTS (
            SELECT 1 FROM agentpost.envelopes b
             WHERE b.recipient = %(ws)s AND b.status = 'acknowledged'
               AND b.consumed_at IS NULL AND b.rank = 0))
 ORDER BY e.rank, e.seq
 LIMIT %(limit)s

-- name: queued
SELECT id, sender, recipient, originator, type, format, content, attachments, in_reply_to,
       rights, priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
       attempts
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

-- name: trail
SELECT id, chain, chain_seq, event, envelope_id, at, record
  FROM agentpost.trail
 WHERE (%(chain)s::text IS NULL OR chain = %(chain)s)
   AND (%(envelope_id)s::text IS NULL OR envelope_id = %(envelope_id)s)
   AND (%(event)s::text IS NULL OR event = %(event)s)
   AND id > %(after)s
 ORDER BY id
 LIMIT %(limit)s

-- name: verify_entries
SELECT id, chain, chain_seq, event, envelope_id,
       (extract(epoch FROM at) * 1000000)::bigint, record, prev_hash, hash, mac
  FROM agentpost.trail
 ORDER BY chain, chain_seq, id

-- name: lifecycle_gaps
-- Rows whose state says a trail entry must exist in a given chain when it does not: what
-- cutting the end off a chain would leave behind.
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
   AND NOT EXISTS (SELECT 1 FROM agentpost.trail t
                    WHERE t.envelope_id = e.id AND t.event = x.event AND t.chain = x.chain)
 ORDER BY e.seq
 LIMIT 100

-- name: send
CALL agentpost.send(%(drafts)s, %(origin)s, %(user)s, %(timeout_ms)s, NULL)

-- name: send_one
CALL agentpost.send_one(%(sender)s, %(recipient)s, %(type)s, %(format)s, %(content)s,
                        %(attachments)s, %(in_reply_to)s, %(priority)s, %(keys)s,
                        %(timeout_ms)s, NULL)

-- name: transition
CALL agentpost.transition(%(ws)s, %(state)s, NULL)

-- name: redeliver
CALL agentpost.redeliver(%(timeout_ms)s, NULL)

-- name: recover
CALL agentpost.recover(NULL)
