"""/metrics carries vLLM's own ``vllm:*`` series per engine, process metrics and the ``mia_*`` series."""

from __future__ import annotations

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

VLLM_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
               "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:generation_tokens",
               "vllm:prompt_tokens", "vllm:request_success")


def test_the_scrape_parses_and_has_vllms_series_per_engine(tiny_server, openai_client) -> None:
    answer = openai_client.chat.completions.create(model="manager", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
    assert answer.choices[0].message.content is not None
    response = httpx.get(f"{tiny_server.base_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    for name in VLLM_SERIES:
        assert name in families, f"{name} missing from /metrics"
        labels = [sample.labels for sample in families[name].samples]
        assert {"model_name": "tiny", "engine": "0"}.items() <= labels[0].items(), labels
    generated = [s.value for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert generated and generated[0] >= 1
    ttft = [s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft and ttft[0].value >= 1
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "process_cpu_seconds" in families
    assert "mia_requests" in families and "mia_role_requests" in families
