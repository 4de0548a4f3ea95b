"""docs/keys.md: the key table of a TRL config file (``autofit.memory_model._key_table``) and of an accelerate config
file (``autofit.launch._accelerate_keys``), generated with ``python -m autofit.launch._keys_page > docs/keys.md``."""

from __future__ import annotations

from autofit.launch._accelerate_keys import markdown_sections
from autofit.memory_model import key_table_markdown


def page() -> str:
    return key_table_markdown() + "\n".join(markdown_sections()) + "\n"


if __name__ == "__main__":
    print(page(), end="")
