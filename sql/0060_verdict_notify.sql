-- Wake-ups for agents waiting on a deferred verdict (Markspace §6.2.1 phase 3, P16).
--
-- A resolution boundary writes its verdicts into agentpost.mark_verdicts (0014) in its own
-- transaction. Every row it inserts NOTIFYs the channel `agentpost_verdict` with a JSON
-- payload {space, scope, resource, agent_id, allowed, boundary}, delivered when that
-- transaction commits, so a listener (a VerdictSensor's trigger) wakes as soon as its
-- agent's verdict is readable, and asks the guard for it. Consuming an ALLOW (an update) is
-- not announced: nobody waits for it. As everywhere, notifications may be lost with a
-- connection: a listener also polls.
CREATE FUNCTION agentpost._notify_verdict() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agentpost_verdict', json_build_object(
        'space', NEW.space, 'scope', NEW.scope, 'resource', NEW.resource,
        'agent_id', NEW.agent_id, 'allowed', NEW.allowed, 'boundary', NEW.boundary)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER mark_verdicts_notify AFTER INSERT ON agentpost.mark_verdicts
    FOR EACH ROW EXECUTE FUNCTION agentpost._notify_verdict();
