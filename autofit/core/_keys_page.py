"""docs/keys.md: the key table of a TRL config file (``autofit.core._key_table``) and of an accelerate config file
(``autofit.core._accelerate_keys``), generated with ``python -m autofit.core._keys_page > docs/keys.md``."""

from __future__ import annotations

from autofit.core._accelerate_keys import markdown_sections
from autofit.core._key_table import markdown


def page() -> str:
    return markdown() + "\n".join(markdown_sections()) + "\n"


if __name__ == "__main__":
    print(page(), end="")
