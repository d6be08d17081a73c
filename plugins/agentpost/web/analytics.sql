-- The analytics page (pages/analytics.py): the latest window of each result table of the
-- Spark jobs (sql/0061_trail_analytics.sql), found by a backward scan of its primary key
-- (window_start, window_end, ...), then that window's rows by the same key, LIMITed.

-- name: latency
SELECT window_start, window_end, inbox, delivered, p50_ms, p95_ms, p99_ms
  FROM agentpost.analytics_inbox_latency
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_inbox_latency
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY p95_ms DESC, inbox
 LIMIT %(limit)s

-- name: outcomes
SELECT window_start, window_end, inbox, outcome, reason, count, rate
  FROM agentpost.analytics_delivery_outcomes
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_delivery_outcomes
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY rate DESC, count DESC, inbox, outcome, reason
 LIMIT %(limit)s

-- name: conflicts
SELECT window_start, window_end, scope, policy, outcome, count
  FROM agentpost.analytics_conflicts
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_conflicts
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY scope, policy, count DESC, outcome
 LIMIT %(limit)s

-- name: commands
SELECT window_start, window_end, workspace, action, commands, executed, failed, rejected,
       canceled, compensated, compensation_rate
  FROM agentpost.analytics_commands
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_commands
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY compensation_rate DESC, commands DESC, workspace, action
 LIMIT %(limit)s

-- name: agents
SELECT window_start, window_end, agent, sent, received, acked, nacked, marks, commands,
       anomaly, anomaly_score, anomaly_reason
  FROM agentpost.analytics_agent_activity
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_agent_activity
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY anomaly DESC, anomaly_score DESC NULLS LAST, sent + received DESC, agent
 LIMIT %(limit)s

-- name: channels
SELECT window_start, window_end, sender, inbox, delivered, p50_ms, p95_ms, p99_ms
  FROM agentpost.analytics_channel_latency
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_channel_latency
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY p95_ms DESC, sender, inbox
 LIMIT %(limit)s

-- name: needs
SELECT window_start, window_end, space, scope, cluster_key, opened, resolved, still_open,
       ttr_p50_s, ttr_p95_s
  FROM agentpost.analytics_needs
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.analytics_needs
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY still_open DESC, opened DESC, space, scope, cluster_key
 LIMIT %(limit)s

-- name: latency_history
-- p50/p95 of some inboxes over the windows starting at or after %(since)s (a range of the
-- primary key's leading column).
SELECT window_start, inbox, p50_ms, p95_ms
  FROM agentpost.analytics_inbox_latency
 WHERE window_start >= %(since)s AND inbox = ANY(%(inboxes)s)
 ORDER BY window_start, inbox
 LIMIT %(limit)s

-- name: runs
SELECT job, window_start, window_end, computed_at, source_rows
  FROM agentpost.analytics_runs
 ORDER BY computed_at DESC
 LIMIT %(limit)s

-- name: audits
-- The latest Spark audit reports (sql/0064_audit_reports.sql) by the finished_at index, with
-- each check's counts taken out of the report: {"<check>": {"checked": n, "failed": m}}.
SELECT a.id, a.started_at, a.finished_at, a.taken_at, a.ok, a.entries, a.failed,
       coalesce((SELECT jsonb_object_agg(c.key, jsonb_build_object(
                            'checked', c.value -> 'checked', 'failed', c.value -> 'failed'))
                   FROM jsonb_each(CASE WHEN jsonb_typeof(a.report -> 'checks') = 'object'
                                        THEN a.report -> 'checks' ELSE '{}' END) AS c),
                '{}') AS checks
  FROM agentpost.audit_reports a
 ORDER BY a.finished_at DESC
 LIMIT %(limit)s
