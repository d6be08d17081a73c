-- The analytics page (pages/analytics.py).

-- name: latest_window
-- The latest window of one result table of the Spark jobs (sql/0061_trail_analytics.sql,
-- sql/0063_more_analytics.sql), found by a backward scan of its primary key
-- (window_start, window_end, ...), then that window's rows by the same key, LIMITed. A
-- template for str.format: pages/analytics.py fills in the table, its columns and its
-- order from its fixed RESULTS, never from a request, so the seven tables share one query.
SELECT window_start, window_end, {columns}
  FROM agentpost.{table}
 WHERE (window_start, window_end) = (SELECT window_start, window_end
                                       FROM agentpost.{table}
                                      ORDER BY window_start DESC, window_end DESC LIMIT 1)
 ORDER BY {order}
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
