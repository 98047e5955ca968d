"""`--tensor-parallel-size` / `--enable-expert-parallel` end to end (docs/parallel.md): the model split
over ranks (threads of the process on the CPU) generates the golden greedy tokens of the whole
model, and impossible or unsupported splits fail with one `moet: error:` line naming the flag."""
import json
import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"


def generate(run_moet, name, *extra):
    g = json.loads((FIXTURES / name / "golden.json").read_text())
    experts = [] if "--experts" in extra else ["--experts", "native"]
    result = run_moet("generate", "--model", FIXTURES / name, "--prompt-ids", ",".join(map(str, g["prompt_ids"])),
                      "--max-tokens", len(g["greedy_ids"]), "--json", "--kv-cache-dtype", "fp32", *experts, *extra)
    return g, result


@pytest.mark.parametrize("name,split", [("deepseek_v3", ["--tensor-parallel-size", 2]),
                                        ("qwen3_moe", ["--tensor-parallel-size", 4]),
                                        ("glm4_moe", ["--tensor-parallel-size", 2, "--enable-expert-parallel"])])
def test_split_model_generates_the_golden_tokens(run_moet, name, split):
    g, result = generate(run_moet, name, "--threads", 2, *split)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["output_ids"] == g["greedy_ids"]


def error_line(result):
    assert result.returncode != 0
    lines = [l for l in result.stderr.splitlines() if l.startswith("moet: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("name,flags,message", [
    ("qwen3_moe", ["--tensor-parallel-size", 3], "--tensor-parallel-size 3: the 4 attention heads and 2 KV heads "
                                                 "cannot be split"),
    ("glm_moe_dsa", ["--tensor-parallel-size", 8], "--tensor-parallel-size 8 exceeds the 4 routed experts"),
    ("mixtral", ["--enable-expert-parallel"], "--enable-expert-parallel partitions the experts over the "
                                              "--tensor-parallel-size ranks"),
    ("mixtral", ["--tensor-parallel-size", 2, "--expert-cache-gb", 1, "--experts", "w2"],
     "--tensor-parallel-size 2: the expert cache (--expert-cache-gb)"),
    ("mixtral", ["--tensor-parallel-size", 2, "--nnodes", 2], "--nnodes 2 needs --device cuda"),
    ("mixtral", ["--tensor-parallel-size", 2, "--nnodes", 4], "--tensor-parallel-size 2 is not a multiple of "
                                                              "--nnodes 4"),
    ("mixtral", ["--tensor-parallel-size", 2, "--device", "cuda"],
     "--tensor-parallel-size / --enable-expert-parallel / --nnodes on --device cuda is not yet verified on a GPU"),
])
def test_impossible_splits_are_one_line_errors(run_moet, name, flags, message):
    _, result = generate(run_moet, name, *flags)
    assert message in error_line(result)
