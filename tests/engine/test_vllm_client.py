"""The vLLM client against a fake server (httpx.MockTransport): what it sends, what it makes of the answers, how
it retries and fails, and the one-line checks before any work. The real server: tests/engine/test_vllm_server.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from harmonyrl.config import ConfigError, load_config
from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.vllm import EngineFailure, VllmEngine, request_body, sample_version, unlabelled
from harmonyrl.engine.vllm_check import check_server
from harmonyrl.engine.vllm_worker import SYNC_PROTOCOL
from harmonyrl.errors import EngineUnavailable
from harmonyrl.types import SamplingParams

PARAMS = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=16, stop_ids=(5, 6), seed=2**64 + 3)


def answer(ids: list[int], logprobs: list[float], version: str = "default") -> dict[str, Any]:
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
    spans = [{"version": version, "start": 0, "end": len(ids)}]
    return {"choices": [{"token_ids": ids, "logprobs": {"content": content}, "weight_versions": spans}]}


def engine(handler: Any, tmp_path: Path, **fields: Any) -> VllmEngine:
    config = VllmEngineConfig(model="tiny", url="http://vllm.test", backoff_s=0.001, **fields)
    return VllmEngine(config, vocab_size=100, max_seq_len=64, sync_dir=tmp_path, transport=httpx.MockTransport(handler))


def test_sampling_params_map_onto_vllm_names() -> None:
    body = request_body("generate", "tiny", [1, 2], PARAMS, 16)
    s = body["sampling_params"]
    assert body["token_ids"] == [1, 2] and body["model"] == "tiny"
    assert (s["temperature"], s["top_p"], s["top_k"], s["max_tokens"]) == (0.7, 0.9, -1, 16)
    assert s["seed"] == 3  # 2**64 + 3 folded into vLLM's signed 64-bit seed
    assert s["stop_token_ids"] == [5, 6] and s["ignore_eos"] is True and s["logprobs"] == 0
    assert s["skip_special_tokens"] is False
    flat = request_body("completions", "tiny", [1, 2], SamplingParams(top_k=7), 4)
    assert flat["prompt"] == [1, 2] and flat["return_token_ids"] is True and flat["top_k"] == 7


def test_generate_returns_ids_logprobs_stop_and_version(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        assert request.url.path == "/inference/v1/generate"
        return httpx.Response(200, json=answer([9, 8, 5], [-0.5, -1.0, -0.25], version="3"))

    gen = asyncio.run(engine(handler, tmp_path).generate([1, 2, 3], PARAMS))
    assert gen.token_ids == (9, 8, 5) and gen.logprobs == (-0.5, -1.0, -0.25)
    assert gen.finish_reason == "stop" and gen.policy_version == 3 and gen.routing is None
    # the budget is cut to what fits in max_seq_len: 64 - 3 prompt tokens > 16, so 16
    assert sent[0]["sampling_params"]["max_tokens"] == 16


def test_completions_route_and_length_finish(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        choice = {"token_ids": [7, 7], "logprobs": {"token_logprobs": [-1.0, -2.0]}}
        return httpx.Response(200, json={"choices": [choice]})

    gen = asyncio.run(engine(handler, tmp_path, route="completions").generate([1] * 62, PARAMS))
    assert gen.token_ids == (7, 7) and gen.finish_reason == "length" and gen.policy_version == 0


def test_5xx_and_dropped_connections_are_retried_then_succeed(tmp_path: Path) -> None:
    calls = iter(["drop", 503, 500, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        outcome = next(calls)
        if outcome == "drop":
            raise httpx.ConnectError("connection refused", request=request)
        if outcome != 200:
            return httpx.Response(int(outcome), json={"message": "busy"})
        return httpx.Response(200, json=answer([4], [-0.1]))

    client = engine(handler, tmp_path, retries=3)
    window = client.metrics_window()
    gen = asyncio.run(client.generate([1], PARAMS))
    assert gen.token_ids == (4,)
    assert window(1.0)["engine/retries"] == 3.0


def test_retries_are_bounded_then_the_step_fails_loudly(tmp_path: Path) -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(EngineFailure, match=r"failed /inference/v1/generate 3 times; last: ReadTimeout"):
        asyncio.run(engine(handler, tmp_path, retries=2).generate([1], PARAMS))
    assert len(calls) == 3


def test_a_refused_request_fails_at_once_with_the_server_message(tmp_path: Path) -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"error": {"message": "top_p must be in (0, 1]"}, "message": "bad top_p"})

    with pytest.raises(EngineFailure, match="refused /inference/v1/generate: HTTP 400: bad top_p"):
        asyncio.run(engine(handler, tmp_path).generate([1], PARAMS))
    assert len(calls) == 1


def test_a_malformed_answer_is_a_failure_not_an_empty_generation(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"token_ids": [1, 2], "logprobs": {"content": [{"logprob": 0}]}}]})

    with pytest.raises(EngineFailure, match="2 token ids with 1 log-probs"):
        asyncio.run(engine(handler, tmp_path).generate([1], PARAMS))


def test_bad_prompts_fail_before_any_request(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    client = engine(handler, tmp_path)
    with pytest.raises(ValueError, match="out of range"):
        asyncio.run(client.generate([100], PARAMS))
    with pytest.raises(ValueError, match="max_seq_len=64"):
        asyncio.run(client.generate([1] * 64, PARAMS))


def test_weight_sync_saves_then_pauses_reloads_versions_and_resumes(tmp_path: Path) -> None:
    seen: list[tuple[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else dict(request.url.params)
        seen.append((request.url.path, body))
        if request.url.path == "/collective_rpc":  # the folder is complete when the server is asked to read it
            assert load_file(Path(body["kwargs"]["weights_path"]) / "model.safetensors")["w"].tolist() == [1.0, 2.0]
            return httpx.Response(200, json={"results": [{"protocol": SYNC_PROTOCOL, "tensors": 1, "sinks": 0}]})
        return httpx.Response(200, json={})

    client = engine(handler, tmp_path / "sync")
    asyncio.run(client.sync_weights({"w": torch.tensor([1.0, 2.0])}, version=7))
    assert [p for p, _ in seen] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    assert seen[0][1] == {"mode": "wait"}
    assert seen[1][1] == {"method": "harmonyrl_load_weights", "kwargs": {"weights_path": str(tmp_path / "sync")}}
    assert seen[2][1] == {"new_version": "7"} and client.policy_version == 7


@pytest.mark.parametrize(
    ("rpc_answer", "message"),
    [
        (None, "not every worker's report"),
        ({"results": [None]}, "not every worker's report"),
        ({"results": [{"protocol": SYNC_PROTOCOL + 1}]}, "not every worker's report"),
        (
            {"results": [{"protocol": SYNC_PROTOCOL, "error": "RuntimeError: vLLM did not reload x"}]},
            "failed: RuntimeError: vLLM",
        ),
    ],
)
def test_a_sync_without_every_workers_report_fails_and_resumes(tmp_path: Path, rpc_answer: Any, message: str) -> None:
    """vLLM's plain ``reload_weights`` answers with an empty 200: a server without our extension must not pass;
    neither does a worker that reports what it could not load."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json=rpc_answer) if request.url.path == "/collective_rpc" else httpx.Response(200)

    with pytest.raises(EngineFailure, match=message):
        asyncio.run(engine(handler, tmp_path).sync_weights({"w": torch.zeros(1)}, version=1))
    assert seen == ["/pause", "/collective_rpc", "/resume"]


def test_a_samples_version_is_the_oldest_that_sampled_it() -> None:
    spans = [{"version": "4", "start": 0, "end": 3}, {"version": "5", "start": 3, "end": 9}]
    assert sample_version(spans, fallback=9) == 4  # a staleness bound must hold for every token
    assert sample_version([{"version": "default", "start": 0, "end": 2}], fallback=0) == 0
    assert sample_version([], fallback=2) == 2


def test_a_failed_reload_still_resumes_generation(tmp_path: Path) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(422 if request.url.path == "/collective_rpc" else 200, json={"detail": "bad shape"})

    with pytest.raises(EngineFailure, match="bad shape"):
        asyncio.run(engine(handler, tmp_path).sync_weights({"w": torch.zeros(1)}, version=1))
    assert seen == ["/pause", "/collective_rpc", "/resume"]


MODEL_CONFIG = SimpleNamespace(
    vocab_size=100, hidden_size=64, num_hidden_layers=2, num_local_experts=4, num_attention_heads=4
)


def fake_server(
    monkeypatch: pytest.MonkeyPatch,
    models: list[dict[str, Any]],
    paths: list[str],
    rpc: httpx.Response | None = None,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/collective_rpc":  # harmonyrl_sync_protocol, on a server with the extension
            assert json.loads(request.content)["method"] == "harmonyrl_sync_protocol"
            return rpc or httpx.Response(200, json={"results": [str(SYNC_PROTOCOL)]})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": models})
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json={"paths": {p: {} for p in paths}})
        return httpx.Response(200, json={"version": "0.32.0"})

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))


ALL_ROUTES = ["/inference/v1/generate", "/v1/completions", "/pause", "/resume", "/collective_rpc"]


def test_server_checks_pass_and_label_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_server(monkeypatch, [{"id": "tiny", "max_model_len": 1024}], [*ALL_ROUTES, "/update_weight_version"])
    label = check_server(VllmEngineConfig(model="tiny", url="http://vllm.test"), MODEL_CONFIG, 512)
    assert label == "vllm 0.32.0 at http://vllm.test (tiny, generate)"


@pytest.mark.parametrize(
    ("models", "paths", "fields", "message"),
    [
        ([{"id": "big", "max_model_len": 1024}], ALL_ROUTES, {}, "serves ['big'], not rollout.engine.model='tiny'"),
        ([{"id": "tiny", "max_model_len": 256}], ALL_ROUTES, {}, "max_model_len=256 is below rollout.max_seq_len=512"),
        ([{"id": "tiny", "max_model_len": 1024}], ["/v1/completions"], {}, "--enable-scale-out"),
        ([{"id": "tiny", "max_model_len": 1024}], ["/v1/completions"], {"route": "completions"}, "DEV_MODE"),
    ],
)
def test_server_problems_are_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch,
    models: list[dict[str, Any]],
    paths: list[str],
    fields: dict[str, Any],
    message: str,
) -> None:
    fake_server(monkeypatch, models, paths)
    with pytest.raises(EngineUnavailable) as info:
        check_server(VllmEngineConfig(model="tiny", url="http://vllm.test", **fields), MODEL_CONFIG, 512)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("rpc", "message"),
    [
        (httpx.Response(500, json={"error": "no attribute"}), "--worker-extension-cls harmonyrl.engine.vllm_worker"),
        (httpx.Response(200, json={"results": ["1"]}), f"protocol 1, this client speaks {SYNC_PROTOCOL}"),
    ],
)
def test_a_server_without_the_weight_sync_extension_is_refused(
    monkeypatch: pytest.MonkeyPatch, rpc: httpx.Response, message: str
) -> None:
    """Without harmonyrl's worker extension a sync would skip the experts and sinks: refused before any work."""
    fake_server(monkeypatch, [{"id": "tiny", "max_model_len": 1024}], [*ALL_ROUTES, "/update_weight_version"], rpc)
    with pytest.raises(EngineUnavailable) as info:
        check_server(VllmEngineConfig(model="tiny", url="http://vllm.test"), MODEL_CONFIG, 512)
    assert message in str(info.value) and "\n" not in str(info.value)
    check_server(VllmEngineConfig(model="tiny", url="http://vllm.test", weight_sync="none"), MODEL_CONFIG, 512)


def test_a_served_folder_of_another_shape_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**vars(MODEL_CONFIG), "vocab_size": 200}))
    fake_server(monkeypatch, [{"id": "tiny", "max_model_len": 1024, "root": str(tmp_path)}], ALL_ROUTES)
    with pytest.raises(EngineUnavailable, match=r"serves another model .*vocab_size 200 != 100"):
        check_server(VllmEngineConfig(model="tiny", url="http://vllm.test"), MODEL_CONFIG, 512)


def test_an_unreachable_url_is_one_line() -> None:
    with pytest.raises(EngineUnavailable, match=r"rollout.engine.url=http://127.0.0.1:9: no vLLM server answers"):
        check_server(VllmEngineConfig(model="tiny", url="http://127.0.0.1:9", connect_timeout_s=2), MODEL_CONFIG, 64)


def test_engine_config_is_a_typed_union() -> None:
    local = load_config(overrides=["rollout.engine.max_batch=3"]).rollout.engine
    assert local.kind == "local" and local.concurrency == 3
    remote = load_config(overrides=["rollout.engine.kind=vllm", "rollout.engine.model=m"]).rollout.engine
    assert isinstance(remote, VllmEngineConfig) and remote.concurrency == 64
    with pytest.raises(ConfigError, match="does not apply to the chosen kind"):
        load_config(overrides=["rollout.engine.kind=vllm", "rollout.engine.model=m", "rollout.engine.max_batch=3"])
    with pytest.raises(ConfigError, match=r"rollout\.engine\.model"):
        load_config(overrides=["rollout.engine.kind=vllm"])
    with pytest.raises(ConfigError, match="routing_replay=r3 needs"):
        load_config(overrides=["rollout.engine.kind=vllm", "rollout.engine.model=m", "rl.routing_replay=r3"])


# ---- a server that dies: waited for within restart_wait_s, sent the weights again when it comes back ----------


class RestartingServer:
    """A fake server that restarts (refusing connections ``down_for`` times, then answering as a fresh server:
    its samples labelled ``"default"`` until it is sent weights) after the first ``crash_after`` generations."""

    def __init__(self, crash_after: int, down_for: int) -> None:
        self.crash_after, self.down_for = crash_after, down_for
        self.version, self.generations, self.refused = "default", 0, 0
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/inference/v1/generate" and self.generations == self.crash_after and self.refused < self.down_for:
            self.refused += 1
            if self.refused == self.down_for:
                self.version = "default"  # back, with the weights it was started with
            raise httpx.ConnectError("connection refused", request=request)
        self.paths.append(path)
        if path == "/collective_rpc":
            return httpx.Response(200, json={"results": [{"protocol": SYNC_PROTOCOL, "tensors": 1, "sinks": 0}]})
        if path == "/update_weight_version":
            self.version = json.loads(request.content)["new_version"]
        if path == "/inference/v1/generate":
            self.generations += 1
            return httpx.Response(200, json=answer([4], [-0.1], version=self.version))
        return httpx.Response(200, json={})


def test_a_restarted_server_is_sent_the_synced_weights_before_a_sample_is_kept(tmp_path: Path) -> None:
    server = RestartingServer(crash_after=1, down_for=3)
    client = engine(server, tmp_path, restart_wait_s=60)
    window = client.metrics_window()

    async def run() -> list[int]:
        await client.sync_weights({"w": torch.ones(1)}, version=3)
        first = await client.generate([1], PARAMS)  # before the crash
        second = await client.generate([1], PARAMS)  # refused 3 times, then a fresh server: reload, then again
        return [first.policy_version, second.policy_version]

    assert asyncio.run(run()) == [3, 3]
    sync = ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    generate = "/inference/v1/generate"
    # the fresh server's "default" sample is dropped, the weights are loaded again, the request is sent again
    assert server.paths == [*sync, generate, generate, *sync, generate]
    metrics = window(1.0)
    assert metrics["engine/reloads"] == 1.0 and metrics["engine/retries"] == 3.0


def test_a_stale_sample_before_any_sync_is_kept() -> None:
    """Before the first sync the server holds the weights it was started with: ``"default"`` is no restart."""
    assert unlabelled(answer([4], [-0.1]))
    server = RestartingServer(crash_after=-1, down_for=0)
    client = engine(server, Path("unused"))
    assert asyncio.run(client.generate([1], PARAMS)).policy_version == 0
    assert server.paths == ["/inference/v1/generate"]


def test_requests_in_flight_share_one_reload(tmp_path: Path) -> None:
    server = RestartingServer(crash_after=-1, down_for=0)
    client = engine(server, tmp_path)

    async def run() -> None:
        await client.sync_weights({"w": torch.ones(1)}, version=2)
        server.version = "default"  # restarted between the sync and these requests
        await asyncio.gather(*(client.generate([1], PARAMS) for _ in range(5)))

    asyncio.run(run())
    assert client.reloads == 1 and server.paths.count("/collective_rpc") == 2  # the sync, one reload


def test_a_server_that_stays_down_fails_the_step_after_restart_wait_s(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = engine(handler, tmp_path, restart_wait_s=0.3, retries=1)
    start = time.monotonic()
    with pytest.raises(
        EngineFailure,
        match=r"did not answer /inference/v1/generate for [0-9.]+ s \(rollout.engine.restart_wait_s=0.3\)",
    ):
        asyncio.run(client.generate([1], PARAMS))
    assert 0.3 <= time.monotonic() - start < 5.0


def test_a_dropped_connection_on_the_completions_route_reloads_the_weights(tmp_path: Path) -> None:
    """That route labels no sample: a request that lost its connection cannot tell a restart from a blip."""
    paths: list[str] = []
    drops = [True]  # the first generation loses its connection, the next ones do not

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and drops and drops.pop():
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        paths.append(request.url.path)
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [{"protocol": SYNC_PROTOCOL, "tensors": 1, "sinks": 0}]})
        if request.url.path == "/v1/completions":
            return httpx.Response(200, json={"choices": [{"token_ids": [4], "logprobs": {"token_logprobs": [-1.0]}}]})
        return httpx.Response(200, json={})

    client = engine(handler, tmp_path, route="completions")

    async def run() -> None:
        await client.sync_weights({"w": torch.ones(1)}, version=1)
        await client.generate([1], PARAMS)

    asyncio.run(run())
    assert paths.count("/collective_rpc") == 2 and paths[-1] == "/v1/completions" and client.reloads == 1
