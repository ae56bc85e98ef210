"""The running server under generated traffic: schemathesis over its published OpenAPI document, plus raw fuzz.

The server is `gate serve` (tiny model, prefix and response caches, tenants from X-Tenant) in its own
process on 127.0.0.1. The document is the one the server publishes at /openapi.json: request bodies from
the request contract (`request_json_schema`), responses and statuses from the response models and the
error catalogue. Schemathesis sends schema-conforming and schema-violating requests and checks every
answer against the document (statuses, content types, headers, bodies); raw fuzz sends arbitrary bodies
and content types. Every answer must be below 500, and every error body one of the catalogue's.
The small hand-written fuzz on the fake engine is tests/server/test_api.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from reliability_engine import MODEL_NAME, manifest_data, model_source
from reliability_server import ServerProcess, start_server
from schemathesis.checks import positive_data_acceptance as ACCEPTS_VALID
from schemathesis.generation.modes import GenerationMode

from servegate.contracts.errors import CATALOGUE

pytestmark = pytest.mark.reliability

FAST_EXAMPLES, SLOW_EXAMPLES = 12, 150
BODY_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/embeddings": "embeddings"}


@pytest.fixture(scope="module")
def served_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fuzzed deployment: tenants from X-Tenant, both caches on, logprobs offered, a 10 s deadline."""
    folder = tmp_path_factory.mktemp("fuzz-server")
    return manifest_data(
        model_source(folder),
        preprocess={
            "tenant_from": "header",
            "max_payload_bytes": 1_048_576,
        },  # generated bodies fit: 413 is not a 4xx schemathesis expects for invalid data
        runtime={"kv_cache": {"block_size": 8, "memory_budget": "2MiB", "prefix_caching": True}},
        postprocess={"response_cache": {"enabled": True}},
        failure_policy={"request_timeout_s": 10},
    )


@pytest.fixture(scope="module")
def server(served_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server process for this module (stopped with SIGTERM at the end: it must exit 0)."""
    process = start_server(tmp_path_factory.mktemp("fuzz-server-run"), served_data)
    process.wait_ready()
    yield process
    assert process.stop() == 0
    assert "Traceback" not in process.log(), process.log()[-3000:]


def assert_catalogued(status: int, text: str, content_type: str) -> None:
    """Below 500; an error answer is one catalogued, OpenAI-shaped error."""
    assert status < 500, f"{status}: {text[:500]}"
    if status >= 400 and "application/json" in str(content_type):
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "code", "param"}, error
        assert error["code"] in CATALOGUE and error["message"], error


BUDGETS = [pytest.param(FAST_EXAMPLES, id="fast"), pytest.param(SLOW_EXAMPLES, id="long", marks=pytest.mark.slow)]


def _fuzz_operation(
    operation: Any, mode: GenerationMode, examples: int, server: ServerProcess, statuses: dict[str, int]
) -> None:
    """Send `examples` generated cases of one operation in one mode; count answers by status."""
    label = f"{operation.label} {mode.value}"

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        # Every default check (no 5xx; statuses, content types, headers and bodies as documented; invalid data
        # refused) but one: a schema-valid body can still be refused for what JSON Schema cannot state (its
        # tokens past max_input_tokens, prompts x n past max_choices_per_request): a documented 400.
        response = case.call_and_validate(base_url=server.base_url, timeout=30, excluded_checks=[ACCEPTS_VALID])
        key = f"{label} {response.status_code}"
        statuses[key] = statuses.get(key, 0) + 1
        assert_catalogued(response.status_code, response.text, response.headers.get("content-type", ""))

    call()


@pytest.mark.parametrize("budget", BUDGETS)
def test_schemathesis_finds_no_server_error(
    server: ServerProcess, served_data: dict[str, Any], figures: Any, budget: int
) -> None:
    published = httpx.get(server.url("/openapi.json"), timeout=10)
    assert published.status_code == 200
    schema = schemathesis.openapi.from_dict(published.json())
    statuses: dict[str, int] = {}
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        examples = budget if operation.path in BODY_PATHS else max(3, budget // 4)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz_operation(operation, mode, examples, server, statuses)
            except Unsatisfiable:  # no schema-violating request exists for this operation (e.g. GET /health)
                figures.count("operation/modes with nothing to generate", 1)
    figures.count("operations", operations)
    figures.count("cases tried", sum(statuses.values()))
    figures.set("statuses", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    figures.count("5xx answers", sum(v for k, v in statuses.items() if k.rsplit(" ", 1)[1].startswith("5")))
    assert sum(v for k, v in statuses.items() if k.endswith(" 200")) > 0  # valid requests were generated and served


JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
JSON_VALUE = st.recursive(
    JSON_LEAF, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=10
)
VALID = {
    "/v1/completions": {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2},
    "/v1/chat/completions": {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/embeddings": {"model": MODEL_NAME, "input": "x"},
}
FIELDS = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "logprobs",
          "top_logprobs", "stream_options", "n", "user", "input", "model", "x"]  # fmt: skip
CONTENT_TYPES = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "application/json; charset=latin-1", "text/plain",
     "application/x-www-form-urlencoded", "", "application/json;;;", "APPLICATION/JSON", "multipart/form-data"]
)  # fmt: skip
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "X-Tenant": st.text(max_size=20) | st.just("t" * 300),
        "Prefer": st.sampled_from(["respond-async", "respond-async, wait=1", "x"]),
        "Content-Length": st.sampled_from(["0", "-1", "abc", "99999999999"]),
    },
)


@pytest.mark.parametrize("budget", BUDGETS)
def test_raw_http_fuzz_finds_no_server_error(server: ServerProcess, figures: Any, budget: int) -> None:
    statuses: dict[int, int] = {}

    @settings(max_examples=budget * 5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        path=st.sampled_from([*VALID, "/v1/requests/x", "/v1/models", "/v1/../v1/completions", "/v1/completions/"]),
        method=st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE"]),
        edits=st.lists(st.tuples(st.sampled_from(FIELDS), JSON_VALUE), max_size=3),
        raw=st.none() | st.binary(max_size=40),
        content_type=CONTENT_TYPES,
        headers=HEADERS,
    )
    def call(
        path: str, method: str, edits: list[tuple[str, Any]], raw: bytes | None, content_type: str, headers: Any
    ) -> None:
        body = dict(VALID.get(path, VALID["/v1/completions"]))
        body.update(edits)
        content = raw if raw is not None else json.dumps(body, allow_nan=True).encode()
        sent = {"Content-Type": content_type, "X-Tenant": "fuzz", **headers}
        if "Content-Length" in sent:
            sent["Content-Length"] = str(len(content))  # a lying length would only test httpx
        try:
            response = httpx.request(method, server.url(path), content=content, headers=sent, timeout=30)
        except (httpx.LocalProtocolError, UnicodeEncodeError):  # httpx refuses to send it (newline, non-ASCII)
            return
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert_catalogued(response.status_code, response.text, response.headers.get("content-type", ""))

    call()
    figures.count("cases tried", sum(statuses.values()))
    figures.set("statuses", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    figures.count("5xx answers", sum(v for k, v in statuses.items() if k >= 500))
    assert httpx.get(server.url("/ready"), timeout=10).status_code == 200  # still serving


def test_out_of_vocabulary_token_ids_are_a_client_error(server: ServerProcess) -> None:
    """Token ids beyond the vocabulary (or beyond int64) are refused per request, and hurt no neighbour."""
    for ids in ([5, 10**6], [2**64], [5, -1]):
        body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 2}
        response = httpx.post(server.url("/v1/completions"), json=body, headers={"X-Tenant": "t"}, timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"].startswith("prompt")
