"""The algorithms autofit probes and estimates, one registry entry each: the only place their names are spelled
outside their factories (``autofit.probe.algos``).

An algorithm is one unit, like a rung: its entry says which TRL config class and command it is, which field holds
the searched length, whether it is online RL and generates, what of the trainer's features its config supports
(activation offloading, Liger, ``model_init_kwargs``, DeepSpeed's optimizer offload), which models it holds and the
phases of its step in the memory model's ledger. The options, the candidate, the spec, the memory model, the search,
the export and the CLI read these fields, never the name. Torch-free: the search's process reads it.

A name the registry does not know (a user's factory run under ``--algo mine``) gets ``GENERIC``: a causal LM
trained on sequences of ``max_length`` tokens, with none of the optional features.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

# The phases of a step in the memory model's ledger (``autofit.memory_model._ledger``).
TRAIN_PHASES = ("train", "backward", "step")
GENERATING_PHASES = TRAIN_PHASES + ("generation",)
ROLLOUT_PHASES = ("generation", "scoring") + TRAIN_PHASES  # PPO: the rollout's generation and its no-grad passes
PRECOMPUTE = "precompute"  # the reference's log-probs over the data set, before training (precompute_ref_log_probs)


@dataclass(frozen=True)
class Algorithm:
    """One TRL algorithm as autofit runs it."""

    name: str
    description: str  # a few words for help texts
    factory: str = ""  # "module:function" of the built-in trainer factory (``autofit.probe.algos``)
    config_class: str = ""  # "module:Class" of the TRL config dataclass
    trl_command: Optional[str] = None  # `trl <command> --config FILE` (and ``trl.scripts.<command>``); None: none
    length_field: str = "max_length"  # the config field that holds the searched length
    rl: bool = False  # online RL: the length searched is the completion's, after a synthetic prompt
    generates: bool = False  # the trainer generates completions itself (a generation phase)
    groups: bool = False  # samples ``num_generations`` completions per prompt, from reward functions
    sequence_classifier: bool = False  # trains a sequence-classification head (no LM head; peft's SEQ_CLS)
    sequences_per_example: int = 1  # a reward model's chosen and rejected sides: 2
    default_beta: Optional[float] = None  # TRL's default KL coefficient ``beta``; None: no ``beta`` field
    kl_field: Optional[str] = None  # where the KL coefficient is set when it is not ``beta``
    # The trainer's features its config supports (what the rungs ask):
    activation_offloading: bool = False  # an ``activation_offloading`` field
    liger: bool = False  # ``use_liger_kernel`` patches the model it trains
    model_init_kwargs: bool = False  # ``model_init_kwargs`` (the dtype the weights are loaded in)
    load_dtype: str = "float32"  # the weights' dtype unless told (TRL's); "auto": the checkpoint's (from_pretrained)
    engine_offload: bool = False  # runs under accelerate's DeepSpeed config (ZeRO-2 optimizer offload)
    precompute_ref: bool = False  # ``precompute_ref_log_probs``: the reference's log-probs before training, no model
    counts_episodes: bool = False  # ``total_episodes`` instead of ``max_steps``; its sample generations evaluate
    trl_versions: Optional[Tuple[str, str]] = None  # the TRL versions that have it, [from, to); None: every one
    # the models it holds: the reference, where its KL coefficient is > 0, without LoRA (the policy with its adapter off
    # is the reference then) and unless its log-probs are precomputed
    models: Tuple[str, ...] = ("policy",)
    critic: str = ""  # the unit of its value and reward models (sequence classifiers beside the policy), if any
    phases: Tuple[str, ...] = TRAIN_PHASES  # the ledger's phases of one step (and of a precompute pass before)
    estimated: bool = True  # the memory model has its ledger (``autofit estimate``)
    checked_as: str = ""  # the algorithm whose measurements check this one's activation terms ("": its own)
    usage: str = ""  # best.yaml's "# use:" line where there is no trl command

    @property
    def has_beta(self) -> bool:
        return self.default_beta is not None

    @property
    def checked_name(self) -> str:
        return self.checked_as or self.name

    def available(self) -> Optional[str]:
        """Why the installed TRL cannot run it (one line), or None."""
        if self.trl_versions is None:
            return None
        low, high = self.trl_versions
        installed = installed_trl()
        from packaging.version import InvalidVersion, Version

        try:
            if Version(low) <= Version(installed) < Version(high):
                return None
        except InvalidVersion:
            pass
        return (f"algo '{self.name}' needs TRL {low}-{_before(high)} (installed trl {installed}; TRL {high} removed "
                f"{self.config_class.rsplit(':', 1)[-1].replace('Config', 'Trainer')}): overlay it with pip install "
                f"--no-deps --target ./trl{_compact(_before(high))} trl=={_before(high)}.0 and run with "
                f"PYTHONPATH=./trl{_compact(_before(high))}")


def _before(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{int(minor) - 1}"


def _compact(version: str) -> str:
    return version.replace(".", "")


def installed_trl() -> str:
    from importlib import metadata

    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return "none"


SFT = Algorithm(
    "sft", "supervised fine-tuning", factory="autofit.probe.algos.sft:build_trainer", config_class="trl:SFTConfig",
    trl_command="sft", activation_offloading=True, liger=True, model_init_kwargs=True, engine_offload=True)
GRPO = Algorithm(
    "grpo", "group relative policy optimization", factory="autofit.probe.algos.rl:build_grpo_trainer",
    config_class="trl:GRPOConfig", trl_command="grpo", length_field="max_completion_length", rl=True, generates=True,
    groups=True, default_beta=0.0, liger=True, model_init_kwargs=True, engine_offload=True,
    models=("policy", "reference"), phases=GENERATING_PHASES)
RLOO = replace(GRPO, name="rloo", description="REINFORCE leave-one-out",
               factory="autofit.probe.algos.rl:build_rloo_trainer", config_class="trl:RLOOConfig", trl_command="rloo",
               default_beta=0.05)
REWARD = Algorithm(
    "reward", "reward model training", factory="autofit.probe.algos.reward:build_trainer",
    config_class="trl:RewardConfig", trl_command="reward", sequence_classifier=True, sequences_per_example=2,
    activation_offloading=True, liger=True, model_init_kwargs=True, engine_offload=True, models=("reward",))
PPO = Algorithm(
    "ppo", "proximal policy optimization", factory="autofit.probe.algos.ppo:build_trainer",
    config_class="trl.experimental.ppo:PPOConfig", length_field="response_length", rl=True, generates=True,
    kl_field="kl_coef", counts_episodes=True, trl_versions=("0.29", "1.13"), load_dtype="auto",
    models=("policy", "value", "reference", "reward"), critic="ppo-critic", phases=ROLLOUT_PHASES, checked_as="grpo",
    usage=("# TRL has no ppo command: build PPOConfig(**best.json['config']); PPO's loop does not enable "
           "checkpointing from its config, so call model.gradient_checkpointing_enable() when it is set"))

# Preference trainers: the reference model's forward (no gradients) and the policy's in each step, over rows of
# prompt + completion; DPO concatenates the chosen and rejected sides into one forward of twice the micro-batch, KTO's
# mismatched KL completions run without gradients before the policy's forward (transient: below its saved activations).
DPO = Algorithm(
    "dpo", "direct preference optimization", factory="autofit.probe.algos.preference:build_dpo_trainer",
    config_class="trl:DPOConfig", trl_command="dpo", sequences_per_example=2, default_beta=0.1,
    activation_offloading=True, liger=True, model_init_kwargs=True, engine_offload=True, precompute_ref=True,
    models=("policy", "reference"), phases=TRAIN_PHASES + (PRECOMPUTE,))
KTO = replace(DPO, name="kto", description="Kahneman-Tversky optimization",
              factory="autofit.probe.algos.preference:build_kto_trainer", config_class="trl:KTOConfig",
              trl_command="kto", sequences_per_example=1)

ALGORITHMS: Dict[str, Algorithm] = {a.name: a for a in (SFT, GRPO, RLOO, REWARD, DPO, KTO, PPO)}
# Units that are part of an algorithm, not one the user picks: PPO's value and reward models (sequence classifiers on
# the policy's backbone, loaded by from_pretrained in the checkpoint's dtype, scoring prompt + response).
PARTS: Dict[str, Algorithm] = {
    PPO.critic: Algorithm(PPO.critic, "PPO's value and reward models", rl=True, sequence_classifier=True,
                          load_dtype="auto", checked_as=PPO.checked_as),
}
DEFAULT_ALGO = SFT.name
GENERIC = Algorithm("", "a trainer of your own")


def algorithm(name: str) -> Algorithm:
    """The registry's entry for ``name``; a name it does not know: ``GENERIC`` under that name."""
    found = ALGORITHMS.get(name) or PARTS.get(name)
    return found if found is not None else replace(GENERIC, name=name)


def algorithm_names(**wanted: bool) -> Tuple[str, ...]:
    """The registered names, in order, whose fields (or properties) have the values given: ``rl=True``."""
    return tuple(a.name for a in ALGORITHMS.values() if all(getattr(a, k) == v for k, v in wanted.items()))


def or_list(names: Tuple[str, ...], word: str = "or") -> str:
    """"a, b, c or d"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


def ppo_available() -> bool:
    """PPOTrainer lives in trl.experimental.ppo from TRL 0.29 to 1.12; TRL 1.13 removed it."""
    return PPO.available() is None
