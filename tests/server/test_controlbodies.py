"""The control plane's request bodies parsed once into typed values: a field of the wrong type or out of range is
a BadRequest in the words E2B's SDKs show, before any handler runs."""

from __future__ import annotations

import pytest

from execspace.server.controlbodies import (
    BadRequest,
    ConnectBody,
    CreateBody,
    ForkBody,
    NetworkBody,
    PauseBody,
    SnapshotBody,
    TimeoutBody,
    Timeouts,
)

TIMEOUTS = Timeouts(default=300, maximum=3600)
TEMPLATES = ("base", "code-interpreter-v1")


def _create(body: dict[str, object], *, v1: bool = False) -> CreateBody:
    return CreateBody.parse(body, v1=v1, templates=TEMPLATES, timeouts=TIMEOUTS)


def test_a_create_body_is_read_into_its_fields() -> None:
    body = _create(
        {
            "templateID": "base",
            "timeout": 60,
            "metadata": {"a": "b"},
            "envVars": {"X": "1"},
            "autoPause": True,
            "autoResume": {"enabled": True},
            "allow_internet_access": False,
            "network": {"allowOut": ["example.com"]},
        }
    )
    assert body == CreateBody(
        template="base",
        timeout=60,
        metadata={"a": "b"},
        env_vars={"X": "1"},
        auto_pause=True,
        auto_resume=True,
        allow_internet_access=False,
        network={"allowOut": ["example.com"]},
    )
    assert _create({"templateID": "base"}) == CreateBody(template="base", timeout=300)
    assert not _create({"templateID": "base", "secure": False}, v1=True).secure
    assert _create({"templateID": "base", "secure": False}).secure  # v2 sandboxes are always secured
    assert _create({"templateID": "base", "autoPauseMemory": False}).files_only_pause


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "templateID must be one of base, code-interpreter-v1 or a snapshot id, got None"),
        ({"templateID": 5}, "templateID must be one of base, code-interpreter-v1 or a snapshot id, got 5"),
        ({"templateID": "base", "timeout": -1}, "timeout must be a whole number of seconds, 0 or more, got -1"),
        ({"templateID": "base", "timeout": True}, "timeout must be a whole number of seconds, 0 or more, got True"),
        ({"templateID": "base", "timeout": 3601}, "timeout 3601s is above this server's maximum of 3600s"),
        ({"templateID": "base", "metadata": {"a": 1}}, "metadata must be an object of strings"),
        ({"templateID": "base", "envVars": ["X"]}, "envVars must be an object of strings"),
        ({"templateID": "base", "autoPause": "yes"}, "autoPause must be a boolean, got 'yes'"),
        ({"templateID": "base", "autoResume": {"enabled": 1}}, 'autoResume must be {"enabled": <boolean>}'),
        ({"templateID": "base", "allow_internet_access": "no"}, "allow_internet_access must be a boolean"),
        ({"templateID": "base", "network": ["x"]}, r"network must be an object \(allowOut, denyOut, ...\)"),
    ],
)
def test_a_create_body_of_a_wrong_type_is_refused_in_e2bs_words(body: dict[str, object], says: str) -> None:
    with pytest.raises(BadRequest, match=f"^{says}"):
        _create(body)


def test_the_other_bodies() -> None:
    assert ConnectBody.parse({}, TIMEOUTS) == ConnectBody(None, files_only=False)
    assert ConnectBody.parse({"timeout": 10, "memory": False}, TIMEOUTS) == ConnectBody(10, files_only=True)
    assert TimeoutBody.parse({"timeout": 10}, TIMEOUTS) == TimeoutBody(10)
    assert PauseBody.parse({"memory": False}).files_only and not PauseBody.parse({}).files_only
    assert SnapshotBody.parse({"name": "n", "memory": 1}) == SnapshotBody("n", memory=True)
    assert ForkBody.parse({}, TIMEOUTS) == ForkBody(1, 300)
    assert NetworkBody.parse({"allow_internet_access": True, "allowOut": ["a"]}) == NetworkBody(
        True, {"allowOut": ["a"]}
    )
    assert NetworkBody.parse({}) == NetworkBody(None, {})
    for parse, says in [
        (lambda: TimeoutBody.parse({}, TIMEOUTS), "timeout must be a whole number of seconds, 0 or more, got None"),
        (
            lambda: ConnectBody.parse({"timeout": "1"}, TIMEOUTS),
            "timeout must be a whole number of seconds, 0 or more, got '1'",
        ),
        (lambda: SnapshotBody.parse({"name": 3}), "name must be a string, got 3"),
        (lambda: ForkBody.parse({"count": 101}, TIMEOUTS), "count must be an integer from 1 to 100, got 101"),
        (lambda: ForkBody.parse({"count": True}, TIMEOUTS), "count must be an integer from 1 to 100, got True"),
        (lambda: NetworkBody.parse({"allow_internet_access": 1}), "allow_internet_access must be a boolean"),
    ]:
        with pytest.raises(BadRequest) as info:
            parse()
        assert str(info.value) == says
