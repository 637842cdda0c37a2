"""What a dead engine replica costs (`agentrl bench replicas --kill`): the same rollout on N replicas, once as it is
and once with replica 0 killed (`ray.kill`) in the middle, side by side on one ReplicatedEngine.

    agentrl bench replicas --kill            # small model, 2 replicas, 64 episodes x 3 turns x 32 tokens
    agentrl bench replicas --kill --quick    # tiny model, 8 episodes x 2 turns x 8 tokens

The episodes are `replicas_bench`'s (greedy, ignore_eos, every turn exactly `--tokens` tokens). Weights are pushed
as version 1 (the model's own, through Ray's object store as the trainer pushes them) before a warm-up round. In
the kill round, the first episode on replica 0 to reach its middle turn pauses replica 0 behind the engine's back
(an in-place pause: it holds its requests), so that when it is killed every one of its unfinished episodes has a
request in flight there; the kill comes once they all do. The rollout then finishes on the other replicas, and the
next step's weights are pushed (version 2), possibly while replica 0 restarts. Figures:

- per side: wall seconds; episodes complete (every turn, every token); lost (an episode that raised: in a training
  run an infrastructure fault, dropped from the batch, never trained as reward 0; must be 0); episodes and requests
  retried (a request whose replica died is sent again, from the same ids, to another one); episodes whose tokens
  equal the no-kill side's (greedy);
- recovery: from the kill until the new replica 0 serves the newest weights and is back in routing (a replacement
  loads them before it takes work), and what it served of one more round of fresh episodes, at which version.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agentrl.inference.bench_episodes import OBSERVATION_TOKENS, observation, random_prompts, vocab_size

VICTIM = 0


class _Kill:
    """Kills replica VICTIM once it holds a request of every unfinished episode routed to it (see the module
    docstring); records when."""

    def __init__(self, engine, turn: int, tag: str):
        self.engine, self.turn, self.tag = engine, turn, tag
        self.pausing = False
        self.paused = asyncio.Event()
        self.unfinished: set[int] = set()
        self.held = 0  # requests in flight on the victim when it died
        self.at: float | None = None  # perf_counter of the kill
        self.victim = None

    async def before_turn(self, episode: int, turn: int) -> None:
        engine = self.engine
        if self.pausing or turn != self.turn or engine.router.pinned(f"{self.tag}-ep{episode}") != VICTIM:
            return
        self.pausing = True
        await engine.replicas[VICTIM].pause("in_place")  # the engine does not know: its replacement starts unpaused
        self.paused.set()

    async def kill_when_held(self, timeout: float) -> None:
        import ray

        await self.paused.wait()
        engine, deadline = self.engine, time.monotonic() + timeout
        while engine.router.in_flight[VICTIM] < self._on_victim():
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {VICTIM} did not hold its episodes' requests within {timeout:g}s")
            await asyncio.sleep(0.005)
        self.held, self.victim = engine.router.in_flight[VICTIM], engine.replicas[VICTIM]
        self.at = time.perf_counter()
        ray.kill(self.victim.actor, no_restart=True)  # as a crash or an OOM kill would end it

    def _on_victim(self) -> int:
        return sum(self.engine.router.pinned(f"{self.tag}-ep{i}") == VICTIM for i in self.unfinished)


async def _rollout(engine, prompts: list[list[int]], args, vocab: int, tag: str, kill: _Kill | None = None) -> dict:
    """Every episode at once; per side: wall s, outputs (None: lost), episodes and requests retried."""
    from agentrl.types import SamplingParams

    params = SamplingParams(max_new_tokens=args.tokens, temperature=0, ignore_eos=True)
    retried = [0] * len(prompts)

    async def episode(i: int) -> list[int] | None:
        ids, out = list(prompts[i]), []
        try:
            for turn in range(args.turns):
                if kill is not None:
                    await kill.before_turn(i, turn)
                gen = await engine.generate(ids, params, session_id=f"{tag}-ep{i}")
                retried[i] += gen.metrics.get("replica_retries", 0)
                out += gen.token_ids
                ids += gen.token_ids + observation(i, turn, vocab)
        except Exception as e:  # noqa: BLE001 -- a lost episode is a figure of the bench, not its end
            print(f"  episode {i} lost: {type(e).__name__}: {e}", flush=True)
            return None
        finally:
            if kill is not None:
                kill.unfinished.discard(i)
        return out

    if kill is not None:
        kill.unfinished = set(range(len(prompts)))
    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(episode(i)) for i in range(len(prompts))]
    if kill is not None:
        await kill.kill_when_held(engine.config.replica_timeout_s)
    outputs = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "outputs": outputs, "episodes_retried": sum(r > 0 for r in retried),
            "requests_retried": sum(retried)}


async def _recovery(engine, kill: _Kill, args, vocab: int) -> dict:
    """Push the next weights (version 2), wait for replica VICTIM to be back, then one more round of fresh one-turn
    episodes: who served them, at which version."""
    from agentrl.types import SamplingParams

    pushed_while_down = not engine.healthy[VICTIM]
    pushed_at = time.perf_counter() - kill.at
    await engine.update_weights(_state_dict(engine.model_path), version=2)
    deadline = time.monotonic() + engine.config.replica_timeout_s
    while not engine.healthy[VICTIM] and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    back_s = time.perf_counter() - kill.at
    if not engine.healthy[VICTIM]:
        return {"back": False, "why": engine.last_errors.get(VICTIM, "no answer")}
    stats = await engine.replica_stats()
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0, ignore_eos=True)
    prompts = random_prompts(args.episodes, args.prompt_len, vocab, args.seed + 2)
    fresh = await asyncio.gather(*[engine.generate(p, params, session_id=f"after-{i}") for i, p in enumerate(prompts)])
    on_victim = [g for g in fresh if g.metrics["replica"] == VICTIM]
    return {"back": True, "back_s": back_s, "pushed_at_s": pushed_at, "pushed_while_down": pushed_while_down,
            "version": stats[VICTIM]["weight_version"], "served": len(on_victim), "requests": len(fresh),
            "served_at_version": all(set(g.weight_versions) == {2} for g in on_victim),
            "new_replica": engine.replicas[VICTIM] is not kill.victim}


def _state_dict(model_path: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()


async def _measure(engine, args, vocab: int) -> tuple[dict, dict, dict, dict]:
    await engine.update_weights(_state_dict(engine.model_path), version=1)
    await _rollout(engine, random_prompts(args.episodes, args.prompt_len, vocab, args.seed + 1), args, vocab, "warm-up")
    prompts = random_prompts(args.episodes, args.prompt_len, vocab, args.seed)
    plain = await _rollout(engine, prompts, args, vocab, "plain")
    kill = _Kill(engine, turn=max(1, args.turns // 2), tag="killed")  # a middle turn: pinned by then
    killed = await _rollout(engine, prompts, args, vocab, "killed", kill)
    counters = engine.metrics()
    return plain, killed, await _recovery(engine, kill, args, vocab), {**counters, "held": kill.held}


def run_kill(path: Path, replicas: int, args) -> int:
    """Both sides and the recovery on one ReplicatedEngine of `replicas` replicas; prints the figures. Returns 1
    when an episode was lost or the replica did not come back on the newest weights."""
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.replica_actor import start_replicas

    config = EngineConfig(max_batch_size=args.max_batch_size, num_threads=1, replicas=replicas,
                          max_model_len=args.prompt_len + args.turns * (args.tokens + OBSERVATION_TOKENS) + 1)
    engine = start_replicas(path, config)

    async def go():
        try:
            return await _measure(engine, args, vocab_size(path))
        finally:
            await engine.close()

    plain, killed, back, counters = asyncio.run(go())
    reference = plain["outputs"]
    full = args.turns * args.tokens
    print(f"\n{'side':22s} {'wall s':>7s} {'complete':>9s} {'lost':>5s} {'episodes retried':>17s} "
          f"{'requests retried':>17s}  same tokens")
    lost_total = 0
    for label, side in (("no kill", plain), (f"replica {VICTIM} killed", killed)):
        outputs = side["outputs"]
        lost = sum(o is None for o in outputs)
        lost_total += lost
        complete = sum(o is not None and len(o) == full for o in outputs)
        same = sum(o == r for o, r in zip(outputs, reference))
        print(f"{label:22s} {side['wall_s']:7.2f} {complete:>5d}/{len(outputs):<3d} {lost:5d} "
              f"{side['episodes_retried']:17d} {side['requests_retried']:17d}  {same}/{len(reference)}")
    print(f"replica {VICTIM} died holding {counters['held']} requests; engine counters: replica_retries "
          f"{counters['engine/replica_retries']:g}, replica_restarts {counters['engine/replica_restarts']:g}")
    if not back["back"]:
        print(f"recovery: replica {VICTIM} did not come back: {back['why']}")
        return 1
    print(f"recovery: replica {VICTIM} back {back['back_s']:.2f} s after the kill, serving weight version "
          f"{back['version']} (version 2 pushed {back['pushed_at_s']:.2f} s after the kill, "
          f"{'while it restarted' if back['pushed_while_down'] else 'after it was back'}); then it served "
          f"{back['served']} of {back['requests']} fresh requests, "
          f"{'every token at version 2' if back['served_at_version'] else 'SOME TOKENS NOT AT VERSION 2'}")
    ok = lost_total == 0 and back["version"] == 2 and back["served_at_version"] and back["new_replica"]
    return 0 if ok else 1


__all__ = ["run_kill"]
