"""The Avro contract on the wire: the schemas in ``schemas/`` and every version a reader may meet
(:mod:`.schemas`), the registry subjects and their compatibility (:mod:`.registry`), and the two
framings a value is written in, Confluent wire format or single-object (:mod:`.serde`); the
sink's values as Python types (:mod:`.replies`) and the named types the schemas share
(:mod:`.shared`; the mail event's own are in :mod:`connectors.core.mail.event`)."""
