"""The one source contract: what IMAP, EWS and any later source implement, and what they share.

:mod:`.worker` is the folder worker's run / fence / backoff / commit loop (the contract), written
once; :mod:`.records` turns parsed mail into Kafka records; :mod:`.settings` the settings every
source section shares; :mod:`.backoff` and :mod:`.reconnect` how a worker waits after an error;
:mod:`.reload` applies a SIGHUP; :mod:`.ownership` decides which instance runs which work unit."""
