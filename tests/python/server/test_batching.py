"""Continuous batching is invisible and prefix caching is visible: greedy outputs of 16 concurrent
requests equal the same requests sent one by one; a repeated long prompt is served from the prefix
cache (hits in /metrics, cached_tokens in usage) with a lower time to first token."""
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import MODEL_NAME, sample_value

PROMPTS = [f"Request number {i}: the quick brown fox {'jumps ' * (i % 5)}over dog {i * 7}" for i in range(16)]


def complete(client, prompt, max_tokens=12, **kw):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body={"ignore_eos": True}, **kw)


def test_16_concurrent_equal_one_by_one(client):
    sequential = [complete(client, p).choices[0].text for p in PROMPTS]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda p: complete(client, p).choices[0].text, PROMPTS))
    assert concurrent == sequential
    with ThreadPoolExecutor(16) as pool:  # and streamed, mixed with the non-streamed ones
        streamed = list(pool.map(
            lambda p: "".join(c.choices[0].text for c in complete(client, p, stream=True)), PROMPTS))
    assert streamed == sequential


def ttft(client, prompt):
    start = time.perf_counter()
    stream = complete(client, prompt, max_tokens=2, stream=True, stream_options={"include_usage": True})
    first = None
    usage = None
    for chunk in stream:
        if first is None and chunk.choices:
            first = time.perf_counter() - start
        usage = chunk.usage or usage
    return first, usage.prompt_tokens_details.cached_tokens


def test_prefix_cache_hits_and_lower_ttft(server, client):
    before = server.metrics()
    long_prompts = [f"{i} " + "The quick brown fox jumps over the lazy dog. " * 18 for i in range(3)]
    cold, warm = [], []
    for prompt in long_prompts:
        t, cached = ttft(client, prompt)
        cold.append(t)
        t2, cached2 = ttft(client, prompt)
        warm.append(t2)
        assert cached2 > cached and cached2 >= 150
    after = server.metrics()
    hits = sample_value(after, "moet:prefix_cache_hits_total") - sample_value(before, "moet:prefix_cache_hits_total")
    assert hits >= 3 * 150
    assert sample_value(after, "moet:prefix_cache_hit_rate") > 0
    assert statistics.median(warm) < statistics.median(cold), (cold, warm)
