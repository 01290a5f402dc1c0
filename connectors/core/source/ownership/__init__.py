"""Which source instance owns which work unit (a mailbox, or a mailbox folder), and how that
changes at runtime: the consumer group that divides the units (:mod:`.group`), the compacted
catalog of units added and removed at runtime (:mod:`.catalog`), and the wiring of both into a
running source (:mod:`.wiring`)."""
