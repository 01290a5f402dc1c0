"""The Avro contract on the wire: the schemas in ``schemas/`` and every version a reader may meet
(:mod:`.schemas`), the registry subjects and their compatibility (:mod:`.registry`), and the two
framings a value is written in, Confluent wire format or single-object (:mod:`.serde`)."""
