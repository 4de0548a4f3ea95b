"""Secrets in what a user typed: a queue URL's password (``redis://:PW@host``, ``postgresql://user:PW@host/db``, a
``?password=`` query parameter, a libpq DSN's ``password=``) is never shown, logged or written. ``masked`` is the
text as a message or a file may hold it (a command line's words each: ``autofit.machine._outdir.masked_argv``)."""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Tuple
from urllib.parse import unquote

MASK = "***"
# Query parameters (and libpq DSN keywords) that carry a secret: Redis' and libpq's password, tokens, keys of auth.
SECRET_NAME = re.compile(r"pass|pwd|secret|token|auth|credential", re.IGNORECASE)
DSN_WORD = re.compile(r"(?P<name>\b[A-Za-z_]+)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'|\S+)")


def masked(text: str, secrets_of: Optional[str] = None) -> str:
    """``text`` with every password it holds replaced by ``***``: a URL's userinfo password, its secret query
    parameters, and ``name=value`` words whose name says secret (a DSN). Text without a secret is returned as is.
    With ``secrets_of`` (a URL), each password that URL holds is replaced too, as typed and as decoded: a driver's
    error may quote what it was given."""
    if secrets_of is not None:
        return _scrubbed(masked(text), _url_secrets(secrets_of))
    if "://" in text:
        return _masked_url(text)
    if "=" in text:
        text = DSN_WORD.sub(lambda m: f"{m['name']}={MASK}" if SECRET_NAME.search(m["name"]) else m[0], text)
    return text


def _masked_url(text: str) -> str:
    head, sep, rest = text.partition("://")
    prefix = ""
    if "=" in head:  # --worker-queue=redis://...
        prefix, _, head = head.rpartition("=")
        prefix += "="
    userinfo, host, tail = _url_split(head, rest)
    if userinfo is not None:
        if ":" in userinfo:
            userinfo = f"{userinfo.split(':', 1)[0]}:{MASK}"
        elif not _lone_user_named(head):
            userinfo = MASK
        host = f"{userinfo}@{host}"
    return f"{prefix}{head}{sep}{host}{QUERY_SECRET.sub(lambda m: m[1] + MASK, tail)}"


# A secret query parameter anywhere after the host (``?password=PW``, ``&sslpassword=PW``, ``;password=PW``): its value
# ends at the next parameter or fragment.
QUERY_SECRET = re.compile(r"((?<=[?&;])[^=&;#?/]*(?:pass|pwd|secret|token|auth|credential)[^=&;#?/]*=)[^&;#]*",
                          re.IGNORECASE)
# A lone name before "@" is a user for a database's driver; for Redis (``redis://PW@host``), or a scheme autofit does
# not know, it may be the password, and is masked.
LONE_USER_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")


def _lone_user_named(head: str) -> bool:
    return head.strip().split("+", 1)[0].lower() in LONE_USER_SCHEMES


def url_parts(url: str) -> Tuple[str, str, str]:
    """A URL's scheme, its host part (userinfo included) and the rest (a path, a query), split as ``_url_split``."""
    head, _, rest = url.partition("://")
    userinfo, host, tail = _url_split(head, rest)
    return head, host if userinfo is None else f"{userinfo}@{host}", tail


def _url_split(head: str, rest: str) -> Tuple[Optional[str], str, str]:
    """The userinfo (None where there is none), the host and what follows, of the text after ``scheme://``.

    As RFC 3986 reads it, the host part ends at the first ``/``, ``?`` or ``#``, and an ``@`` in it ends the userinfo.
    A password typed unencoded may hold those characters (``redis://:a/b?c@h``): where the host part has no ``@`` but
    a later one follows, and the host part has a colon with something other than a port after it, the userinfo runs
    to that last ``@``. A query's own ``@`` (``?user=admin@server``) after a host and port is left a query's."""
    end = next((index for index, char in enumerate(rest) if char in "/?#"), len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        return userinfo, host, tail
    if "@" in tail and ":" in authority and not authority.startswith("["):
        after_colon = authority.split(":", 1)[1]
        if not after_colon.isdigit():
            userinfo, _, remainder = rest.rpartition("@")
            cut = next((index for index, char in enumerate(remainder) if char in "/?#"), len(remainder))
            return userinfo, remainder[:cut], remainder[cut:]
    return None, authority, tail


def _scrubbed(text: str, secrets: Iterable[str]) -> str:
    """``text`` (a driver's error, which may quote what it was given) with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, MASK)
    return text


def _url_secrets(url: str) -> List[str]:
    """The passwords ``url`` holds, as typed and as decoded (to scrub them from a driver's message)."""
    head, _, rest = url.partition("://")
    userinfo, _, tail = _url_split(head, rest)
    found = []
    if userinfo is not None:
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
        elif not _lone_user_named(head):
            found.append(userinfo)
    found += [match[0][len(match[1]):] for match in QUERY_SECRET.finditer(tail)]
    return sorted({form for secret in found for form in (secret, unquote(secret)) if form}, key=len, reverse=True)
