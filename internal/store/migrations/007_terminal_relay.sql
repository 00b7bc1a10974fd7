-- Cross-replica terminal sessions (issue 10): the replica that opened a session splices it in
-- memory; owner_url is that replica's advertised internal URL (--advertise-url), so another
-- replica receiving either end's attach relays it there. '' is a session of a controller
-- that predates this column (served locally, as before).
ALTER TABLE terminal_sessions ADD COLUMN owner_url text NOT NULL DEFAULT '';
CREATE INDEX terminal_sessions_owner ON terminal_sessions (owner_url) WHERE status <> 'ended';

---- create above / drop below ----

DROP INDEX IF EXISTS terminal_sessions_owner;
ALTER TABLE terminal_sessions DROP COLUMN IF EXISTS owner_url;
