"""envd's Connect services (``process.Process``, ``filesystem.Filesystem``) as execspace serve speaks them: the
protobuf messages (``*_pb``, for the protobuf-py runtime) and the Connect service stubs (``*_connect``, for
connectrpc), generated from the ``.proto`` files beside them, which describe E2B's envd wire protocol.

The generated modules are committed and never edited by hand: after a change to a ``.proto`` file, run
``buf generate`` in this directory (``buf.gen.yaml`` names the generators; their versions are pinned in
pyproject.toml's dev extra, and ``tests/server/test_envd_stubs.py`` fails when the committed modules differ from
what they generate).
"""
