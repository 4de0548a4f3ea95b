"""Any factory a Python user can write reaches the probes: a script's function using names its main block defines,
a script fed on stdin, ``python -c``, a closure and a lambda, a notebook cell. Real searches on the tiny model."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

# The user's code: a factory on their own (here synthetic) dataset, using ``ROW_LENGTH`` and ``rows`` that the
# script defines only under ``if __name__ == "__main__":`` (or in a notebook cell). Searched without the memory model
# (``predict=False``): each way is a fresh process, which would otherwise measure this machine's rates for the speed
# model first (about 12 s of CPU each); where the factory comes from is the question, and the model's own tests are
# the lambda's and the factories' below.
FACTORY = textwrap.dedent("""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    import autofit
    from autofit import probe_kit

    def make_trainer(candidate):
        return SFTTrainer(
            model=probe_kit.model_path(candidate),
            args=SFTConfig(**candidate.training_args()),
            train_dataset=Dataset.from_dict({"input_ids": rows[: probe_kit.probe_rows(candidate)]}),
            processing_class=probe_kit.load_tokenizer(candidate),
            peft_config=candidate.peft_config(),
        )
""")
MAIN = textwrap.dedent("""
    ROW_LENGTH = 16
    rows = [[(7 * i + j) % 400 + 1 for j in range(ROW_LENGTH)] for i in range(64)]
    result = autofit.fit(make_trainer, model="tiny-qwen2", device="cpu", gpu_memory="2GiB", max_length=ROW_LENGTH,
                         effective_batch=2, verify_steps=3, predict=False, out_dir=OUT, quiet=True)
    print("RESULT " + json.dumps({"rungs": list(result.candidate.rungs), "fits": result.report.fits,
                                  "peak": result.report.verified.peak_bytes}))
""")


def as_script(out) -> str:
    body = "import json\n" + FACTORY + f"\nOUT = {str(out)!r}\n" + "if __name__ == '__main__':\n" + textwrap.indent(
        MAIN, "    ")
    return body


def test_a_script_stdin_and_python_dash_c(tmp_path):
    # three ways of running the same user code, at once (each is a fresh Python with its own probes)
    (tmp_path / "train.py").write_text(as_script(tmp_path / "script"))
    ways = {
        "script": ([sys.executable, "train.py"], None),  # its main block defines ROW_LENGTH and rows
        "stdin": ([sys.executable, "-"], as_script(tmp_path / "stdin")),
        "dash-c": ([sys.executable, "-c", as_script(tmp_path / "dash-c")], None),
    }
    running = {name: subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=str(tmp_path)) for name, (args, _) in ways.items()}
    for name, process in running.items():
        out, err = process.communicate(ways[name][1], timeout=600)
        line = next((printed for printed in out.splitlines() if printed.startswith("RESULT ")), None)
        assert line is not None, f"{name}: exit {process.returncode}\n{err[-3000:]}"
        found = json.loads(line[len("RESULT "):])
        assert found["fits"] and found["peak"] > 0, name
        assert "Traceback" not in err, name  # no probe died in multiprocessing's bootstrap (stdin had)


def test_a_lambda_calling_a_closure(tmp_path):
    import autofit
    from autofit.probe.algos.sft import build_trainer

    seen_rows = []

    def closure(candidate):  # closes over a local of the test
        seen_rows.append(candidate.max_length)  # (in the probe's copy: the test's list stays empty)
        return build_trainer(candidate)

    result = autofit.fit(lambda candidate: closure(candidate), model="tiny-qwen2", device="cpu", gpu_memory="2GiB",
                         max_length=16, effective_batch=2, verify_steps=3, out_dir=tmp_path, quiet=True)
    assert result.report.fits
    assert seen_rows == []


def test_a_notebook_cell(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    out = tmp_path / "out"
    cells = [FACTORY, f"import json\nOUT = {str(out)!r}\n" + MAIN]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.get("output_type") == "stream")
    line = next(printed for printed in outputs.splitlines() if printed.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):])["fits"]
    best = json.loads((out / "best.json").read_text())
    assert best["fits"] and best["config"]["max_length"] == 16


def test_the_trainer_that_was_built_is_the_one_exported(tmp_path):
    from trl import ModelConfig, SFTConfig, TrlParser, get_peft_config

    import autofit

    result = autofit.fit("probe_factories:own_lora_short_rows", model="tiny-qwen2", device="cpu", gpu_memory="2GiB",
                         max_length=32, effective_batch=2, verify_steps=3, out_dir=tmp_path, quiet=True)
    best = json.loads(result.best_json.read_text())
    assert best["peft"] == {"type": "lora", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
                            "target_modules": ["q_proj", "v_proj"]}
    assert best["model_args"]["use_peft"] is True and best["model_args"]["lora_r"] == 8
    assert any("its own LoRA" in note for note in best["notes"])
    assert any("longest row" in note and "8 tokens" in note for note in best["notes"])
    config, model_config = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(result.best_yaml), "--output_dir", str(tmp_path / "run")])
    peft = get_peft_config(model_config)
    assert peft.r == 8 and set(peft.target_modules) == {"q_proj", "v_proj"}
    # once a probe has shown what runs, the model predicts LoRA r=8 at 8 tokens, not a full fine-tune at 32 tokens
    # (the first probe's prediction was made before, for the candidate as given)
    first, verify = best["candidates"][0], best["candidates"][-1]
    assert verify["kind"] == "verify" and first["prior_predicted_bytes"] > 2 * first["peak_bytes"]
    assert abs(verify["prior_predicted_bytes"] - verify["peak_bytes"]) / verify["peak_bytes"] < 0.25


def test_a_grpo_factory_with_its_own_generations_and_prompts(tmp_path):
    import autofit

    result = autofit.fit("probe_factories:own_grpo_settings", model="tiny-qwen2", algo="grpo", device="cpu",
                         gpu_memory="2GiB", max_completion_length=16, effective_batch=8, verify_steps=3,
                         out_dir=tmp_path, quiet=True)
    best = json.loads(result.best_json.read_text())
    assert best["config"]["num_generations"] == 4
    verified = result.report.verified
    assert verified.observed["longest_row"] == 24
    # tokens per step counted with the 24-token prompts measured, not the 128-token default
    steps_per_second = verified.tokens_per_second / (8 * (128 + 16))
    assert abs(steps_per_second * 8 * (24 + 16) - verified.tokens_per_second) > 0.5 * verified.tokens_per_second


BROKEN = textwrap.dedent("""
    from trl import SFTConfig, SFTTrainer
    from autofit import probe_kit

    def make_trainer(candidate):
        tokenizer = probe_kit.load_tokenizer(candidate)
        return SFTTrainer(model=probe_kit.model_path(candidate), args=SFTConfig(**candidate.training_args()),
                          processing_class=tokenizr)
""")


@pytest.mark.parametrize("filename", ["<dynamic-code>", "train.py"])
def test_a_bug_in_the_factory_stops_at_the_first_probe_with_the_users_line(tmp_path, filename):
    # A NameError in the user's own code (misspelt `tokenizr`), whether the factory came from a file or from code
    # without one (a notebook, exec, a pickled factory): one probe, and the message shows the user's line.
    import autofit

    namespace: dict = {}
    exec(compile(BROKEN, str(tmp_path / filename) if filename.endswith(".py") else filename, "exec"), namespace)
    with pytest.raises(autofit.FactoryError) as info:
        autofit.fit(namespace["make_trainer"], model="tiny-qwen2", device="cpu", gpu_memory="1GiB", max_length=16,
                    effective_batch=2, out_dir=tmp_path / "out", quiet=True)
    message = str(info.value)
    assert "NameError: name 'tokenizr' is not defined" in message
    shown = str(tmp_path / filename) if filename.endswith(".py") else filename
    assert f'File "{shown}", line 8, in make_trainer' in message  # the user's file, not "<dynamic-code>"
    assert len(list((tmp_path / "out").glob("probes/*/result.json"))) == 1  # one probe, not one per rung
