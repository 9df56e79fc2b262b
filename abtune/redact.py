"""Keep secrets out of logs, params and artifacts: URLs are shown with their password masked."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<secret>[^@\s]*)@")
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:password|passwd|token|secret|access_token)=)[^&\s]*", re.IGNORECASE)
MASK = "***"


def redact(text: str) -> str:
    """`postgresql://me:hunter2@db/x?token=t` -> `postgresql://me:***@db/x?token=***`, anywhere in `text`."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}{MASK}", text)
