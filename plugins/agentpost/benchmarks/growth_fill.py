"""Filling a scratch store with history for `agentpost bench growth`, inside SQL.

What a filled store holds, per history inbox pair (`hist-s-<j>` sends to its child
`hist-r-<j>`; both made by `agentpost.create_workspace`, so their rights and first entries are
the store's own), in creation order: of the first 90 % of its envelopes, one in 20 rejected
(`invalid_type`), one in 20 dead-lettered (leased and nacked four times,
`redelivery_exhausted`), the rest consumed (leased once and acked); the last 10 % delivered and
waiting in the inbox. Envelope rows, signals and inbox counters are what the store's own steps
leave (compare `sql/0003`, `0005`, `0017`).

Trail entries are the ones those steps write, in the same chains, with the same bodies and the
same signed row states (`agentpost._envelope_row`), recorded by `agentpost._record` and signed
with `agentpost._mac` under the session's key pads, so `verify_trail()` accepts the whole store.
Only the hash chain is computed differently: a hash depends on the one before it, so instead of
`_trail_write`'s loop a window aggregate (`agentpost_bench.chain_hash`, in a schema of the
bench's own) runs the chain over each inbox's entries, a batch of inboxes per statement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

PER_INBOX = 1_000  # envelopes of history per inbox pair
BATCH_PAIRS = 40  # inbox pairs per fill statement (about 200,000 trail entries)
CONTENT = "Summarise the incident reports of the last quarter."

HELPERS = """
CREATE SCHEMA IF NOT EXISTS agentpost_bench;
CREATE OR REPLACE FUNCTION agentpost_bench.chain_step(p_state bytea, p_head bytea,
                                                      p_record text) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN sha256(coalesce(p_state, p_head, decode(repeat('00', 32), 'hex'))
                  || convert_to(p_record, 'UTF8'));
END $$;
CREATE OR REPLACE AGGREGATE agentpost_bench.chain_hash(bytea, text)
    (SFUNC = agentpost_bench.chain_step, STYPE = bytea);
-- a row state as a lifecycle entry signs it (the moving half of agentpost._envelope_row)
CREATE OR REPLACE FUNCTION agentpost_bench.state(p_status text, p_reason text,
        p_delivered timestamptz, p_consumed timestamptz, p_leases int, p_redeliveries int)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('status', p_status, 'reason', p_reason,
                              'delivered_at_us', agentpost._us(p_delivered),
                              'consumed_at_us', agentpost._us(p_consumed),
                              'leases', p_leases, 'redeliveries', p_redeliveries);
$$;
"""

WORKSPACES = """
SELECT count(agentpost.create_workspace('hist-s-' || j, 'coordinator', NULL, 'system', false,
                                        NULL))
     + count(agentpost.create_workspace('hist-r-' || j, 'worker', 'hist-s-' || j, 'system',
                                        false, NULL))
  FROM generate_series(%(j0)s, %(j1)s) j
"""

# the batch: which envelope of which inbox is what, and when it was created (20 µs apart, each
# step of its life a microsecond or two after the last, so every chain's times increase)
BATCH = """
CREATE TEMP TABLE hist_batch ON COMMIT DROP AS
SELECT gen_random_uuid()::text AS id, j, m,
       CASE WHEN m > c.n - c.n / 10 THEN 'waiting'
            WHEN m %% 20 = 7 THEN 'rejected'
            WHEN m %% 20 = 13 THEN 'dead'
            ELSE 'consumed' END AS kind,
       %(t0)s::timestamptz + m * interval '20 microseconds' AS t
  FROM generate_series(%(j0)s, %(j1)s) j
 CROSS JOIN LATERAL (SELECT CASE WHEN j = %(j1)s THEN %(last_n)s ELSE %(n)s END AS n) c
 CROSS JOIN LATERAL generate_series(1, c.n) m
"""

ENVELOPES = """
INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format, content,
                                 priority, origin, status, reason, created_at, delivered_at,
                                 consumed_at, attempts, lease_holder, leases, redeliveries,
                                 first_leased_at, part_day)
SELECT b.id, nextval('agentpost.envelope_seq'), 'hist-s-' || b.j, 'hist-r-' || b.j, 'system',
       CASE b.kind WHEN 'rejected' THEN 'nosuchtype' ELSE 'directive' END, 'markdown',
       CASE WHEN b.kind <> 'rejected' THEN %(content)s END, 'normal', 'agent',
       CASE b.kind WHEN 'rejected' THEN 'rejected' WHEN 'dead' THEN 'undeliverable'
                   ELSE 'acknowledged' END,
       CASE b.kind WHEN 'rejected' THEN 'invalid_type' WHEN 'dead' THEN 'redelivery_exhausted'
       END,
       b.t, CASE WHEN b.kind <> 'rejected' THEN b.t + interval '2 microseconds' END,
       CASE WHEN b.kind = 'consumed' THEN b.t + interval '5 microseconds' END,
       CASE WHEN b.kind <> 'rejected' THEN 1 ELSE 0 END,
       CASE WHEN b.kind = 'consumed' THEN 'hist-consumer' END,
       CASE b.kind WHEN 'consumed' THEN 1 WHEN 'dead' THEN 4 ELSE 0 END,
       CASE b.kind WHEN 'dead' THEN 4 ELSE 0 END,
       CASE WHEN b.kind IN ('consumed', 'dead') THEN b.t + interval '4 microseconds' END,
       CASE WHEN b.j <= %(old_pairs)s THEN %(old_day)s::date
            ELSE (now() AT TIME ZONE 'UTC')::date END
  FROM hist_batch b
 ORDER BY b.j, b.m
"""

SIGNALS = """
INSERT INTO agentpost.signals (workspace_id, signal, ref, reason, emitted_by, at, part_day)
SELECT 'hist-s-' || b.j, s.signal, b.id, s.reason, s.emitted_by, b.t + s.after,
       CASE WHEN b.j <= %(old_pairs)s THEN %(old_day)s::date
            ELSE (now() AT TIME ZONE 'UTC')::date END
  FROM hist_batch b
 CROSS JOIN LATERAL (VALUES
       ('acknowledged', NULL, 'hist-r-' || b.j, interval '2 microseconds', b.kind <> 'rejected'),
       ('rejected', 'invalid_type', 'runtime', interval '0', b.kind = 'rejected'),
       ('failed', 'redelivery_exhausted', 'runtime', interval '11 microseconds',
        b.kind = 'dead')) AS s(signal, reason, emitted_by, after, applies)
 WHERE s.applies
 ORDER BY b.j, b.m, s.after
"""

COUNTERS = """
INSERT INTO agentpost.inbox_counters (workspace_id, leased, acks, nacks, expiries, redeliveries,
                                      dead)
SELECT 'hist-r-' || j, count(*) FILTER (WHERE kind = 'consumed')
                       + 4 * count(*) FILTER (WHERE kind = 'dead'),
       count(*) FILTER (WHERE kind = 'consumed'), 4 * count(*) FILTER (WHERE kind = 'dead'), 0,
       3 * count(*) FILTER (WHERE kind = 'dead'), count(*) FILTER (WHERE kind = 'dead')
  FROM hist_batch GROUP BY j
"""

# Every entry the store's steps would have written for the batch, as (inbox pair, role: 0 the
# sender's chain, 1 the receiver's, envelope, slot within the envelope, event, time, body).
_PARTS = """
SELECT j, 0 AS role, m, 1 AS slot, 'envelope_created' AS event, id, t + us(1) AS at,
       jsonb_build_object('envelope_id', id, 'from', (e).sender, 'to', (e).recipient,
           'type', (e).type, 'priority', (e).priority, 'in_reply_to', NULL,
           'originator', (e).originator, 'origin', 'agent', 'timestamp', t,
           'row', born || agentpost_bench.state('validated', NULL, NULL, NULL, 0, 0)) AS body
  FROM env WHERE kind <> 'rejected'
UNION ALL
SELECT j, 0, m, 1, 'envelope_rejected', id, t + us(1),
       jsonb_build_object('envelope_id', id, 'from', (e).sender, 'to', (e).recipient,
           'type', (e).type, 'reason', (e).reason, 'timestamp', t, 'row', born)
  FROM env WHERE kind = 'rejected'
UNION ALL
SELECT j, 0, m, 2, 'signal_emitted', id, t + us(1),
       jsonb_build_object('to', (e).sender, 'ref', id, 'reason', (e).reason,
                          'signal', 'rejected')
  FROM env WHERE kind = 'rejected'
UNION ALL
SELECT j, 0, m, 2, 'envelope_undeliverable', id, t + us(11),
       jsonb_build_object('envelope_id', id, 'from', (e).sender, 'to', (e).recipient,
           'reason', (e).reason, 'timestamp', t + us(11), 'row', final)
  FROM env WHERE kind = 'dead'
UNION ALL
SELECT j, 0, m, 3, 'signal_emitted', id, t + us(11),
       jsonb_build_object('to', (e).sender, 'ref', id, 'reason', (e).reason,
                          'signal', 'failed')
  FROM env WHERE kind = 'dead'
UNION ALL
SELECT j, 1, m, 1, 'envelope_delivered', id, t + us(3),
       jsonb_build_object('envelope_id', id, 'from', (e).sender, 'to', (e).recipient,
           'attempt', 1, 'delivered_at', (e).delivered_at,
           'row', agentpost_bench.state('acknowledged', NULL, (e).delivered_at, NULL, 0, 0))
  FROM env WHERE kind <> 'rejected'
UNION ALL
SELECT j, 1, m, 2, 'signal_emitted', id, t + us(3),
       jsonb_build_object('to', (e).sender, 'ref', id, 'signal', 'acknowledged')
  FROM env WHERE kind <> 'rejected'
UNION ALL
SELECT j, 1, m, 1 + 2 * a, 'envelope_leased', id, t + us(2 + 2 * a),
       jsonb_build_object('envelope_id', id, 'workspace_id', (e).recipient,
           'holder', 'hist-consumer', 'attempt', a,
           'expires_at', t + us(2 + 2 * a) + interval '30 seconds',
           'row', agentpost_bench.state('acknowledged', NULL, (e).delivered_at, NULL, a, a - 1))
  FROM env CROSS JOIN LATERAL generate_series(1, CASE kind WHEN 'dead' THEN 4 ELSE 1 END) a
 WHERE kind IN ('consumed', 'dead')
UNION ALL
SELECT j, 1, m, 4, 'envelope_consumed', id, t + us(5),
       jsonb_build_object('envelope_id', id, 'workspace_id', (e).recipient,
           'holder', 'hist-consumer', 'attempt', 1, 'via', 'ack', 'row', final)
  FROM env WHERE kind = 'consumed'
UNION ALL
SELECT j, 1, m, 2 + 2 * a, 'lease_nacked', id, t + us(3 + 2 * a),
       jsonb_build_object('envelope_id', id, 'workspace_id', (e).recipient, 'attempt', a,
           'delay_ms', 0, 'redelivery', a, 'dead_lettered', a = 4,
           'row', CASE WHEN a = 4 THEN final ELSE agentpost_bench.state(
                      'acknowledged', NULL, (e).delivered_at, NULL, a, a) END)
  FROM env CROSS JOIN LATERAL generate_series(1, 4) a
 WHERE kind = 'dead'
"""

# The chains: each receiver's entries follow its sender's in id order, as the store writes
# them (the last lifecycle entry of an envelope, by id, is the one that signs its row).
TRAIL = f"""
WITH env AS (
    SELECT b.j, b.m, b.kind, b.t, b.id, x.e, agentpost._envelope_row(x.e, true) AS born,
           agentpost._envelope_row(x.e, false) AS final
      FROM hist_batch b
     CROSS JOIN LATERAL (SELECT e FROM agentpost.envelopes e WHERE e.id = b.id) x
), parts AS ({_PARTS.replace("us(", "agentpost_bench.us(")}
), heads AS (
    SELECT c.j, c.role, c.chain, coalesce(l.chain_seq, 0) AS seq0, l.hash AS hash0
      FROM (SELECT j, r.role, CASE r.role WHEN 0 THEN 'hist-s-' ELSE 'hist-r-' END || j AS chain
              FROM generate_series(%(j0)s, %(j1)s) j, (VALUES (0), (1)) r(role)) c
      LEFT JOIN LATERAL (SELECT t.chain_seq, t.hash FROM agentpost.trail t
                          WHERE t.chain = c.chain ORDER BY t.chain_seq DESC LIMIT 1) l ON true
), numbered AS (
    SELECT p.*, h.chain, h.hash0,
           h.seq0 + row_number() OVER (PARTITION BY p.j, p.role ORDER BY p.m, p.slot)
               AS chain_seq
      FROM parts p JOIN heads h ON h.j = p.j AND h.role = p.role
), recorded AS (
    SELECT n.*, agentpost._record(n.chain, n.chain_seq, n.event, n.id, n.at, n.body) AS record
      FROM numbered n
), hashed AS (
    SELECT r.*, agentpost_bench.chain_hash(r.hash0, r.record) OVER (
               PARTITION BY r.j, r.role ORDER BY r.chain_seq ROWS UNBOUNDED PRECEDING) AS hash
      FROM recorded r
), linked AS (
    SELECT h.*, coalesce(lag(h.hash) OVER (PARTITION BY h.j, h.role ORDER BY h.chain_seq),
                         h.hash0, decode(repeat('00', 32), 'hex')) AS prev
      FROM hashed h
)
INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash, hash,
                             mac, part_day)
SELECT chain, chain_seq, event, id, at, record, prev, hash,
       agentpost._mac(hash, decode(current_setting('agentpost.mac_ipad'), 'hex'),
                      decode(current_setting('agentpost.mac_opad'), 'hex')),
       CASE WHEN j <= %(old_pairs)s THEN %(old_day)s::date
            ELSE (now() AT TIME ZONE 'UTC')::date END
  FROM linked
 ORDER BY j, role, chain_seq
"""

US_HELPER = """
CREATE OR REPLACE FUNCTION agentpost_bench.us(p_n int) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT p_n * interval '1 microsecond' $$;
"""


@dataclass
class Filled:
    """What the store holds after fills: history envelopes, inbox pairs, seconds spent."""

    envelopes: int = 0
    pairs: int = 0
    seconds: float = 0.0
    #: the inbox pairs up to this one are written as if in the month of `old_day` (their
    #: entries' partition, sql/0086): what `bench growth --large` archives and prunes
    old_pairs: int = 0
    old_day: Any = None


def install_helpers(cur: Any) -> None:
    cur.execute(HELPERS + US_HELPER)


def grow(cur: Any, filled: Filled, target: int) -> None:
    """Add history until the store holds `target` envelopes of it, in batches of inbox pairs.
    `cur` is a cursor of an EnvelopeStore session (its key pads sign the entries)."""
    add = target - filled.envelopes
    if add <= 0:
        return
    started = time.perf_counter()
    pairs = max(1, add // PER_INBOX)
    per = add // pairs
    first = filled.pairs + 1
    last = filled.pairs + pairs
    for j0 in range(first, last + 1, BATCH_PAIRS):
        j1 = min(last, j0 + BATCH_PAIRS - 1)
        last_n = per + add - per * pairs if j1 == last else per
        _batch(cur, j0, j1, per, last_n, filled)
    filled.envelopes = target
    filled.pairs = last
    filled.seconds += time.perf_counter() - started


def _batch(cur: Any, j0: int, j1: int, per: int, last_n: int, filled: Filled) -> None:
    """One transaction: the batch's workspaces, envelopes, signals, counters and entries."""
    params = {"j0": j0, "j1": j1, "n": per, "last_n": last_n, "content": CONTENT,
              "old_pairs": filled.old_pairs, "old_day": filled.old_day}
    cur.execute("BEGIN")
    try:
        cur.execute("SET LOCAL work_mem = '256MB'")
        cur.execute(WORKSPACES, params)
        cur.execute("SELECT clock_timestamp()")
        params["t0"] = cur.fetchone()[0]
        for statement in (BATCH, ENVELOPES, SIGNALS, COUNTERS, TRAIL):
            cur.execute(statement, params)
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
