-- MCP servers a person connects are connections (provider 'mcp', label: the server's name), so
-- their tokens are sealed, rotated and checked like every other connection secret.
ALTER TABLE connections DROP CONSTRAINT connections_provider_check;
ALTER TABLE connections ADD CONSTRAINT connections_provider_check CHECK (provider IN ('google', 'caldav', 'mcp'));

-- Each tool a server listed, as last listed, and what the person decided about it. Approval is of
-- a definition (its fingerprint), not of a name: a tool whose listed fingerprint differs from
-- the approved one is held until it is approved again.
CREATE TABLE mcp_tools (
    connection_id         uuid NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    name                  text NOT NULL,
    definition            jsonb NOT NULL,
    fingerprint           text NOT NULL,
    listed                boolean NOT NULL DEFAULT true,
    approved              jsonb,
    approved_fingerprint  text,
    rejected_fingerprint  text,
    safe_unattended       boolean NOT NULL DEFAULT false,
    listed_at             timestamptz NOT NULL DEFAULT now(),
    decided_at            timestamptz,
    PRIMARY KEY (connection_id, name)
);

-- A call that changes something through an MCP tool, proposed in a live turn: it runs only when
-- the same call comes again in a later turn of the conversation (the person's answer between).
CREATE TABLE mcp_confirmations (
    conversation_id  uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    call_key         text NOT NULL,
    turn_id          uuid NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, call_key)
);
