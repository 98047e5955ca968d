"""`moet serve --tensor-parallel-size 2 --enable-expert-parallel`: the split model serves the same
greedy completions as the whole model (one HTTP front end; the ranks are threads), with an FP32 KV
cache on both so that no rounding of the cache can tell them apart."""
from conftest import Server


def test_split_server_answers_like_the_whole_model(moet_bin, model_dir, tmp_path):
    servers = [Server(moet_bin, model_dir, tmp_path / "whole.log", "--kv-cache-dtype", "fp32"),
               Server(moet_bin, model_dir, tmp_path / "split.log", "--kv-cache-dtype", "fp32",
                      "--tensor-parallel-size", 2, "--enable-expert-parallel")]
    try:
        assert "2 ranks: rank 0 on cpu" in servers[1].log_text()
        for prompt in ("hello world", "the quick brown fox"):
            texts = [s.client().completions.create(model="tiny-test", prompt=prompt, max_tokens=8,
                                                   temperature=0).choices[0].text for s in servers]
            assert texts[0] == texts[1], prompt
    finally:
        for s in servers:
            s.stop()
    assert all(s.proc.returncode == 0 for s in servers)
