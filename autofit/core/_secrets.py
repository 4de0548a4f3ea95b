"""Secrets in what a user typed: a queue URL's password (``redis://:PW@host``, ``postgresql://user:PW@host/db``, a
``?password=`` query parameter, a libpq DSN's ``password=``) is never shown, logged or written. ``masked`` is the
text as a message or a file may hold it; ``masked_argv`` a command line (the lock's, a message naming a holder)."""

from __future__ import annotations

import re
from typing import Iterable, List, Tuple
from urllib.parse import parse_qsl, unquote

MASK = "***"
# Query parameters (and libpq DSN keywords) that carry a secret: Redis' and libpq's password, tokens, keys of auth.
SECRET_NAME = re.compile(r"pass|pwd|secret|token|auth|credential", re.IGNORECASE)
# A lone name in a URL's userinfo is a user for a database, and may be the password for Redis (``redis://PW@host``
# is how some providers print it): masked there.
LONE_USERINFO_SECRET = ("redis", "rediss", "unix")
DSN_WORD = re.compile(r"(?P<name>\b[A-Za-z_]+)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'|\S+)")


def masked(text: str) -> str:
    """``text`` with every password it holds replaced by ``***``: a URL's userinfo password, its secret query
    parameters, and ``name=value`` words whose name says secret (a DSN). Text without a secret is returned as is."""
    if "://" in text:
        text = _masked_url(text)
    if "=" in text and "://" not in text:
        text = DSN_WORD.sub(lambda m: f"{m['name']}={MASK}" if SECRET_NAME.search(m["name"]) else m[0], text)
    return text


def masked_argv(argv: Iterable[str]) -> List[str]:
    """A command line as a file or a message may hold it: each word masked (``--worker-queue=redis://:PW@h`` too)."""
    return [masked(str(word)) for word in argv]


def _masked_url(text: str) -> str:
    head, sep, rest = text.partition("://")
    prefix = ""
    if "=" in head:  # --worker-queue=redis://...
        prefix, _, head = head.rpartition("=")
        prefix += "="
    scheme = head.split("+", 1)[0].lower()
    authority, tail = _split_authority(rest)
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        if ":" in userinfo:
            userinfo = f"{userinfo.split(':', 1)[0]}:{MASK}"
        elif scheme in LONE_USERINFO_SECRET:
            userinfo = MASK
        authority = f"{userinfo}@{host}"
    if "?" in tail:
        path, _, query = tail.partition("?")
        query, hash_mark, fragment = query.partition("#")
        tail = f"{path}?{_masked_query(query)}{hash_mark}{fragment}"
    return f"{prefix}{head}{sep}{authority}{tail}"


def url_parts(url: str) -> Tuple[str, str, str]:
    """A URL's scheme, its host part (userinfo included) and the rest (a path, a query), split as its password may
    hold any character: the host part ends at the first ``/``, ``?`` or ``#`` after its last ``@``."""
    head, _, rest = url.partition("://")
    return (head, *_split_authority(rest))


def _split_authority(rest: str) -> Tuple[str, str]:
    """The host part and what follows it (a path, a query): the host part ends at the first ``/``, ``?`` or ``#``
    after the last ``@`` (a password may hold any of them)."""
    start = rest.rfind("@") + 1
    for index in range(start, len(rest)):
        if rest[index] in "/?#":
            return rest[:index], rest[index:]
    return rest, ""


def _masked_query(query: str) -> str:
    words = []
    for word in query.split("&"):
        name, equals, _ = word.partition("=")
        words.append(f"{name}={MASK}" if equals and SECRET_NAME.search(unquote(name)) else word)
    return "&".join(words)


def scrubbed(text: str, secrets: Iterable[str]) -> str:
    """``text`` (a driver's error, which may quote what it was given) with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> List[str]:
    """The passwords ``url`` holds, as typed and as decoded (to scrub them from a driver's message)."""
    head, _, rest = url.partition("://")
    authority, tail = _split_authority(rest)
    found = []
    if "@" in authority:
        userinfo = authority.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
        elif head.split("+", 1)[0].lower() in LONE_USERINFO_SECRET:
            found.append(userinfo)
    query = tail.partition("?")[2].partition("#")[0]
    found += [value for name, value in parse_qsl(query, keep_blank_values=True) if SECRET_NAME.search(name)]
    return sorted({form for secret in found for form in (secret, unquote(secret)) if form}, key=len, reverse=True)
