"""The KV pool at startup: the log names its size in tokens and bytes per token with the cache
dtype (bf16 by default), /metrics exports both, and a --max-model-len the pool cannot hold one
sequence of is refused before the server listens, with the numbers."""
import subprocess

from conftest import sample_value


def test_startup_logs_and_exports_the_kv_pool(server):
    log = server.log_text()
    assert "KV cache size:" in log and "bytes per token (bf16)" in log, log
    metrics = server.metrics()
    tokens = sample_value(metrics, "moet:kv_cache_tokens")
    per_token = sample_value(metrics, "moet:kv_cache_bytes_per_token")
    assert tokens >= 256 and tokens % 8 == 0
    # deepseek_v3 fixture: 3 layers of a 32 + 16 latent in bf16 = 96 bytes each
    assert per_token == 3 * 96
    assert f"KV cache size: {int(tokens)} tokens" in log


def test_a_max_model_len_the_pool_cannot_hold_is_refused(moet_bin, model_dir):
    result = subprocess.run([moet_bin, "serve", str(model_dir), "--port", "1", "--max-model-len", "256",
                             "--kv-cache-memory-bytes", str(288 * 100), "--kv-cache-dtype", "bf16"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = [l for l in result.stderr.splitlines() if l.startswith("moet: error:")]
    assert len(lines) == 1, result.stderr
    assert "max_model_len 256 needs 16 KV blocks of 16 tokens" in lines[0]
    assert "holds 6 blocks (96 tokens)" in lines[0]
