"""Several turns on the same files, one of them running a skill.

    python examples/multi_turn_skill.py              # the scripted model: no key, no network

Turn 1 writes notes into the workspace; turn 2 runs the `wordcount` skill (examples/skills/) on them; turn 3
reads the skill's table back. One transcript, one workspace: what a turn leaves, the next one finds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import execspace
from execspace.agent import Agent, ChatCompletions, workspace_tools
from execspace.testing.chatmodel import ScriptedChatServer, ScriptedReply, last_tool_result, text, tool_call
from execspace.tools import SkillLibrary, SkillListTool, SkillRunTool

SKILLS = Path(__file__).resolve().parent / "skills"
NOTES = "the sandbox keeps the files\nthe agent reads the files again\n"
TURNS = [
    "Write these notes to notes.txt in your working directory:\n" + NOTES,
    "Count the words of notes.txt with a skill.",
    "Which word is the most frequent?",
]


def scripted_replies() -> list[ScriptedReply]:
    return [
        tool_call("workspace_exec", {"command": "cat > notes.txt", "stdin": NOTES}),
        text("Saved notes.txt."),
        tool_call("skill_list", {}),
        tool_call("skill_run", {"skill": "wordcount", "script": "scripts/count.py", "args": ["notes.txt"]}),
        lambda request: text(last_tool_result(request)["stdout"].strip()),
        tool_call("workspace_exec", {"command": "sed -n 2p ../out/wordcount.csv"}),
        lambda request: text("The most frequent: " + last_tool_result(request)["stdout"].strip()),
    ]


async def main(args: argparse.Namespace) -> int:
    workspace = "examples/notes/session-1"
    library = SkillLibrary([SKILLS])
    with ScriptedChatServer(scripted_replies()) as server:
        base_url, model_name = (args.base_url, args.model) if args.base_url else (server.base_url, "scripted")
        async with (
            execspace.open_engine(args.backend, host_roots=[str(SKILLS)]) as engine,  # skills are copied from here
            workspace_tools(engine, workspace) as tools,
            ChatCompletions(base_url, model=model_name) as model,
        ):
            ws = await engine.manager.create_workspace(workspace)
            skill_tools = [SkillListTool(library), SkillRunTool(library, engine, ws)]
            agent = Agent(model, [*tools, *skill_tools], system="Work in the workspace with the tools.")
            answers = []
            for prompt in TURNS:
                answers.append(await agent.run(prompt))
                print(f"> {prompt.splitlines()[0]}\n{answers[-1]}\n")
            await engine.manager.cleanup(ws)
    print(f"{len(agent.transcript)} messages in the transcript")
    return 0 if answers[-1].startswith("The most frequent: the,") or args.base_url else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=None, help="default: the safest backend that works here")
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: the scripted model)")
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="unused: every example takes it")
    sys.exit(asyncio.run(main(parser.parse_args())))
