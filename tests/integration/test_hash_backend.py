# SPDX-License-Identifier: Apache-2.0
"""Block-key hashing backends end to end (issue 12, docs/hashing.md): `auto` on a machine
without a GPU says so once and hashes on the CPU; `cuda` without one refuses to start; the
`standin` backend sends every request through the GPU path (the batcher's queue, its thread,
the completion on the submitting loop, the asynchronous decision) with the CPU in the device's
place, and its keys are the CPU's: a prefix learned through the batcher is matched by route
explain, which hashes on the CPU, and followed by the next request."""

import shutil
import subprocess
import threading

import pytest

from conftest import binary
from gwhelpers import CHAT, http
from test_routing import chat, explain, matched_by_worker, send, text, workers


def gpu_present():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


no_gpu = pytest.mark.skipif(gpu_present(), reason="a GPU is present: the CPU-only paths differ")


@no_gpu
def test_auto_without_a_gpu_hashes_on_the_cpu_and_says_why(simworker, kvgate):
    ws = workers(simworker, 2, kv_blocks=4096)
    gw = kvgate(*ws)
    lines = [l for l in gw.log().splitlines() if "hash backend:" in l]
    assert len(lines) == 1, gw.log()
    assert "hash backend: cpu (no usable GPU: " in lines[0], lines[0]
    before = gw.metric("kvgate_hash_jobs_total", backend="cpu")
    body = chat(ws[0].model, text(1, 3000), "q")
    for _ in range(3):
        send(gw, body)
    assert gw.metric("kvgate_hash_jobs_total", backend="cpu") == before + 3
    assert explain(gw, body)["hash_backend"] == "cpu"


@no_gpu
def test_cuda_without_a_gpu_refuses_to_start(tmp_path):
    p = subprocess.run([str(binary("kvgate")), "--hash-backend", "cuda", "--listen",
                        "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--state",
                        str(tmp_path / "state"), "--auth", "open"],
                       capture_output=True, timeout=30, cwd=tmp_path)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode != 0, out
    assert "hash.backend cuda: " in out, out


def test_bad_backend_is_refused_with_its_field(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"hash": {"backend": "gpu"}}')
    p = subprocess.run([str(binary("kvgate")), "-c", str(cfg), "--check-config"],
                       capture_output=True, timeout=30)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode != 0 and "hash.backend: must be auto, cpu, cuda or standin" in out, out
    p = subprocess.run([str(binary("kvgate")), "--hash-backend", "gpu", "--check-config"],
                       capture_output=True, timeout=30)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode != 0 and "--hash-backend: must be auto, cpu, cuda or standin" in out, out


def standin_gateway(simworker, kvgate, n=3):
    ws = workers(simworker, n, kv_blocks=4096)
    # crossover 1: every job with a full block goes through the batcher.
    gw = kvgate(*ws, config={"hash": {"backend": "standin", "crossover_bytes": 1}})
    assert "hash backend: standin" in gw.log(), gw.log()
    return ws, gw


def test_standin_keys_are_the_cpus_and_affinity_holds(simworker, kvgate):
    ws, gw = standin_gateway(simworker, kvgate)
    model = ws[0].model
    for doc in range(4):
        system = text(100 + doc, 4000)
        home, cached = send(gw, chat(model, system, "first"))
        # Route explain hashes on the CPU: it finds the keys the batcher recorded.
        ex = explain(gw, chat(model, system, "second"))
        blocks = ex["prefix"]["blocks"]
        assert blocks >= 4000 // 64
        assert matched_by_worker(ex)[home] >= 4000 // 64 - 1, ex
        again, cached = send(gw, chat(model, system, "second"))
        assert again == home and cached > 0
    assert gw.metric("kvgate_hash_jobs_total", backend="standin") >= 8
    assert gw.metric("kvgate_hash_batch_jobs_count") >= 1


def test_standin_under_concurrent_load_loses_nothing(simworker, kvgate):
    ws, gw = standin_gateway(simworker, kvgate)
    model = ws[0].model
    errors, homes = [], {}
    lock = threading.Lock()

    def client(c):
        try:
            for i in range(15):
                doc = (c * 15 + i) % 6
                body = chat(model, text(200 + doc, 2500), f"turn {i}")
                r = http.post(gw.url + CHAT, json=body)
                if r.status_code != 200:
                    errors.append(r.text)
                    continue
                with lock:
                    homes.setdefault(doc, set()).add(r.headers["x-kvgate-worker"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert sum(1 for _ in homes) == 6
    assert gw.metric("kvgate_hash_jobs_total", backend="standin") >= 100


def test_standin_clients_gone_while_their_keys_are_hashed(simworker, kvgate):
    """Clients that give up at once leave exchanges whose jobs are queued or on the device: the
    decision is cancelled with its ticket, the batcher finishes the job for nobody, and the
    gateway goes on serving (teardown checks the exit status: under ASan, no leak and no use
    after free)."""
    ws, gw = standin_gateway(simworker, kvgate, n=2)
    model = ws[0].model
    body = chat(model, text(300, 6000), "q")

    def impatient():
        for _ in range(40):
            try:
                http.post(gw.url + CHAT, json=body, timeout=0.002)
            except Exception:  # noqa: BLE001 - giving up is the point
                pass

    threads = [threading.Thread(target=impatient) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for _ in range(5):
        send(gw, body)
    assert gw.alive()
