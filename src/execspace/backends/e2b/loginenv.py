"""What a program inherits from its sandbox: the environment of the template's login shell.

E2B's envd starts every command as ``bash -l -c``: the login shell's environment (the service's variables, then
``/etc/profile`` and the user's login files: the template's ``PATH``, a runtime environment's ``VIRTUAL_ENV``) is
what ``commands.run`` sees, so it is what this backend's programs inherit too, where every other backend's inherit
the host's: the engine's :class:`~execspace.envpolicy.EnvPolicy` picks from it as it picks from a host's (the
core set by default, everything with ``inherit="all"``, nothing with ``inherit="none"`` or ``clean_env``), its
secret-looking names left out. ``PATH`` and ``VIRTUAL_ENV`` are the template's own and always come (unless the run
sets them): without them a program is not in the template's stack. The values are the login shell's own at the run's
start: each becomes a word of the run's ``env -i`` that the shell expands, so nothing is read ahead of the run.
A variable bash sets for itself when its environment lacks it (``SHELL``) is forgotten first (``FORGET_BASHS_OWN``).
Which names exist is known only for the core set; ``inherit="all"`` reads the login shell's names once per sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...envpolicy import CORE_VARIABLES, MINIMAL_PATH, EnvPolicy

__all__ = ["FORGET_BASHS_OWN", "LIST_NAMES", "TEMPLATE_VARIABLES", "inherited_words", "needs_login_names"]

#: The template's own variables, which a program always inherits (``PATH`` falls back to the minimal one).
TEMPLATE_VARIABLES = ("PATH", "VIRTUAL_ENV")
#: Lists the names a login shell exports (a builtin: the one process is the ``sh -c`` envd starts).
LIST_NAMES = "compgen -e"
#: Forgets what bash set for itself, unexported, when its environment lacked it (``SHELL``): ``commands.run`` does
#: not show it, so a program does not inherit it (its attributes hold ``x`` when it is exported).
FORGET_BASHS_OWN = "[[ ${SHELL@a} == *x* ]] || unset -v SHELL"


def needs_login_names(policy: EnvPolicy, clean: bool) -> bool:
    """Whether the run's inheritance depends on names only the sandbox knows (``inherit="all"``)."""
    return policy.inherit == "all" and not clean


def inherited_words(policy: EnvPolicy, clean: bool, login_names: Iterable[str] | None, ours: Iterable[str] = ()) -> str:
    """The words of ``env -i`` (with a leading space each) that pass the login shell's variables on: its
    ``TEMPLATE_VARIABLES`` and those the policy inherits of ``login_names`` (None: the core set), less ``ours``
    (what the run sets itself), each present only when the shell has it."""
    names = login_names if login_names is not None else sorted(CORE_VARIABLES)
    skip = set(ours)
    words = []
    for name in dict.fromkeys([*TEMPLATE_VARIABLES, *policy.inherited_names(names, clean=clean)]):
        if name in skip:
            continue
        if name == "PATH":
            words.append(f' "PATH=${{PATH:-{MINIMAL_PATH}}}"')
        else:
            words.append(f' ${{{name}+"{name}=${name}"}}')
    return "".join(words)
