-- Slots (core.slots): which plugin occupies a slot, for the installation, a household or one
-- account; the per-call fallbacks counted so `pepper slot list` shows them. Households: accounts
-- that share one configuration. Usage (core.usage): tokens, cost and call time per person per day,
-- caps per person, and the tier the owner was last told about.

CREATE TABLE households (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE CHECK (length(btrim(name)) > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE accounts ADD COLUMN household_id uuid REFERENCES households (id) ON DELETE SET NULL;

-- scope 'installation' has scope_id NULL; 'household' a household id; 'account' an account id.
CREATE TABLE slot_settings (
    scope       text NOT NULL CHECK (scope IN ('installation', 'household', 'account')),
    scope_id    uuid,
    slot        text NOT NULL,
    occupant    text NOT NULL CHECK (length(btrim(occupant)) > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope = 'installation') = (scope_id IS NULL))
);
CREATE UNIQUE INDEX slot_settings_one ON slot_settings (scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'), slot);

CREATE TABLE slot_fallbacks (
    slot         text NOT NULL,
    occupant     text NOT NULL,
    reason       text NOT NULL,  -- raised | timeout | malformed
    count        bigint NOT NULL DEFAULT 0,
    last_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, occupant, reason)
);

CREATE TABLE usage_days (
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    day           date NOT NULL,
    tokens        bigint NOT NULL DEFAULT 0,
    cost          numeric NOT NULL DEFAULT 0,   -- in the price table's currency (USD)
    call_seconds  double precision NOT NULL DEFAULT 0,
    model_calls   integer NOT NULL DEFAULT 0,
    tier          text NOT NULL DEFAULT 'normal',   -- the tier the owner was last told about today
    PRIMARY KEY (account_id, day)
);

-- NULL: the settings' default cap.
CREATE TABLE account_limits (
    account_id     uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    daily_tokens   bigint CHECK (daily_tokens >= 0),
    daily_cost     numeric CHECK (daily_cost >= 0),
    daily_minutes  double precision CHECK (daily_minutes >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- A deleted account or household takes its slot settings with it (scope_id names either table).
CREATE FUNCTION slot_settings_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM slot_settings WHERE scope = TG_ARGV[0] AND scope_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER accounts_slot_settings AFTER DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION slot_settings_forget('account');
CREATE TRIGGER households_slot_settings AFTER DELETE ON households
    FOR EACH ROW EXECUTE FUNCTION slot_settings_forget('household');
