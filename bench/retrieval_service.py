"""A local-search service deployed the way the reference deploys its retriever: its own process, an HTTP
POST per search (``{"queries": [...], "topk": k}`` -> ``{"result": [[{"title", "text"}, ...], ...]}``).

    python bench/retrieval_service.py --index DIR --port PORT

Used by ``bench_tool_batching.py`` as the reference-topology baseline; the same index, encoder and
FAISS search as the in-process tool, with no micro-batching.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from mia_engine.config.memory import EmbedderConfig  # noqa: E402
from mia_engine.memory.embedder import Embedder  # noqa: E402
from mia_engine.tools.search import LocalSearch  # noqa: E402


def build_app(index: Path) -> Starlette:
    search = LocalSearch(index, Embedder(EmbedderConfig(batch_wait_ms=0.0)), batch_wait_ms=0.0)

    async def retrieve(request: Request) -> JSONResponse:
        body = await request.json()
        results = await search.search(list(body["queries"]), int(body.get("topk", 3)))
        return JSONResponse({"result": [[{"title": p.title, "text": p.text} for p in r] for r in results]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.index), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
