"""Trainer factories that misbehave, for the probe runner's tests (module level: probes import them by name)."""

import os
import signal
import time


def raises_runtime_error(candidate):
    raise RuntimeError("boom: a bug in the user's factory")


def killed_by_host(candidate):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(candidate):
    time.sleep(600)


def rejects_config(candidate):
    raise ValueError("generation_batch_size (2) must be divisible by num_generations (3).")


def ignores_candidate(candidate):
    from autofit.probe.algos.sft import build_trainer

    return build_trainer(candidate.replace(micro_batch=candidate.micro_batch + 1))


def disk_full(candidate):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device", "/tmp/autofit-cache/model.safetensors")


def returns_none(candidate):
    return None


def own_lora_short_rows(candidate):
    """A user's SFT trainer: its own LoRA (r=8 on q and v) and its own dataset, whose rows are 8 tokens long."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from autofit import probe_kit

    rows = [[(5 * i + j) % 300 + 1 for j in range(8)] for i in range(64)]
    return SFTTrainer(
        model=probe_kit.model_path(candidate),
        args=SFTConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"input_ids": rows}),
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )


def own_grpo_settings(candidate):
    """A user's GRPO trainer: 4 generations per prompt and 24-token prompts of its own."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from autofit import probe_kit
    from autofit.probe.algos.rl import length_reward

    prompts = [" ".join(f"t{(3 * i + j) % 300 + 1}" for j in range(24)) for i in range(64)]
    return GRPOTrainer(
        model=probe_kit.model_path(candidate),
        reward_funcs=length_reward,
        args=GRPOConfig(**candidate.training_args(), num_generations=4),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=probe_kit.load_tokenizer(candidate, padding_side="left"),
    )


def aborts(candidate):
    os.abort()


def exhausts_host_memory(candidate):
    """Host memory runs out in the probe (an address-space limit stands in for a full machine)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2**33, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return bytearray(2**34)


def _out_dir(candidate):
    from pathlib import Path

    return Path(candidate.probe.output_dir).parents[2]  # OUT/probes/<probe>/trainer


def hangs_once(candidate):
    """Hangs in the first probe of a search folder (until killed), builds the SFT trainer afterwards."""
    from autofit.probe.algos.sft import build_trainer

    marker = _out_dir(candidate) / "hung-once"
    if not marker.exists():
        marker.write_text("")
        time.sleep(600)
    return build_trainer(candidate)


def another_process_grows_once(candidate):
    """The simulated device's other process takes all of it for 2 s during the first probe's training."""
    from autofit.probe.algos.sft import build_trainer

    marker = _out_dir(candidate) / "grew-once"
    trainer = build_trainer(candidate)
    if not marker.exists():
        marker.touch()
        with open(os.environ["AUTOFIT_SIMULATED_OTHERS_FILE"], "w") as handle:
            handle.write(f"{10 * 2**30} {time.time() + 2}")
    return trainer


def checks_its_weights(candidate):
    """The built-in GRPO trainer, refused unless every weight matrix of the policy it loaded has random values
    (the probe's weightless checkpoint filled on load) and generation produces finite logits."""
    import torch

    from autofit.probe.algos.rl import build_grpo_trainer

    trainer = build_grpo_trainer(candidate)
    for name, param in trainer.model.named_parameters():
        if param.ndim == 2 and not 0.01 < float(param.detach().float().std()) < 0.03:
            raise ValueError(f"{name} was not filled: std {float(param.detach().float().std())}")
    with torch.no_grad():
        logits = trainer.model(torch.tensor([[5, 6, 7]], device=trainer.model.device)).logits
    if not bool(torch.isfinite(logits).all()) or float(logits.float().std()) == 0:
        raise ValueError("the loaded model computes no logits")
    return trainer


def sleeps_then_fails(candidate):
    """Takes 1.5 s to build (the probe sits in its "load" phase), then fails as a user's bug would."""
    time.sleep(1.5)
    raise RuntimeError("slept, then failed")


RANK_ONE_BALLAST_MIB = 16


def rank_one_holds_more(candidate):
    """The built-in SFT trainer; rank 1 also holds 16 MiB for the whole probe (a rank with more to carry)."""
    import torch

    from autofit.probe.algos.sft import build_trainer

    trainer = build_trainer(candidate)
    if os.environ.get("RANK") == "1":
        trainer.autofit_ballast = torch.zeros(RANK_ONE_BALLAST_MIB * 2**20 // 4)
    return trainer


def rank_one_hangs(candidate):
    from autofit.probe.algos.sft import build_trainer

    if os.environ.get("RANK") == "1":
        time.sleep(600)
    return build_trainer(candidate)


def exits_quietly(candidate):
    os._exit(0)  # the factory ends the probe process itself: no result, no exception


def stops_itself(candidate):
    """Freezes its own probe (SIGSTOP), as a user's Ctrl-Z on the wrong process or a debugger would."""
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)


def names_its_devices(candidate):
    """Fails at once, naming torch's threads and the devices the probe was given (``CUDA_VISIBLE_DEVICES``), both set
    by probes side by side."""
    import torch

    raise RuntimeError(f"threads {torch.get_num_threads()} devices {os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}")
