-- The owner's side of the answering service: messages the owner has dealt with, and calendar
-- invitations sent to callers who gave an email address (only when the owner turned them on).
ALTER TABLE answering_messages ADD COLUMN handled_at timestamptz;
ALTER TABLE answering_bookings ADD COLUMN caller_email text;
ALTER TABLE answering_bookings ADD COLUMN invited_at timestamptz;
ALTER TABLE answering_bookings ADD COLUMN invite_error text;
