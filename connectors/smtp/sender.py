"""One command's send: render, screen, check, wait for a rate slot, and hand it to the relay.

Runs once the command's INTENT is being recorded (see :mod:`connectors.smtp.rounds`): the relay
reads the envelope and the content while that transaction commits, and the final "." goes out
only once it has. Every way it can end is an outcome per recipient on the command's
:class:`~connectors.smtp.recorder.Work`:

- the command does not render: FAILED with the reason, nothing sent;
- a recipient on the suppression list: SUPPRESSED, the others go on;
- larger than ``smtp.max_message_bytes``: FAILED;
- no rate slot within ``smtp.max_rate_wait`` of the batch's start: DEFERRED;
- the relay's (or Graph's) answer, classified per recipient by the transport
  (:mod:`connectors.smtp.transports`).
"""

from __future__ import annotations

import asyncio
import logging

from connectors.core import tracing
from connectors.smtp.admission import render_failed
from connectors.smtp.classify import DeliveryStatus, RecipientOutcome
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import RenderError
from connectors.smtp.ratelimit import SendRateLimiter
from connectors.smtp.recorder import Work
from connectors.smtp.render import BlobFetcher, render
from connectors.smtp.suppression import SuppressionTable, screen
from connectors.smtp.transports import MailTransport

__all__ = ["CommandSender"]

log = logging.getLogger(__name__)


class CommandSender:
    """Sends commands through the sink's transport (a relay or Graph); counts the sends made."""

    def __init__(
        self,
        settings: SmtpSinkSettings,
        transport: MailTransport,
        *,
        suppressions: SuppressionTable | None,
        fetch_blob: BlobFetcher | None,
        tracing: bool,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.suppressions = suppressions
        self.fetch_blob = fetch_blob
        self.tracing = tracing
        self.limiter = SendRateLimiter(settings.rate, settings.domain_rates)
        self.sent_total = 0

    async def send(self, item: Work, max_rate_wait: float, committed: asyncio.Event) -> None:
        """Render and send ``item``, its final "." only once its INTENT has ``committed``.

        Ends only after that commit too, whatever the outcome (nothing to send, refused before
        DATA): an outcome must never be recorded before its intent.
        """
        if not self.tracing:
            await self._attempt(item, max_rate_wait, committed)
        else:
            # The send is a span under the command's; its outcome events carry it on.
            with tracing.span_headers("smtp.send", item.record.headers()) as headers:
                item.trace = headers
                await self._attempt(item, max_rate_wait, committed)
        await committed.wait()

    async def _attempt(self, item: Work, max_rate_wait: float, committed: asyncio.Event) -> None:
        try:
            rendered = render(
                item.command,
                fetch_blob=self.fetch_blob,
                verp_domain=self.settings.verp_domain,
                return_path=self.settings.from_address,
                recipients=item.recipients,
                unsubscribe=self.settings.suppression.list_unsubscribe,
            )
        except RenderError as exc:
            render_failed(item, exc)
            return
        # Suppressed recipients are not sent to: their outcome is SUPPRESSED, the others go on.
        rendered, item.outcomes = screen(rendered, self.suppressions)
        if not rendered.recipients:
            return
        if len(rendered.data) > self.settings.max_message_bytes:
            reason = (
                f"message of {len(rendered.data)} bytes exceeds "
                f"smtp.max_message_bytes={self.settings.max_message_bytes}"
            )
            item.outcomes += [
                RecipientOutcome(r, DeliveryStatus.FAILED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
        if not await self.limiter.acquire(rendered.recipients, max_rate_wait):
            reason = (
                f"rate limit: no sending slot for these recipient domains within "
                f"smtp.max_rate_wait={self.settings.max_rate_wait:g}s of the batch's start "
                f"(smtp.rate / smtp.domain_rates)"
            )
            item.outcomes += [
                RecipientOutcome(r, DeliveryStatus.DEFERRED, diagnostic=reason)
                for r in rendered.recipients
            ]
            return
        outcomes = await self.transport.deliver(rendered, committed)
        item.outcomes += outcomes
        if any(o.status is DeliveryStatus.SENT for o in outcomes):
            self.sent_total += 1
        if log.isEnabledFor(logging.DEBUG):  # the outcomes' text is built for nothing otherwise
            log.debug(
                "sent command_id=%s attempt=%d outcomes=%s",
                item.command_id,
                item.attempt,
                ",".join(f"{o.recipient}:{o.status.value}" for o in item.outcomes),
            )
