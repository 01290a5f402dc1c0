"""Everything that talks to Kafka with librdkafka: client configuration from ``KafkaSettings``
(:mod:`.clients`), topics and their policies, the client log (:mod:`.log`), the one-encoding-per-
topic check (:mod:`.encoding`), the source offsets topic (:mod:`.offsets`), reading a topic to its
end (:mod:`.readtoend`), the transactional writer every source commits through
(:mod:`.transactions`) and the retry of broker answers that heal by themselves, such as a moving
partition leader (:mod:`.retry`). Nothing here knows mail or Avro."""
