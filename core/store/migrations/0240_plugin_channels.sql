-- Text channels from plugins (docs/slots.md): their messages are on channel 'plugin' (the plugin's
-- name and the sender's address in the message's meta), and a sender is a handle of kind 'plugin'
-- whose value is 'PLUGIN:address'.
ALTER TABLE messages DROP CONSTRAINT messages_channel_check;
ALTER TABLE messages ADD CONSTRAINT messages_channel_check
    CHECK (channel IN ('sms', 'whatsapp', 'voice', 'web', 'email', 'cli', 'answering', 'plugin'));
ALTER TABLE handles DROP CONSTRAINT handles_kind_check;
ALTER TABLE handles ADD CONSTRAINT handles_kind_check CHECK (kind IN ('phone', 'email', 'web', 'matrix', 'plugin'));
