"""`bench leaderboard` itself: its options as one line each when wrong, the server in a real process, and the
Hugging Face Space export (from a Hub store and from a local one)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genshift.cli import main
from tests.boardkit import board, fresh_caches, grid, key_of  # noqa: F401

NO_TORCH = r"""
import json, sys
from importlib import metadata as md
from pathlib import Path

from packaging.requirements import Requirement

# what pip installs from the Space's requirements.txt (the pins and their dependencies): nothing else can be
# imported below, as in a Space built from it, so a missing pin fails here too
norm = lambda name: name.lower().replace("_", "-").replace(".", "-")
todo, installs = [Requirement(r).name for r in Path("requirements.txt").read_text().split()], set()
while todo:
    name = norm(todo.pop())
    if name not in installs:
        installs.add(name)
        todo += [r.name for r in map(Requirement, md.requires(name) or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
hidden = {m for m, ds in md.packages_distributions().items()
          if m != "genshift" and not {norm(d) for d in ds} & installs}


class NotInstalled:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [NotInstalled(f) for f in sys.meta_path]
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=120).run()
df = next((d.value for d in at.dataframe if list(d.value.columns)[0] == "rank"), None)
print(json.dumps({"exception": [str(e.value) for e in at.exception], "texts": [t.value for t in at.text],
                  "models": [] if df is None else df["model"].tolist(), "torch_hidden": "torch" in hidden,
                  "heavy": sorted({m.partition(".")[0] for m in sys.modules} & {"torch", "timm", "torchvision",
                                                                                   "datasets"})}))
"""


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from tests.fakehub import FakeHub

    with FakeHub() as h:
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # a fresh Space: nothing cached
        monkeypatch.setattr(constants, "ENDPOINT", h.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            h.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        yield h


def _space_card(out: Path) -> dict:
    import yaml

    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_export_space_from_a_hub_store_pins_it_and_installs_the_package(tmp_path, hub, capsys):
    from huggingface_hub import HfApi
    from streamlit.testing.v1 import AppTest

    root = board(tmp_path / "s", models=4)
    hub.create("dataset", "org/results")
    HfApi(endpoint=hub.endpoint).upload_folder(repo_id="org/results", repo_type="dataset", folder_path=str(root),
                                               ignore_patterns=[".*"])
    out = tmp_path / "space"
    capsys.readouterr()
    assert main(["leaderboard", "--results", "org/results", "--trusted-keys", f"{key_of(root)}.pub",
                 "--export-space", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"hf upload ORG/NAME {out} . --repo-type space" in printed and "huggingface-cli" not in printed
    sha = hub.repos[("dataset", "org/results")].refs["main"]
    card = _space_card(out)
    assert card["sdk"] == "streamlit" and card["app_file"] == "app.py" and "leaderboard" in card["tags"]
    import streamlit
    assert card["sdk_version"] == streamlit.__version__
    config = json.loads((out / "space.json").read_text())
    assert config["results"] == f"org/results@{sha}" and (out / config["trusted_keys"]).is_file()
    reqs = (out / "requirements.txt").read_text().split()
    assert all("==" in r for r in reqs) and any(r.startswith("streamlit==") for r in reqs)
    assert not any(r.startswith(("torch", "timm")) for r in reqs)
    (wheel,) = out.glob("genshift_bench-*.whl")  # the package, built from this checkout: no copied source
    assert [p.name for p in out.rglob("*.py")] == ["app.py"] and wheel.name in (out / "app.py").read_text()
    assert 'toolbarMode = "viewer"' in (out / ".streamlit" / "config.toml").read_text()
    at = AppTest.from_file(str(out / "app.py"), default_timeout=120).run()  # genshift-bench is installed here
    assert not at.exception and len(grid(at, "main")) == 6
    assert any(f"results store: org/results@{sha} |" in t.value for t in at.text)
    # the records came with the first view; a model's predictions are downloaded (and hashed) when drilled into
    from genshift.leaderboard.store import resolve_source
    snapshot = resolve_source(f"org/results@{sha}")[0]
    assert not list(snapshot.rglob("*.parquet")) and len(list(snapshot.rglob("verification.json"))) == 6
    drill = AppTest.from_file(str(out / "app.py"), default_timeout=120)
    drill.query_params["tab"], drill.query_params["model"] = "Model drilldown", "timm/tie_a.in1k"
    drill.run()
    assert not drill.exception and "class" in next(d.value for d in drill.dataframe if "class" in d.value.columns)
    assert grid(drill, "main")["model"].tolist() == grid(at, "main")["model"].tolist()  # still verified: intact
    assert {p.parent.parent.name for p in snapshot.rglob("*.parquet")} == {"timm--tie_a.in1k"}


def test_export_space_from_a_local_store_copies_the_results_in(tmp_path):
    from streamlit.testing.v1 import AppTest

    root = board(tmp_path / "s", models=2)
    (root / "imagenet-star" / "timm--tie_a.in1k" / "diagnose.json").write_text("{}")
    out = tmp_path / "space"
    assert main(["leaderboard", "--results", str(root), "--trusted-keys", f"{key_of(root)}.pub",
                 "--export-space", str(out)]) == 0
    assert json.loads((out / "space.json").read_text())["results"] == "results"
    copied = sorted(p.relative_to(out / "results").as_posix() for p in (out / "results").rglob("*") if p.is_file())
    assert copied == sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert "the results copied into this Space" in (out / "README.md").read_text()
    at = AppTest.from_file(str(out / "app.py"), default_timeout=120).run()
    assert not at.exception and grid(at, "main")["verified"].eq("✓ verified").all() and len(grid(at, "main")) == 4
    assert main(["leaderboard", "--results", str(root), "--export-space", str(out)]) != 0  # never into a full folder


@pytest.mark.subprocess
def test_the_exported_space_imports_no_torch(tmp_path):
    root = board(tmp_path / "s", models=2)
    out = tmp_path / "space"
    assert main(["leaderboard", "--results", str(root), "--trusted-keys", f"{key_of(root)}.pub",
                 "--export-space", str(out)]) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run([sys.executable, "-c", NO_TORCH], cwd=out, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert not shown["exception"] and len(shown["models"]) == 4 and shown["heavy"] == [], shown
    assert shown["torch_hidden"]  # installed here, not importable there: the hiding ran


def test_bad_options_are_one_line(tmp_path, capsys):
    import socket

    root = board(tmp_path / "s", models=2, signed=False)
    for argv, needle in ((["--results", str(tmp_path / "nope")], "does not exist"),
                         (["--results", str(root), "--trusted-keys", str(tmp_path / "nope.pub")], "trusted keys file"),
                         (["--results", str(root), "--suites", str(tmp_path / "nowhere")], "does not exist"),
                         (["--results", str(root), "--port", "0"], "--port must be")):
        assert main(["leaderboard", *argv]) != 0
        err = capsys.readouterr().err
        assert err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1, err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["leaderboard", "--results", str(root), "--port", str(port)]) != 0
        assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_trusted_suites_reject_entries_on_other_suite_data(tmp_path, toy_suite):
    from genshift.fsutil import sha256_file
    from genshift.leaderboard.space import _copy_trusted_manifests
    from genshift.leaderboard.store import load_store

    root = board(tmp_path / "s", models=3)
    assert len(load_store(str(root)).entries) == 5  # no trusted suites given: any suite data
    strict = load_store(str(root), suites=[str(toy_suite)])
    assert not strict.entries and len(strict.rejected) == 5
    assert all("does not trust" in e.reason for e in strict.rejected)
    _copy_trusted_manifests(toy_suite, tmp_path / "space-suites")  # a Space gets the manifests only, byte for byte
    (copied,) = (tmp_path / "space-suites").iterdir()
    assert copied.name == f"{sha256_file(toy_suite / 'manifest.json')}.json"
    assert copied.read_bytes() == (toy_suite / "manifest.json").read_bytes()


def test_leaderboard_serves_in_viewer_mode():
    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS

    assert STREAMLIT_FLAGS[STREAMLIT_FLAGS.index("--client.toolbarMode") + 1] == "viewer"
    assert STREAMLIT_FLAGS[STREAMLIT_FLAGS.index("--client.disableDataExport") + 1] == "true"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_bench_leaderboard_is_the_server_and_stops_on_signals(tmp_path, sig):
    """`bench leaderboard` in a real process serves the page itself (no child process); after the signal the
    process is gone and the port can be taken again at once."""
    import socket
    import urllib.request

    from genshift.cli.leaderboard_cmd import port_free
    from tests.hubtools import free_port

    root = board(tmp_path / "s", models=2, signed=False)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    bench = subprocess.Popen([sys.executable, "-m", "genshift", "leaderboard", "--results", str(root), "--port",
                              str(port)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    assert r.read() == b"ok"
                break
            except OSError:
                assert bench.poll() is None and time.time() < deadline, "the server never came up"
                time.sleep(0.3)
        assert not Path(f"/proc/{bench.pid}/task/{bench.pid}/children").exists() or \
            not Path(f"/proc/{bench.pid}/task/{bench.pid}/children").read_text().split()
        viewer = socket.create_connection(("127.0.0.1", port))  # an open connection: TIME_WAIT after the stop
        viewer.sendall(b"GET /_stcore/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in viewer.recv(4096)
        bench.send_signal(getattr(signal, sig))
        bench.wait(timeout=60)
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
        assert port_free("127.0.0.1", port)
        viewer.close()
    finally:
        if bench.poll() is None:
            bench.kill()
