"""The claim-check store: large payloads live outside Kafka and events carry a content-addressed
reference. :mod:`.store` is the interface and its errors, :mod:`.local` the file store, :mod:`.s3`
the S3-compatible one, :mod:`.open` picks one from the configuration; nothing imports upward."""
