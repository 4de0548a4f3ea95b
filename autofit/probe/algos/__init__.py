"""Built-in trainer factories, one per TRL algorithm; the CLI's ``--algo`` picks one (``autofit.core.ALGORITHMS``
names them). Public: read them as examples of a factory, or pass one by name
(``autofit.probe.algos.sft:build_trainer``).
"""
