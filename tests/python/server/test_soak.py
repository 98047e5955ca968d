"""A short soak (the CI version of tools/soak.py's 10-minute run): 64 streams for 20 seconds
against models/tiny (chat and completions, structured output, hang-ups, non-streaming), then
SIGTERM: no request fails, the server exits 0, and its RSS stays within 5% of the RSS after the
warm-up."""
import json
import subprocess
import sys

from conftest import HERE, TINY_MODEL


def test_short_soak(moet_bin, tmp_path):
    out = tmp_path / "soak.json"
    p = subprocess.run([sys.executable, str(HERE.parents[2] / "tools" / "soak.py"), "--moet", moet_bin,
                        "--model", str(TINY_MODEL), "--streams", "64", "--seconds", "20", "--sample-seconds", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    summary = json.loads(out.read_text())
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["requests"] > 64 and summary["structured"] > 0 and summary["hangups"] > 0
    assert summary["server_exit_code"] == 0
    assert summary["rss_growth_pct"] <= 5, summary
    assert p.returncode == 0, p.stdout + p.stderr
