"""--cuda-unverified (MOET_CUDA_UNVERIFIED) lets every gated CUDA path past its gate, for the
verification runs on a GPU machine: without it each of these flag sets on --device cuda fails with
"not yet verified on a GPU"; with it the same command gets past the gate (here, without a GPU, it
then fails opening the device, with another message)."""
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "tiny"
GATED = [
    ["--tensor-parallel-size", 2],
]


@pytest.mark.parametrize("flags", GATED, ids=lambda flags: str(flags[0]).lstrip("-"))
def test_each_gate_refuses_by_default_and_yields_to_the_flag(run_moet, flags):
    command = ["--log-level", "error", "generate", "--model", TINY, "--prompt-ids", "1,2,3", "--max-tokens", 2,
               "--device", "cuda", *flags]
    gated = run_moet(*command)
    assert gated.returncode != 0 and "not yet verified on a GPU" in gated.stderr, gated.stderr
    allowed = run_moet(*command, "--cuda-unverified")
    assert "not yet verified on a GPU" not in allowed.stderr, allowed.stderr


def test_the_environment_variable_does_the_same(run_moet, monkeypatch):
    monkeypatch.setenv("MOET_CUDA_UNVERIFIED", "1")
    result = run_moet("--log-level", "error", "generate", "--model", TINY, "--prompt-ids", "1,2,3", "--max-tokens", 2,
                      "--device", "cuda", "--tensor-parallel-size", 2)
    assert "not yet verified on a GPU" not in result.stderr, result.stderr


def test_help_explains_the_flag(run_moet):
    assert "--cuda-unverified" in run_moet("generate", "--help").stdout
