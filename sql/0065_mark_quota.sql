-- The per-agent quota and gc() of the mark space (Markspace §8; agentpost.marks.postgres).
--
-- A space with max_marks_per_agent counts, before each write, the writing agent's live marks
-- (stored and not superseded) under a transaction-scoped advisory lock on (space, agent), so
-- that two processes writing for one agent never both see room for one more mark. This index
-- makes that count a walk of the agent's own marks. gc() deletes rows (the only statement that
-- ever does): superseded marks, and marks whose strength can never come back.
CREATE INDEX marks_agent ON agentpost.marks (space, agent_id);
