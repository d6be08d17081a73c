-- Capability tokens of the HTTP/WebSocket gateway (Courier §12; agentpost.gateway.tokens).
-- A token's secret is shown once, when it is created, and never stored: the table keeps its
-- SHA-256 hash. Scopes are `<kind>:<pattern>:<action>` strings, checked by the gateway.
-- rate/burst (both or neither) override the gateway's default per-token bucket.

CREATE TABLE agentpost.gateway_tokens (
    id           text        PRIMARY KEY CHECK (id ~ '^tok_[0-9a-f]{12}$'),
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    secret_hash  bytea       NOT NULL UNIQUE CHECK (octet_length(secret_hash) = 32),
    scopes       text[]      NOT NULL CHECK (cardinality(scopes) BETWEEN 1 AND 50),
    rate         double precision CHECK (rate > 0 AND rate < 'Infinity'),
    burst        integer     CHECK (burst >= 1),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at   timestamptz,
    CHECK ((rate IS NULL) = (burst IS NULL))
);

COMMENT ON TABLE agentpost.gateway_tokens IS
    'Gateway capability tokens; secret_hash = sha256(secret), the secret itself is never stored';
