"""``mailtap run console -c CONFIG``: the console's process — uvicorn serving :mod:`.app`.

Start-up checks the ``console`` section and the tokens file (a misconfiguration stops it with a
sentence), ensures the audit topic, then reads the topics once in the background (``/healthz``
answers 503 until that first reading is there). SIGTERM/SIGINT stop uvicorn (it finishes the
requests in flight) and the background reader.
"""

from __future__ import annotations

import functools
import logging

import uvicorn

from connectors.core.config import MailtapConfig, load_config
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs
from mailtap.console.actions import Console
from mailtap.console.app import build_app
from mailtap.console.audit import AuditTrail
from mailtap.console.settings import ConsoleSettings
from mailtap.console.snapshot import SnapshotCache, take
from mailtap.console.tokens import TokenBook

log = logging.getLogger(__name__)

#: uvicorn waits this long for requests in flight at SIGTERM (a replay flushes within 30 s).
GRACEFUL_S = 10


def build_console(cfg: MailtapConfig) -> Console:
    settings = cfg.section("console", ConsoleSettings)
    tokens = TokenBook(settings.tokens_file)
    ensure_topic_specs(cfg.kafka, [TopicSpec(cfg.kafka.topics.audit, 1, COMPACTED)])
    cache = SnapshotCache(functools.partial(take, cfg), settings.refresh_seconds)
    return Console(cfg, settings, tokens, AuditTrail(cfg.kafka), cache)


def run_console(config_path: str) -> None:
    cfg = load_config(config_path)
    # The registry client logs every HTTP request at INFO; the console reads the topics every
    # refresh_seconds, which would be several lines each time.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    console = build_console(cfg)
    settings = console.settings
    console.cache.start()
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(console),
            host=settings.host,
            port=settings.port,
            log_config=None,  # mailtap's logging (text or JSON lines) as every component
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_S,
            server_header=False,
        )
    )
    log.info(
        "console listening",
        extra={"host": settings.host, "port": settings.port, "component": "console"},
    )
    try:
        server.run()
    finally:
        console.cache.stop()
