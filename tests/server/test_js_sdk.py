"""The official JavaScript SDK against the server, a smoke set (js/smoke.mjs) and the edges of the surface
(js/surface.mjs): EXECSPACE_E2B_JS names a directory where `npm install e2b` was run (./run test makes one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import Server

JS_SDK = os.environ.get("EXECSPACE_E2B_JS", "")


@pytest.mark.skipif(not JS_SDK, reason="set EXECSPACE_E2B_JS to a directory with `npm install e2b` done")
@pytest.mark.parametrize("name", ["smoke", "surface"])
def test_js_sdk_smoke(name: str, e2b_server: Server, tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    script = Path(JS_SDK) / f"{name}-{os.getpid()}.mjs"  # beside its node_modules, so that `import 'e2b'` resolves
    shutil.copy(Path(__file__).with_name("js") / f"{name}.mjs", script)
    try:
        env = {**os.environ, **e2b_server.sdk_env(), "EXECSPACE_MACHINE": "1" if os.geteuid() == 0 else "0"}
        run = subprocess.run([node, str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        script.unlink()
    version = (Path(JS_SDK) / "node_modules" / "e2b" / "package.json").read_text().split('"version": "')[1][:12]
    assert run.returncode == 0 and run.stdout.strip() == "ok", f"e2b (JS) {version}: {run.stdout}{run.stderr}"
