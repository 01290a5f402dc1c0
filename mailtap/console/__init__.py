"""The operator console (``mailtap run console``): a REST admin API under ``/api/v1`` in Kafka
Connect's style and a server-rendered page on top of it, reading only the topics mailtap already
has. Every action calls the same function as the CLI command of the same name
(:mod:`mailtap.commands.dlq`, ``mailboxes``, ``suppressions``; :mod:`mailtap.trace`).

Modules, one concern each: :mod:`.settings` (the ``console`` section), :mod:`.tokens` (bearer
tokens, roles, CSRF), :mod:`.audit` (the ``mailtap.audit`` topic), :mod:`.actions` (each action
audited, then the CLI's function), :mod:`.snapshot` (what the page and the list endpoints show,
read from Kafka in the background), :mod:`.charts` (inline SVG), :mod:`.api` (``/api/v1``),
:mod:`.pages` (HTML), :mod:`.app` (wiring, errors, limits), :mod:`.server` (uvicorn),
:mod:`.errors` (401/403). docs/console.md is the user's guide.
"""
