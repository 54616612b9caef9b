# SPDX-License-Identifier: Apache-2.0
"""Test oracles from npm, installed into a scratch folder, never into the product.

    mods = npm_oracle.node_modules("@huggingface/jinja@0.5.11")
    out = npm_oracle.run_node(script_path, args=[...], stdin=b"...", packages=[...])

Packages are named with exact versions so that an oracle cannot change under a test. Each set of
packages gets its own folder under $KVGATE_NPM_DIR (default: build-npm/ in the repository, which
git ignores), keyed by the set, installed once and reused while its package.json matches (one
folder for every build directory, so that the gcc and the sanitizer runs of CI install once);
scripts/lib.sh installs Node.js and npm when the machine has none. The npm registry is reachable from every machine that
runs these tests (CI included), so a failed install fails the test rather than skipping it.
"""
import fcntl
import hashlib
import json
import os
import pathlib
import subprocess

import pytest

from conftest import REPO_ROOT

INSTALL_TIMEOUT_S = 600


def _root() -> pathlib.Path:
    env = os.environ.get("KVGATE_NPM_DIR")
    return pathlib.Path(env) if env else REPO_ROOT / "build-npm"


def node_modules(*packages: str) -> pathlib.Path:
    """Install `name@version` packages (exact versions) into their scratch folder once; return
    the folder's node_modules. Fails the test, with npm's output, when the install fails."""
    for p in packages:
        name, _, version = p.rpartition("@")
        if not name or not version or not version[0].isdigit():
            raise ValueError(f"npm oracle {p!r}: name it with an exact version, name@1.2.3")
    key = hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()[:16]
    folder = _root() / key
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "kvgate-test-oracles", "private": True,
                "dependencies": {p.rpartition("@")[0]: p.rpartition("@")[2] for p in packages}}
    wanted = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / ".installed"
        if done.exists() and done.read_text() == wanted:
            return folder / "node_modules"
        (folder / "package.json").write_text(wanted)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=folder, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if r.returncode != 0:
            pytest.fail(f"npm install {' '.join(packages)} failed in {folder}:\n"
                        f"{r.stdout}\n{r.stderr}")
        done.write_text(wanted)
    return folder / "node_modules"


def run_node(script, *, packages, args=(), stdin: bytes = b"", timeout: float = 600) -> bytes:
    """Run a Node.js script with the packages' folder as NODE_PATH, so that `require` finds
    them (an ES module script uses `module.createRequire`); return its stdout. A non-zero exit
    fails the test with the script's stderr."""
    mods = node_modules(*packages)
    env = dict(os.environ, NODE_PATH=str(mods))
    r = subprocess.run(["node", str(script), *map(str, args)], input=stdin, env=env,
                       capture_output=True, timeout=timeout)
    if r.returncode != 0:
        pytest.fail(f"node {script} exited {r.returncode}:\n{r.stderr.decode(errors='replace')}")
    return r.stdout
