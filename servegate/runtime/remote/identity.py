"""What a remote OpenAI-compatible server says it is: engine, version, served models, context length, memory.

The fingerprint of an endpoint manifest covers this identity, not the URL: the same engine and version
serving the same model on another port is the same behaviour; another vLLM version behind the same URL
is not. Read at start from the routes servers expose: `/version` (vLLM: `{"version": ...}`; servegate:
`{"engine", "version"}`), `/v1/models` (`owned_by`, vLLM's `max_model_len`) and the `server` header.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from servegate.contracts.errors import RemoteUnavailable

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RemoteIdentity:
    """The remote as it reported itself."""

    engine: str
    """`vllm`, `servegate`, or what the server calls itself (`unknown` when it does not say)."""
    version: str | None
    """The engine's version, when it reports one."""
    models: tuple[str, ...]
    """Model ids from /v1/models."""
    max_model_len: int | None = None
    """Context length the remote reports for the served model (vLLM does), else None."""

    def as_engine(self) -> dict[str, Any]:
        """The manifest's runtime.engine form of this identity."""
        return {"name": self.engine, "version": self.version}

    def to_dict(self) -> dict[str, Any]:
        """JSON form for reports."""
        return {**asdict(self), "models": list(self.models)}


def root_of(base_url: str) -> str:
    """The server's root URL from its API base (…/v1 stripped)."""
    return re.sub(r"/v1/?$", "", base_url.rstrip("/"))


async def probe_identity(base_url: str, model: str) -> RemoteIdentity:
    """Ask the remote what it is; RemoteUnavailable when it cannot be reached or does not serve `model`."""
    root = root_of(base_url)
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            listed = await client.get(base_url.rstrip("/") + "/models")
            version = await client.get(root + "/version")
    except (httpx.HTTPError, OSError) as exc:
        raise RemoteUnavailable(f"the endpoint {base_url} cannot be reached ({type(exc).__name__}: {exc})") from None
    if listed.status_code >= 500:
        raise RemoteUnavailable(f"the endpoint {base_url} answered {listed.status_code} to GET /models")
    cards = _cards(listed)
    models = tuple(str(c.get("id")) for c in cards)
    if models and model not in models:
        raise RemoteUnavailable(
            f"the endpoint {base_url} serves {', '.join(models)}, not {model!r}: set runtime.endpoint_model"
        )
    card = next((c for c in cards if c.get("id") == model), {})
    reported = _json(version)
    owner = str(card.get("owned_by") or "")
    server = listed.headers.get("server", "").split("/")[0].strip().lower()
    engine = str(reported.get("engine") or owner or server or "unknown").lower()
    length = card.get("max_model_len")
    return RemoteIdentity(
        engine=engine,
        version=str(reported["version"]) if reported.get("version") is not None else None,
        models=models,
        max_model_len=int(length) if isinstance(length, int) else None,
    )


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        return {}
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _cards(response: httpx.Response) -> list[dict[str, Any]]:
    data = _json(response).get("data")
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


async def remote_memory(base_url: str, identity: RemoteIdentity) -> tuple[int | None, str]:
    """Resident memory of the whole remote, bytes, when its /metrics can say it; else None and why not.

    Prometheus clients export `process_resident_memory_bytes` for the process that serves /metrics. For
    servegate that process holds the model; vLLM runs the model in engine-core and worker processes that
    the figure leaves out, so it is not the deployment's memory and is not used as such.
    """
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            resp = await client.get(root_of(base_url) + "/metrics")
    except (httpx.HTTPError, OSError) as exc:
        return None, f"the remote's /metrics cannot be read ({type(exc).__name__})"
    if resp.status_code != 200:
        return None, f"the remote's /metrics answered {resp.status_code}"
    match = re.search(r"^process_resident_memory_bytes(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$", resp.text, re.M)
    if match is None:
        return None, "the remote's /metrics exports no process_resident_memory_bytes"
    value = int(float(match.group(1)))
    if identity.engine != "servegate":
        return None, (
            f"the remote's /metrics reports {value / 2**20:.0f} MiB resident for its API process only "
            f"({identity.engine} runs the model in other processes): the deployment's memory is not visible "
            "from outside"
        )
    return value, "resident memory of the remote server process, from its /metrics"
