-- The routes and port rights that trail entries name in their bodies, indexed (issue 22 §2:
-- a verification since a checkpoint reports a row deleted whenever the trail named it).
--
-- A verification since a checkpoint compares each table with the checkpoint's row digest
-- (protocol/row_digest.py), updated by the rows the new entries create. A route row is
-- created or updated by the same `route_progress` entry, so the run asks this index whether
-- an entry before the checkpoint named the route (one probe per route the new entries name).
-- When a digest differs (a row was deleted), the run names every row of that kind that the
-- trail names and that is gone: for routes and port rights, through these indexes rather than
-- a pass over the whole trail. Both are partial, so the entries of other events (most of the
-- trail, and the whole send path) never touch them.
CREATE INDEX trail_route_rows ON agentpost.trail ((record::jsonb -> 'body' ->> 'id'))
 WHERE event = 'route_progress';
CREATE INDEX trail_right_rows ON agentpost.trail ((record::jsonb -> 'body' ->> 'right_id'))
 WHERE event IN ('port_right_created', 'port_right_transferred', 'port_right_consumed',
                 'port_right_revoked');
