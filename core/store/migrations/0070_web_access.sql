-- Web chat and API access: the owner's password, browser sessions, CLI tokens, and a live feed.

-- A web login is a handle (kind 'web'); its password lives here, argon2id-hashed.
CREATE TABLE web_credentials (
    handle_id      uuid PRIMARY KEY REFERENCES handles (id) ON DELETE CASCADE,
    password_hash  text NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Browser sessions. Only a hash of the cookie's token is stored.
CREATE TABLE web_sessions (
    token_hash   bytea PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    csrf_token   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX web_sessions_account ON web_sessions (account_id);

-- Bearer tokens for `pepper chat` and other API clients. Only a hash is stored.
CREATE TABLE api_tokens (
    token_hash    bytea PRIMARY KEY,
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz
);

-- Every new message is announced, so every process can push it to the person's open chats.
CREATE FUNCTION pepper_notify_message() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pepper_messages',
                      json_build_object('conversation_id', NEW.conversation_id, 'id', NEW.id)::text);
    RETURN NEW;
END $$;
CREATE TRIGGER messages_notify AFTER INSERT ON messages FOR EACH ROW EXECUTE FUNCTION pepper_notify_message();
