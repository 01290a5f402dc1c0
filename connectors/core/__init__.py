"""What every mailtap component shares, and nothing that knows one connector.

``kafka/`` talks to Kafka (clients, topics, offsets, the transactional writer), ``avro/`` is the
contract on the wire, ``claimcheck/`` keeps large payloads outside Kafka, ``source/`` is the one
source contract that IMAP, EWS and any later source implement, ``mail/`` turns MIME into events;
``config``, ``errors``, ``metrics``, ``oauth2``, ``redact`` and ``tracing`` serve them all. The map
and the import rules: docs/architecture.md.
"""
