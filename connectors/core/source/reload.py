"""Configuration reload of a running source (SIGHUP): the accounts change, nothing else does.

Credentials live in the configuration's account definitions, so a new account needs the file
changed; a reload lets every running instance take it without a restart (issue 12)::

    reload_on_sighup(path, "imap", ImapSourceSettings, config, source)   # main thread
    source.run()

What a reload applies: the source section's ``accounts``. An account added starts (with a group,
on the instance whose share it falls in: every instance gets the same file and signal), one
removed stops (its workers are stopped and joined, as when a rebalance revokes it), one whose
settings changed (password, host, folders...) restarts with them. Folders added or removed with
``mailtap mailboxes`` keep applying on top of the configured accounts.

What it does not apply: every other setting the source reads (``kafka``, ``claim_check``,
``health`` and the source section's other keys, ``group`` included). Those are compared with the
values the process started with and named in one error line; they take effect at the next
restart. The accounts part is applied all the same: new and changed accounts then run with the
settings every other account of the process runs with, and every instance of a group does the
same, so they keep agreeing on who owns what. Sections the source does not read (``smtp``,
``streams``, the other source) are not looked at.

A file that cannot be read or does not validate changes nothing: one error line names the file
and what is wrong, the source goes on with what it runs, and a later good file applies.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import ConfigError
from connectors.core.metrics import SourceMetrics

log = logging.getLogger(__name__)

#: Sections of the file every source reads besides its own.
CORE_SECTIONS = ("kafka", "claim_check", "health")
#: The only key of the source section a reload applies.
ACCOUNTS = "accounts"

OK = "ok"
FAILED = "failed"


class _Account(Protocol):
    @property
    def name(self) -> str: ...


class _SourceSettings(Protocol):
    @property
    def accounts(self) -> Sequence[_Account]: ...


class _Reloadable(Protocol):
    """What a source offers a reload (ImapSource, EwsSource)."""

    @property
    def settings(self) -> Any: ...
    @property
    def metrics(self) -> SourceMetrics: ...
    @property
    def started(self) -> threading.Event: ...
    @property
    def stop_event(self) -> threading.Event: ...
    def reconfigure(self, settings: Any) -> None: ...


S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class AccountsDiff:
    """Account names, by what a reload does to them."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def __str__(self) -> str:
        def names(found: tuple[str, ...]) -> str:
            return ",".join(found) or "none"

        return (
            f"accounts added: {names(self.added)}; removed: {names(self.removed)}; "
            f"changed (restarted where they run): {names(self.changed)}"
        )


def diff_accounts(old: Sequence[_Account], new: Sequence[_Account]) -> AccountsDiff:
    """What changes from the ``old`` accounts to the ``new`` ones, matched by name (the name is
    the account's identity: keys, cursors and transactional ids derive from it)."""
    before = {a.name: a for a in old}
    after = {a.name: a for a in new}
    return AccountsDiff(
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        changed=tuple(n for n in after if n in before and after[n] != before[n]),
    )


def needs_restart(
    old: MailtapConfig,
    new: MailtapConfig,
    section: str,
    old_source: BaseModel,
    new_source: BaseModel,
) -> list[str]:
    """The settings the source reads, other than its accounts, that differ (key paths, never
    values: they may hold secrets)."""
    changed = [name for name in CORE_SECTIONS if getattr(old, name) != getattr(new, name)]
    changed += [
        f"{section}.{field}"
        for field in type(old_source).model_fields
        if field != ACCOUNTS and getattr(old_source, field) != getattr(new_source, field)
    ]
    return changed


class ConfigReloader(Generic[S]):
    """Re-reads the configuration file when asked and hands the source its new accounts.

    ``reconfigure(settings)`` is the source's: ``settings`` are those the process started with,
    except for the accounts, which are the file's. It runs on this class's thread, never in a
    signal handler (``request`` only sets an event: a handler must not take locks).
    """

    def __init__(
        self,
        path: str,
        section: str,
        model: type[S],
        config: MailtapConfig,
        settings: S,
        reconfigure: Callable[[S], None],
        metrics: SourceMetrics,
    ) -> None:
        self.path = path
        self.section = section
        self._model = model
        self._started = config
        self._started_settings = settings
        self._running = settings
        self._reconfigure = reconfigure
        self._metrics = metrics
        self._requested = threading.Event()
        for result in (OK, FAILED):  # both series exist from the start, at 0
            metrics.config_reloads.labels(section, result)

    def request(self) -> None:
        """Ask for a reload (safe in a signal handler)."""
        self._requested.set()

    def follow(self, ready: threading.Event, stopping: threading.Event) -> threading.Thread:
        """Serve requests on a thread once ``ready`` (the source started) until ``stopping``.
        A request made during start-up is served once the source runs."""

        def serve() -> None:
            while not ready.wait(0.5):
                if stopping.is_set():
                    return
            while not stopping.is_set():
                if self._requested.wait(0.5) and not stopping.is_set():
                    self._requested.clear()  # requests made meanwhile are served by this read
                    self.reload()

        thread = threading.Thread(target=serve, name="config-reload", daemon=True)
        thread.start()
        return thread

    def reload(self) -> bool:
        """Read the file and apply its accounts; False when it was refused (nothing changed)."""
        try:
            config = load_config(self.path)
            settings = config.section(self.section, self._model)
        except ConfigError as exc:
            return self._refused(str(exc))
        except Exception as exc:  # never end a running source over a reload
            log.exception("config reload of %s failed", self.path)
            return self._refused(f"{type(exc).__name__}: {exc}")
        diff = diff_accounts(_accounts(self._running), _accounts(settings))
        if diff:
            running = self._started_settings.model_copy(update={ACCOUNTS: _accounts(settings)})
            try:
                self._reconfigure(running)
            except Exception as exc:
                log.exception("config reload of %s: applying the accounts failed", self.path)
                return self._refused(f"{type(exc).__name__}: {exc}")
            self._running = running
        log.info("config reload of %s: %s", self.path, diff, extra={"source": self.section})
        later = needs_restart(self._started, config, self.section, self._started_settings, settings)
        if later:
            log.error(
                "config reload of %s: %s changed, which takes effect only after a restart; "
                "the running values stay (only %s.accounts applies on reload)",
                self.path,
                ", ".join(later),
                self.section,
                extra={"source": self.section, "restart_needed": later},
            )
        self._metrics.config_reloads.labels(self.section, OK).inc()
        return True

    def _refused(self, reason: str) -> bool:
        reason = " ".join(reason.split())  # one line (a YAML error spans several)
        log.error(
            "config reload of %s refused, the running configuration stays: %s",
            self.path,
            reason,
            extra={"source": self.section},
        )
        self._metrics.config_reloads.labels(self.section, FAILED).inc()
        return False


def _accounts(settings: BaseModel) -> tuple[_Account, ...]:
    source: _SourceSettings = settings  # type: ignore[assignment]
    return tuple(source.accounts)


def reload_on_sighup(
    path: str, section: str, model: type[S], config: MailtapConfig, source: _Reloadable
) -> ConfigReloader[S]:
    """Reload ``source``'s accounts from ``path`` on SIGHUP, from the time it has started until
    it stops. Call it from the main thread (signal handlers are set there) before the source
    starts: SIGHUP would otherwise end the process, and one sent during start-up waits for it."""
    # One line per reload, shown even when the CLI's default level is WARNING.
    logger = logging.getLogger(__name__)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    reloader = ConfigReloader(
        path, section, model, config, source.settings, source.reconfigure, source.metrics
    )
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reloader.request())
    reloader.follow(ready=source.started, stopping=source.stop_event)
    return reloader
