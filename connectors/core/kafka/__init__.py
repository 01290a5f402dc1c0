"""Everything that talks to Kafka with librdkafka: client configuration from ``KafkaSettings``
(:mod:`.clients`) with its security properties and the sentences for refused logins and
certificates (:mod:`.security`), topics and their policies, the client log (:mod:`.log`), the
one-encoding-per-topic check (:mod:`.encoding`), the source offsets topic (:mod:`.offsets`),
reading a topic to its end (:mod:`.readtoend`) and the transactional writer every source commits
through (:mod:`.transactions`). Nothing here knows mail or Avro."""
