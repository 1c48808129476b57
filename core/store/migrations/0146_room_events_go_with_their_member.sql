-- A deleted person's room messages go with them (pepper account delete forgets a person's data;
-- the room keeps them on the homeserver, where the members saw them). Events of senders who are
-- not members (account_id NULL) are not touched.
ALTER TABLE room_events DROP CONSTRAINT IF EXISTS room_events_account_id_fkey;
ALTER TABLE room_events ADD CONSTRAINT room_events_account_id_fkey
    FOREIGN KEY (account_id) REFERENCES accounts (id) ON DELETE CASCADE;
