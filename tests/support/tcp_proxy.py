"""The fault proxy of the tests lives in `mailtap.dev.tcp_proxy` (``mailtap soak`` drives it too)."""

from mailtap.dev.tcp_proxy import TcpProxy

__all__ = ["TcpProxy"]
