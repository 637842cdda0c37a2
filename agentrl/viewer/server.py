"""The viewer's HTTP app: one page (static/index.html, hand-written JS and CSS shipped in the package, no CDN)
over a JSON API that pages on the server.

    GET /api/run                         run kind (train / eval), tokenizer, indexing progress, filter choices
    GET /api/groups?page&size&<filters>  one page of (step, uid) groups with their matching episodes
    GET /api/infra?page&size&<filters>   one page of infra-error episodes (kept apart from the groups)
    GET /api/episode/{row}               one episode: tokens (kind, id, rollout and trainer logprobs), tool calls
    GET /api/group/{step}/{uid}          the n episodes of one prompt, side by side
    GET /api/metrics?since=K             metrics.jsonl rows from row K on (the page polls it on a live run)
    GET /api/curves                      the curve panels: metrics, titles, units, held-out labels (curves.py)
    GET /api/eval                        an evaluation directory's report and comparison as tables (evalview.py)
    GET /api/eval/pass_at_k.png          its pass@k plot, when `agentrl eval` drew one

Filters: step_min, step_max, data_source, reward_min, reward_max, finish_reason, error_kind, zero_variance, q.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from agentrl.trainer.metrics import METRICS_FILE
from agentrl.viewer.curves import curve_panels
from agentrl.viewer.evalview import PASS_AT_K_PNG, eval_page
from agentrl.viewer.index import Filters, RunIndex
from agentrl.viewer.tokens import episode_tokens, load_tokenizer, policy_versions, tokenizer_dir

STATIC_DIR = Path(__file__).parent / "static"
MAX_PAGE = 200
FIRST_PAGE_WAIT_S = 1.5  # while indexing, how long a page request waits for its groups to be read


class _Tokenizer:
    """The run's tokenizer, loaded on the first episode view (not while the first page is being served)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._tok = None
        self._loaded = False
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if not self._loaded:
                self._tok = load_tokenizer(self.path)
                self._loaded = True
            return self._tok


def create_app(run_dir: str | Path, *, tokenizer_path: str | Path | None = None) -> FastAPI:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory: pass a training run dir or an `agentrl eval` "
                                "output dir")
    index = RunIndex(run_dir).start()
    tokenizer = _Tokenizer(Path(tokenizer_path) if tokenizer_path else tokenizer_dir(run_dir))
    metrics_rows: list[dict] = []
    metrics_pos = [0]
    app = FastAPI(title="agentrl view")
    app.state.index = index

    def refreshed() -> RunIndex:
        if index.done:  # a live run appends lines: pick them up (the first pass reads the file as it grows)
            index.refresh()
        return index

    def filters(step_min: int | None, step_max: int | None, data_source: str | None, reward_min: float | None,
                reward_max: float | None, finish_reason: str | None, error_kind: str | None, zero_variance: bool,
                q: str) -> Filters:
        return Filters(step_min=step_min, step_max=step_max, data_source=data_source or None,
                       reward_min=reward_min, reward_max=reward_max, finish_reason=finish_reason or None,
                       error_kind=error_kind or None, zero_variance=zero_variance, query=q)

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/api/run")
    def run_info() -> dict:
        idx = refreshed()
        episodes = list(idx.episodes)
        return {"run_dir": str(run_dir), "kind": "eval" if (run_dir / "eval.json").is_file() else "train",
                "tokenizer": None if tokenizer.path is None else str(tokenizer.path),
                "episodes": len(episodes), "indexing": not idx.done, "error": idx.error,
                "trained_episodes": len(idx.train),
                "steps": sorted({e.step for e in episodes}),
                "data_sources": sorted({e.data_source for e in episodes}),
                "finish_reasons": sorted({e.finish_reason for e in episodes}),
                "error_kinds": sorted({k for e in episodes for k in e.error_kinds}),
                "infra_errors": sum(e.infra_error for e in episodes),
                "has_metrics": (run_dir / METRICS_FILE).is_file()}

    @app.get("/api/groups")
    def groups(page: int = 0, size: int = Query(20, ge=1, le=MAX_PAGE), step_min: int | None = None,
               step_max: int | None = None, data_source: str | None = None, reward_min: float | None = None,
               reward_max: float | None = None, finish_reason: str | None = None, error_kind: str | None = None,
               zero_variance: bool = False, q: str = "") -> dict:
        idx = refreshed()
        f = filters(step_min, step_max, data_source, reward_min, reward_max, finish_reason, error_kind,
                    zero_variance, q)
        found = idx.groups(f)
        deadline = time.monotonic() + FIRST_PAGE_WAIT_S
        while not idx.done and len(found) <= (page + 1) * size and time.monotonic() < deadline:
            time.sleep(0.05)  # the index is still being built: wait until this page's groups are complete
            found = idx.groups(f)
        cut = found[page * size:(page + 1) * size]
        return {"total_groups": len(found), "total_episodes": sum(len(g["episodes"]) for g in found),
                "page": page, "size": size, "indexing": not idx.done,
                "groups": [{**g, "episodes": [_with_adv(idx, e) for e in g["episodes"]]} for g in cut]}

    @app.get("/api/infra")
    def infra(page: int = 0, size: int = Query(50, ge=1, le=MAX_PAGE), step_min: int | None = None,
              step_max: int | None = None, data_source: str | None = None, finish_reason: str | None = None,
              error_kind: str | None = None, q: str = "") -> dict:
        idx = refreshed()
        found = idx.infra_episodes(filters(step_min, step_max, data_source, None, None, finish_reason, error_kind,
                                           False, q))
        rows = []
        for e in found[page * size:(page + 1) * size]:
            d = idx.read_episode(e.row)
            rows.append({**e.to_json(), "infra_detail": (d.get("metrics") or {}).get("infra_detail")
                         or (d.get("metrics") or {}).get("reward_error"),
                         "stop_detail": (d.get("metrics") or {}).get("stop_detail")})
        return {"total": len(found), "page": page, "size": size, "episodes": rows}

    @app.get("/api/episode/{row}")
    def episode(row: int) -> dict:
        idx = refreshed()
        if not 0 <= row < len(idx.episodes):
            raise HTTPException(404, f"no episode {row}: the run has {len(idx.episodes)} indexed episodes")
        summary = idx.episodes[row]
        d = idx.read_episode(row)
        train = idx.train_record(summary.episode_id)
        tokens = episode_tokens(d, tokenizer.get(), None if train is None else train["trainer_logprobs"])
        return {"summary": summary.to_json(), "advantage": None if train is None else train["advantage"],
                "has_trainer_logprobs": train is not None, "tokens": tokens, "messages": d.get("messages") or [],
                "tool_calls": d.get("tool_calls") or [], "metrics": d.get("metrics") or {},
                "turns": d.get("turns") or [], "replay": d.get("replay") or {},
                "sum_response_mask": sum(d["response_mask"]), "prompt_tokens": len(d["prompt_ids"]),
                "weight_versions": policy_versions(d)}

    @app.get("/api/group/{step}/{uid}")
    def group(step: int, uid: str) -> dict:
        idx = refreshed()
        members = idx.group_members(step, uid)
        if not members:
            raise HTTPException(404, f"no group step={step} uid={uid!r}")
        out = []
        for e in members:
            d = idx.read_episode(e.row)
            out.append({**_with_adv(idx, e), "messages": d.get("messages") or [],
                        "tool_calls": d.get("tool_calls") or []})
        return {"step": step, "uid": uid, "episodes": out}

    @app.get("/api/metrics")
    def metrics(since: int = 0) -> dict:
        path = run_dir / METRICS_FILE
        if path.is_file():
            if path.stat().st_size < metrics_pos[0]:  # rewound by a resume
                metrics_rows.clear()
                metrics_pos[0] = 0
            with path.open("rb") as f:
                f.seek(metrics_pos[0])
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    metrics_pos[0] += len(line)
                    if line.strip():
                        metrics_rows.append(json.loads(line))
        return {"rows": metrics_rows[since:], "total": len(metrics_rows),
                "complete": (run_dir / "COMPLETE").exists(),
                "age_s": time.time() - path.stat().st_mtime if path.is_file() else None}

    @app.get("/api/curves")
    def curves() -> dict:
        return curve_panels(run_dir)

    def eval_dir() -> Path:
        if not (run_dir / "eval.json").is_file():
            raise HTTPException(404, f"{run_dir / 'eval.json'} does not exist (not an `agentrl eval` output directory)")
        return run_dir

    @app.get("/api/eval")
    def eval_record() -> dict:
        return eval_page(eval_dir())

    @app.get("/api/eval/pass_at_k.png")
    def eval_pass_at_k() -> FileResponse:
        path = eval_dir() / PASS_AT_K_PNG
        if not path.is_file():
            raise HTTPException(404, f"{path} does not exist: `agentrl eval` draws it when --n is above 1")
        return FileResponse(path)

    return app


def _with_adv(idx: RunIndex, e) -> dict:
    return {**e.to_json(), "advantage": idx.advantage(e.episode_id)}


__all__ = ["create_app", "STATIC_DIR"]
