"""The fake server's application: its routes besides completions (models, metrics, version, health, the
/fake/* control endpoints) and the middlewares that record headers, redirect and check the API key.
"""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from kvbench.testing.fakestate import STATE, FakeConfig, State
from kvbench.testing.fakestream import completion


async def _models(request: web.Request) -> web.Response:
    cfg: FakeConfig = request.app[STATE].config
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": cfg.model,
                    "object": "model",
                    "owned_by": "kvbench-fake",
                    "root": cfg.model if cfg.model_root is None else cfg.model_root,
                    "max_model_len": cfg.max_model_len,
                }
            ],
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    st: State = request.app[STATE]
    if st.config.metrics_body is not None:
        return web.Response(text=st.config.metrics_body, content_type="text/plain")
    lab = f'{{engine="0",model_name="{st.config.model}"}}'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{lab} {float(st.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{lab} 0.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{lab} 0.0",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{lab} {float(st.prompt_tokens_total)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{lab} {float(st.generation_tokens_total)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        (
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{st.config.model}"}} '
            f"{float(st.success_total)}"
        ),
    ]
    cfg = st.config
    if cfg.kv_cache_dtype is not None:
        tokens = cfg.num_gpu_blocks * cfg.block_size
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{cfg.block_size}",cache_dtype="{cfg.kv_cache_dtype}",engine="0",'
            f'kv_cache_size_tokens="{tokens}",num_gpu_blocks="{cfg.num_gpu_blocks}"}} 1.0',
        ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")


async def _version(request: web.Request) -> web.Response:
    cfg: FakeConfig = request.app[STATE].config
    if cfg.vllm_version is None:
        raise web.HTTPNotFound()
    return web.json_response({"version": cfg.vllm_version})


@web.middleware
async def _seen(request: web.Request, handler):
    """Every request's headers are kept (GET /fake/headers), and `redirect_to` answers before anything else."""
    if request.path.startswith("/fake/"):
        return await handler(request)
    st: State = request.app[STATE]
    st.headers_seen.append({"path": request.path, **request.headers})
    if st.config.redirect_to:
        raise web.HTTPTemporaryRedirect(st.config.redirect_to.rstrip("/") + request.path_qs)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler):
    """vLLM's --api-key: /v1 paths need `Authorization: Bearer <key>` (vllm/entrypoints/serve/middleware)."""
    key = request.app[STATE].config.api_key
    if key is not None and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _config(request: web.Request) -> web.Response:
    st: State = request.app[STATE]
    if request.method == "POST":
        try:
            st.config.update(await request.json())
        except (ValueError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        st.reset()
    return web.json_response(asdict(st.config))


async def _log(request: web.Request) -> web.Response:
    st: State = request.app[STATE]
    out = web.json_response(st.log)
    if request.query.get("clear"):
        st.reset()
    return out


async def _headers_seen(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].headers_seen)


def make_app(config: FakeConfig | None = None) -> web.Application:
    app = web.Application(middlewares=[_seen, _auth])
    app[STATE] = State(config or FakeConfig())
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_route("*", "/fake/config", _config)
    app.router.add_get("/fake/log", _log)
    app.router.add_get("/fake/headers", _headers_seen)
    return app
