-- Mail Pepper sends is an outbox row first: 'queued' commits before anything leaves, 'sending'
-- while the mail server or Gmail has it (with its Message-ID), then 'sent'. A send that may have
-- left but was not confirmed (the connection broke) stays 'failed' as the record of it.
ALTER TABLE email_messages DROP CONSTRAINT email_messages_status_check;
ALTER TABLE email_messages ADD CONSTRAINT email_messages_status_check
    CHECK (status IN ('draft', 'queued', 'sending', 'sent', 'failed', 'discarded'));
