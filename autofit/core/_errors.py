"""The error every bad value raises: one line that names the value and what is accepted."""


class InputError(ValueError):
    pass
