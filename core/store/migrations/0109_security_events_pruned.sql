-- Security events are pruned after a retention period (core.security.prune_security_events, run
-- by the memory jobs) and the line lockout counts recent failed verifications by kind: both read
-- by time, which was a scan of the whole table.

CREATE INDEX security_events_created ON security_events (created_at);
CREATE INDEX security_events_kind_created ON security_events (kind, created_at);
