"""`moet generate --prompts-file`: many prompts on one loaded model print, line by line, exactly
what one `moet generate --prompt P --json` run per prompt prints; prompts are split the way the
quality harness splits them (Python `read_text().split("\\n\\n")`, whitespace-only pieces dropped)."""
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "tiny"
SPEED = ("prefill_tokens_per_s", "decode_tokens_per_s")


def harness_split(path):
    return [p for p in pathlib.Path(path).read_text().split("\n\n") if p.strip()]


def without_speed(record):
    return {k: v for k, v in record.items() if k not in SPEED}


def batch(run_moet, path, *extra):
    r = run_moet("generate", "--model", TINY, "--prompts-file", path, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def single(run_moet, prompt, *extra):
    r = run_moet("generate", "--model", TINY, "--prompt", prompt, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_quality_prompts_match_one_run_per_prompt(run_moet):
    path = REPO / "tests" / "fixtures" / "quality_prompts.txt"
    prompts = harness_split(path)[:7]  # includes prompts that start with "\n" (three newlines in the file)
    assert any(p.startswith("\n") for p in prompts)
    got = batch(run_moet, path, "--max-prompts", 7, "--max-tokens", 10, "--experts", "native")
    assert len(got) == 7
    for prompt, record in zip(prompts, got):
        expected = single(run_moet, prompt, "--max-tokens", 10, "--experts", "native")
        assert without_speed(record) == without_speed(expected)
        assert all(record[k] > 0 for k in SPEED)


def test_splitting_crlf_and_blank_pieces(run_moet, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"first line\r\nsecond line\r\n\r\n  \n\n\nThe history of\r\rimport os\n\n\n\n\n \t\n")
    prompts = harness_split(path)
    assert prompts == ["first line\nsecond line", "\nThe history of", "import os"]
    got = batch(run_moet, path, "--max-tokens", 4)  # default W2 experts
    assert len(got) == len(prompts) == 3
    for prompt, record in zip(prompts, got):
        assert without_speed(record) == without_speed(single(run_moet, prompt, "--max-tokens", 4))


def test_sampling_restarts_from_the_seed_for_every_prompt(run_moet, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Water \\Wa\"ter\\, n.\n\nWater \\Wa\"ter\\, n.")  # the same prompt twice
    args = ("--max-tokens", 12, "--temperature", 1.0, "--seed", 5)
    got = batch(run_moet, path, *args)
    assert got[0]["output_ids"] == got[1]["output_ids"]
    assert without_speed(got[0]) == without_speed(single(run_moet, 'Water \\Wa"ter\\, n.', *args))


def test_bad_uses(run_moet, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n\n")
    r = run_moet("generate", "--model", TINY, "--prompts-file", empty)
    assert r.returncode == 1 and "no prompts" in r.stderr
    r = run_moet("generate", "--model", TINY, "--prompts-file", empty, "--prompt", "x")
    assert r.returncode == 1 and "exactly one of" in r.stderr
    r = run_moet("generate", "--model", TINY, "--prompt", "x", "--max-prompts", 2)
    assert r.returncode == 1 and "--max-prompts needs --prompts-file" in r.stderr
    r = run_moet("generate", "--model", TINY, "--prompts-file", tmp_path / "missing.txt")
    assert r.returncode == 1 and "cannot open" in r.stderr
