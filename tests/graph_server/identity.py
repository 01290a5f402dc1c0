"""The identity platform endpoints of the Graph test server (what MSAL for Python calls).

- ``GET /{tenant}/v2.0/.well-known/openid-configuration``: MSAL's tenant discovery with
  ``instance_discovery=False``;
- ``POST /{tenant}/oauth2/v2.0/token``: the grants of ``auth.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .auth import Principal, TokenError
from .mailbox import Mailbox

if TYPE_CHECKING:
    from .server import GraphTestServer


class IdentityEndpoints:
    """A ``ServerExtension`` with routes of its own (outside ``/v1.0``)."""

    def __init__(self, server: GraphTestServer) -> None:
        self.server = server

    def install(self, app: web.Application) -> None:
        app.router.add_get(
            "/{tenant}/v2.0/.well-known/openid-configuration", self._openid_configuration
        )
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token)

    async def close(self) -> None:
        return None

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse | None:
        return None

    async def _openid_configuration(self, request: web.Request) -> web.Response:
        """The tenant's OpenID Connect metadata, the subset MSAL reads plus the usual fields
        (https://learn.microsoft.com/en-us/entra/identity-platform/v2-protocols-oidc#fetch-the-openid-configuration-document)."""
        tenant = request.match_info["tenant"]
        if tenant != self.server.tenant:
            error = TokenError(400, "invalid_tenant", 90002, f"Tenant '{tenant}' not found.")
            return web.json_response(error.body(), status=400)
        base = f"{self.server.url}/{tenant}"
        return web.json_response(
            {
                "token_endpoint": f"{base}/oauth2/v2.0/token",
                "token_endpoint_auth_methods_supported": [
                    "client_secret_post",
                    "private_key_jwt",
                    "client_secret_basic",
                ],
                "jwks_uri": f"{base}/discovery/v2.0/keys",
                "response_modes_supported": ["query", "fragment", "form_post"],
                "subject_types_supported": ["pairwise"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
                "scopes_supported": ["openid", "profile", "email", "offline_access"],
                "issuer": f"{self.server.url}/{tenant}/v2.0",
                "request_uri_parameter_supported": False,
                "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                "end_session_endpoint": f"{base}/oauth2/v2.0/logout",
                "tenant_region_scope": "EU",
                "cloud_instance_name": "microsoftonline.com",
                "cloud_graph_host_name": "graph.windows.net",
                "msgraph_host": "graph.microsoft.com",
            }
        )

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        tenant = request.match_info["tenant"]
        endpoint = f"{self.server.url}/{tenant}/oauth2/v2.0/token"
        try:
            with self.server.store.cond:
                body = self.server.tokens.token(tenant, form, endpoint)
        except TokenError as e:
            return web.json_response(e.body(), status=e.status)
        return web.json_response(body, headers={"Cache-Control": "no-store, no-cache"})
