"""Built-in trainer factories, one per TRL algorithm; the CLI's ``--algo`` picks one."""

FACTORIES = {
    "sft": "autofit.algos.sft:build_trainer",
    "grpo": "autofit.algos.rl:build_grpo_trainer",
    "rloo": "autofit.algos.rl:build_rloo_trainer",
    "reward": "autofit.algos.reward:build_trainer",
}
