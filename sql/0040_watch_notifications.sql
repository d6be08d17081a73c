-- Wake-ups for the Airflow sensors that wait on the mark space (the store NOTIFYs inbox
-- deliveries and command changes already: 0005, 0012). A notification is only a hint: the
-- waiter re-checks in the database, and polls when a notification is lost with a connection.
--
-- `agentpost_need`, payload the need's id: a need was resolved (marks/postgres.py's
-- resolve() writes a copy carrying resolved_by that supersedes it). Only such rows fire, so
-- ordinary mark writes pay one WHEN test per row.
-- `agentpost_verdict`, payload the agent's id: a deferred-resolution boundary recorded a
-- verdict for the agent (0014: it replaces the rows of its (space, scope, resource)).
-- Identical notifications of one transaction are folded into one by Postgres.

-- One trigger function for both: NOTIFY channel TG_ARGV[0] with the new row's column
-- TG_ARGV[1] as payload.
CREATE FUNCTION agentpost._notify_column() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], to_jsonb(NEW) ->> TG_ARGV[1]);
    RETURN NULL;
END $$;

CREATE TRIGGER marks_need_resolved AFTER INSERT ON agentpost.marks
    FOR EACH ROW WHEN (NEW.resolved_by IS NOT NULL AND NEW.supersedes IS NOT NULL)
    EXECUTE FUNCTION agentpost._notify_column('agentpost_need', 'supersedes');

CREATE TRIGGER mark_verdicts_decided AFTER INSERT ON agentpost.mark_verdicts
    FOR EACH ROW EXECUTE FUNCTION agentpost._notify_column('agentpost_verdict', 'agent_id');
