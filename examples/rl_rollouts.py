"""RL-style rollouts on a cluster: one prepared sandbox, forked N times on its node, a short episode in each.

    execspace serve --ray auto --host 0.0.0.0 --api-key "$E2B_API_KEY" --max-sandboxes 256   # a front door
    python examples/rl_rollouts.py --api-url http://FRONT_DOOR:3000 --rollouts 200           # E2B_API_KEY set

The library path to a cluster is the e2b backend pointed at a front door (docs/cluster.md): `open_engine("e2b",
api_url=..., ...)`, as for one host. The task (a grader and its cases) is written once into one sandbox and
snapshotted; every rollout is a fork of that snapshot (made on the snapshot's node, so all the forks share one
node: its `--max-sandboxes` must hold them), whose episode writes the policy's answer and runs the grader, and
which is killed as soon as its episode ends. The reward is the fraction of cases passed; a hung answer is stopped
by the run's timeout (reward 0). The engine is opened per turn, so every sandbox it made is killed when it closes,
also when an episode fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence

import execspace
from execspace import PutFile, RunProgramSpec, SupportsSnapshots, Workspace

GRADER = """\
import json, sys
sys.path.insert(0, ".")
cases = json.load(open("cases.json"))
from solution import solve
passed = sum(solve(list(c["input"])) == c["output"] for c in cases)
print(json.dumps({"passed": passed, "total": len(cases)}))
"""
CASES = [
    {"input": [3, 1, 2], "output": [1, 2, 3]},
    {"input": [2, 2, 1], "output": [1, 2]},
    {"input": [], "output": []},
    {"input": [5, 5, 5, 5], "output": [5]},
]
#: What the "policy" answers (the body of ``solve(xs)``) and how often: a real policy is a model sampling code.
ANSWERS = {
    "sorted(set(xs))": ("return sorted(set(xs))", 4),  # every case: reward 1.00
    "sorted(xs)": ("return sorted(xs)", 3),  # the cases without duplicates: 0.50
    "xs": ("return xs", 2),  # only the empty one: 0.25
    "loops forever": ("while True: pass", 1),  # stopped by the episode's timeout: 0.00
}
#: The episode's run deadline (seconds): a hung answer costs this much of its slot, no more.
EPISODE_TIMEOUT = 2.0
#: Forks one call asks for at most (the engine's limit per fork call).
FORK_BATCH = 100


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api-url", default=os.environ.get("E2B_API_URL"), help="the front door (default $E2B_API_URL)")
    p.add_argument("--api-key", default=os.environ.get("E2B_API_KEY"), help="its API key (default $E2B_API_KEY)")
    p.add_argument("--rollouts", type=int, default=200, help="forks of the prepared sandbox (default 200)")
    p.add_argument("--concurrency", type=int, default=16, help="episodes running at once (default 16)")
    p.add_argument("--seed", type=int, default=0, help="the policy's seed: the same seed, the same answers")
    p.add_argument("--template", default="base", help="the sandboxes' template (default base)")
    return p


async def rollouts(args: argparse.Namespace) -> dict[str, list[float]]:
    """Every rollout's reward, by the answer its policy gave."""
    policy = random.Random(args.seed)  # noqa: S311 - a policy's sampling, not a secret
    answers = policy.choices(list(ANSWERS), [weight for _, weight in ANSWERS.values()], k=args.rollouts)
    connection = {"api_url": args.api_url, "sandbox_url": args.api_url, "api_key": args.api_key}
    async with execspace.open_engine("e2b", **connection, template=args.template, persistence="turn") as engine:
        manager = engine.manager
        if not isinstance(manager, SupportsSnapshots):
            raise SystemExit(f"the service at {args.api_url} keeps no snapshots: rollouts fork from one")
        started = time.monotonic()
        prepared = await engine.manager.create_workspace("rl/task")
        files = [PutFile("work/task/grade.py", GRADER), PutFile("work/task/cases.json", json.dumps(CASES))]
        await engine.fs.put_files(prepared, files)
        snapshot = await manager.snapshot(prepared)
        await manager.cleanup(prepared)  # the snapshot holds its files: the forks start from it
        say(f"prepared {prepared.id} in {time.monotonic() - started:.2f} s")

        started = time.monotonic()
        forks: list[Workspace] = []
        for batch in batches([f"rl/rollout-{i}" for i in range(args.rollouts)], FORK_BATCH):
            forks += await manager.fork(snapshot, len(batch), batch)
        say(f"forked {len(forks)} in {time.monotonic() - started:.2f} s")

        started = time.monotonic()
        slots = asyncio.Semaphore(args.concurrency)

        async def episode(ws: Workspace, answer: str) -> float:
            async with slots:
                try:
                    return await run_episode(engine, ws, answer)
                finally:
                    await manager.cleanup(ws)  # its slot on the node and its connection freed for the next

        rewards = await asyncio.gather(*(episode(ws, a) for ws, a in zip(forks, answers, strict=True)))
        say(f"ran {len(rewards)} episodes ({args.concurrency} at a time) in {time.monotonic() - started:.2f} s")
        await manager.remove_snapshot(snapshot)
    by_answer: dict[str, list[float]] = collections.defaultdict(list)
    for answer, reward in zip(answers, rewards, strict=True):
        by_answer[answer].append(reward)
    return by_answer


async def run_episode(engine: execspace.BaseEngine, ws: Workspace, answer: str) -> float:
    """One episode: the policy's answer written, the grader run, its score as the reward."""
    await engine.fs.put_files(ws, [PutFile("work/task/solution.py", f"def solve(xs):\n    {ANSWERS[answer][0]}\n")])
    spec = RunProgramSpec("python3", ["grade.py"], cwd="work/task", timeout=EPISODE_TIMEOUT)
    done = await engine.runner.run_program(ws, spec)
    if done.timed_out or done.exit_code != 0:
        return 0.0
    score = json.loads(done.stdout)
    return float(score["passed"]) / float(score["total"])


def batches(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def say(line: str) -> None:
    print(line, flush=True)


async def main() -> int:
    args = parser().parse_args()
    if not args.api_url or not args.api_key:
        raise SystemExit("give the front door: --api-url and --api-key (or E2B_API_URL and E2B_API_KEY)")
    started = time.monotonic()
    by_answer = await rollouts(args)
    for answer, rewards in sorted(by_answer.items(), key=lambda item: -sum(item[1]) / len(item[1])):
        say(f"  {answer:<16} x{len(rewards):<4} reward {sum(rewards) / len(rewards):.2f}")
    every = [r for rewards in by_answer.values() for r in rewards]
    say(f"{len(every)} rollouts, mean reward {sum(every) / len(every):.3f}, in {time.monotonic() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
