"""Values that reach a comment, a message or a log line: kept to one line, and cut at a word's end."""

from __future__ import annotations

import re

# Control characters (C0, DEL, C1), line and paragraph separators, the bidirectional overrides and isolates (a name
# with U+202E shows its text reversed: a line that reads as another), and lone surrogates (no terminal can print one).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def one_line(text: object) -> str:
    """``text`` with control characters (newlines among them), bidirectional overrides and lone surrogates escaped: it
    cannot start a line of its own, nor show as other text."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode(), str(text))


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word's end, with "..." where it was cut: a message quotes
    an error without ending mid-word ("(phase forward_back")."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "..."
