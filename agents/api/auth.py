"""``Authorization: Bearer <api key>`` authentication."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from agent_platform.client_ip import client_ip
from agents.api.throttling import bad_key_record, bad_key_wait
from agents.models import ApiKey
from agents.services import api_key_authenticate


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``request.user`` is the ``ApiKey`` (only its digest is stored).

    Unknown and revoked keys are counted per client address (``PLATFORM_API_BAD_KEY_RATE``); an address past
    that rate gets a ``429 throttled`` with ``Retry-After`` for every key it sends, until its window ends."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKey, None] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _sep, raw = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not raw.strip():
            raise exceptions.AuthenticationFailed(_("Use 'Authorization: Bearer <api key>'."))
        ip = client_ip(request.META)
        refused = _("Too many requests with unknown API keys from here.")
        if (wait := bad_key_wait(ip)) is not None:
            raise exceptions.Throttled(wait=wait, detail=refused)
        key = api_key_authenticate(raw_key=raw.strip())
        if key is None:
            # Counted, and told "invalid" only within the allowance: of a burst that passed the read above
            # together, the ones past it are refused as the later ones would be.
            if (wait := bad_key_record(ip)) is not None:
                raise exceptions.Throttled(wait=wait, detail=refused)
            raise exceptions.AuthenticationFailed(_("Invalid or revoked API key."))
        return key, None

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'


def caller_of(request: Any) -> ApiKey:
    return request.user  # type: ignore[no-any-return]
