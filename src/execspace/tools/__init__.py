"""Agent-facing tools built on the Engine: workspace_exec, the command policy, skills, execute_code."""

from .envscrub import scrub as scrub_env
from .execute_code import ExecuteCodeTool
from .response import FencedCodeProcessor, ProcessorEvent, ProcessorResult
from .schema import InvalidArguments, Tool, ToolArguments, ToolSpec, check_arguments, decode_arguments, error_result
from .sessions import UnknownSession
from .shellpolicy import CommandPolicy, CommandRejected, ParsedCommand, describe_command_policy, parse_command
from .skills import Skill, SkillLibrary, SkillListTool, SkillNotFound, SkillProblem, SkillRunTool, StagedSkill
from .workspace_exec import CommandChecker, WorkspaceExecTool
from .workspace_io import FileChange, WorkspaceIO

__all__ = [
    "CommandChecker",
    "CommandPolicy",
    "CommandRejected",
    "ExecuteCodeTool",
    "FencedCodeProcessor",
    "FileChange",
    "InvalidArguments",
    "ParsedCommand",
    "ProcessorEvent",
    "ProcessorResult",
    "Skill",
    "SkillLibrary",
    "SkillListTool",
    "SkillNotFound",
    "SkillProblem",
    "SkillRunTool",
    "StagedSkill",
    "Tool",
    "ToolArguments",
    "ToolSpec",
    "UnknownSession",
    "WorkspaceExecTool",
    "WorkspaceIO",
    "check_arguments",
    "decode_arguments",
    "describe_command_policy",
    "error_result",
    "parse_command",
    "scrub_env",
]
