"""mailtap.dev.dovecot: the rendered configuration and the passwd-file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mailtap.dev import dovecot


def test_rendered_config_is_accepted_by_dovecot(tmp_path: Path) -> None:
    layout = dovecot.DovecotLayout(tmp_path / "dovecot")
    dovecot.render(layout, "127.0.0.1", 14300)

    text = layout.config.read_text()
    assert "${" not in text
    assert f"base_dir = {layout.base_dir}" in text
    assert "port = 14300" in text
    if shutil.which("dovecot") is None:
        pytest.fail("dovecot is not installed: run `make venv` (deploy/bootstrap.sh)")
    shown = subprocess.run(
        ["dovecot", "-n", "-c", str(layout.config)], capture_output=True, text=True, check=True
    ).stdout
    assert "disable_plaintext_auth = no" in shown
    assert f"mail_location = maildir:{layout.mail_dir}/%u/Maildir" in shown


def test_default_accounts_are_created_once(tmp_path: Path) -> None:
    layout = dovecot.DovecotLayout(tmp_path / "dovecot")
    dovecot.render(layout, "127.0.0.1", 14300)
    accounts = dovecot.users(layout.passwd_file)
    assert [u for u, _ in accounts] == list(dovecot.DEFAULT_USERS)
    assert {p for _, p in accounts} == {dovecot.DEFAULT_PASSWORD}
    assert {"alice@example.com", "bob@example.com"} <= {u for u, _ in accounts}


def test_add_user_appends_and_replaces(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    dovecot.add_user(passwd, "x@example.com", "one")
    dovecot.add_user(passwd, "x@example.com", "two")
    assert passwd.read_text() == "x@example.com:{PLAIN}two\n"
    assert dovecot.users(passwd) == [("x@example.com", "two")]


@pytest.mark.parametrize("username", ["", "a:b@example.com", "a@example.com\nroot", "a\r"])
def test_add_user_rejects_what_would_corrupt_the_passwd_file(tmp_path: Path, username: str) -> None:
    with pytest.raises(ValueError, match="username"):
        dovecot.add_user(tmp_path / "passwd", username, "secret")
    assert not (tmp_path / "passwd").exists()
