"""Keep secrets out of logs, params and artifacts: anything shaped like credentials is shown masked.

Not only well-formed `scheme://user:secret@host` URLs: a mistyped scheme (`postgresql:/`, `postgresql//`, none
at all) or a password holding an unencoded `@` or `/` must not leak either, because the messages that quote such
a URL back are exactly the ones saying it could not be parsed.
"""

from __future__ import annotations

import re
import sys
import traceback
from types import TracebackType

MASK = "***"
# A run of characters that can belong to one URL: quotes and whitespace end it (messages quote URLs back).
# Matched from a token's start only (the look-behind): linear in the text, however long a token without '@' is.
_TOKEN_WITH_AT = re.compile(r"(?<![^\s'\"`])[^\s'\"`]*@[^\s'\"`]*")
# `scheme://`, `scheme:/` or `scheme//` not preceded by URL characters (so `user:a//b` is not read as a scheme).
_SCHEME = re.compile(r"(?<![\w:@/.+\-])[A-Za-z][\w+.\-]*(?::/+|//+)")
_KEY_SECRET = re.compile(
    r"(?P<key>(?<![\w-])[\w.-]*?(?:password|passwd|pwd|token|secret|api_key|apikey)=)(?P<value>[^&\s'\"`]*)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`postgresql://me:hunter2@db/x?token=t` -> `postgresql://me:***@db/x?token=***`, anywhere in `text`.

    The password of `user:password@host` is masked whatever precedes it, up to the token's last `@`
    (`postgresql:/me:pa@ss@db` -> `postgresql:/me:***@db`); `key=value` pairs naming a password or token too.
    """
    text = _TOKEN_WITH_AT.sub(lambda m: _mask_userinfo(m[0]), text)
    return _KEY_SECRET.sub(lambda m: f"{m['key']}{MASK}" if m["value"] else m[0], text)


def _mask_userinfo(token: str) -> str:
    head, _, host = token.rpartition("@")
    scheme = _SCHEME.search(head)
    prefix, userinfo = (head[: scheme.end()], head[scheme.end():]) if scheme else ("", head)
    user, colon, secret = userinfo.partition(":")
    if not colon or not secret or secret == MASK:
        return token
    return f"{prefix}{user}:{MASK}@{host}"


def redacting_excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    """sys.excepthook: an unexpected error's traceback quotes values (a URL among them), shown masked."""
    sys.stderr.write(redact("".join(traceback.format_exception(kind, error, tb))))
