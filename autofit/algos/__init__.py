"""Built-in trainer factories, one per TRL algorithm; the CLI's ``--algo`` picks one."""

FACTORIES = {
    "sft": "autofit.algos.sft:build_trainer",
    "grpo": "autofit.algos.rl:build_grpo_trainer",
    "rloo": "autofit.algos.rl:build_rloo_trainer",
    "reward": "autofit.algos.reward:build_trainer",
    "ppo": "autofit.algos.ppo:build_trainer",  # TRL 0.29-1.12 only: see spec.ppo_available
}
