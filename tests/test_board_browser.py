"""The board in real headless Chromium, served by `bench leaderboard`: what a visitor sees, a deep link into a
model's pictures, and a swapped predictions file losing its rank without a restart. Every wait is on a
condition of the page (tests/browser.py), never on time."""

import json
import shutil

import numpy as np
import pytest

from genshift.identity import folder_name
from tests.boardkit import board, chrome, common, key_of
from tests.synthetic_store import write_model

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.subprocess,
              pytest.mark.skipif(not chrome(), reason="Debian chromium + chromium-driver are not installed")]


def _fake_diagnose(run_dir, model_id):
    """A diagnose.json as `bench diagnose` writes it (one class, thumbnails of real JPEGs)."""
    import base64
    import io

    from PIL import Image

    def jpeg(color):
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), color).save(buf, format="JPEG")
        return base64.b64encode(buf.getvalue()).decode()
    classes = [{"label": 207, "name": "golden retriever", "wnid": "n02099601", "status": "ok", "n": 40, "n_errors": 12,
                "strength": 0.81, "null_p95": 0.55, "null_mean": 0.5, "hardest": ["h1", "h2"], "easiest": ["e1"],
                "hard_captions": [["a photo of a canine in the snow", -1.0]], "easy_captions": []}]
    report = {"kind": "genshift-diagnose", "schema_version": 1, "model": model_id, "classes": classes,
              "thumbnails": {"h1": jpeg("red"), "h2": jpeg("blue"), "e1": jpeg("green")}}
    (run_dir / "diagnose.json").write_text(json.dumps(report))


@pytest.fixture
def page(tmp_path):
    """A board served by `bench leaderboard` and a Chromium to look at it: ``(root, url, driver, server)``."""
    pytest.importorskip("selenium")
    from tests.browser import chromium, serve
    from tests.hubtools import free_port

    root = board(tmp_path / "s", models=4)
    write_model(root, model_id="timm/community.in1k", architecture="resnet50", tag="in1k", num_params=25e6,
                skill=4.0, rng=np.random.default_rng(3), notes="<script>alert(1)</script>", **common(root))
    port = free_port()
    server = serve(root, port, "--trusted-keys", f"{key_of(root)}.pub")
    driver = chromium(tmp_path / "chrome")
    try:
        yield root, f"http://127.0.0.1:{port}/", driver, server
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=30)


def test_real_browser_renders_the_leaderboard_and_a_deep_link_into_a_model(page):
    from selenium.webdriver.common.by import By

    from genshift.leaderboard.store import load_store
    from tests.browser import cells, idle, open_when_serving, top10, until

    root, url, driver, _ = page
    _fake_diagnose(root / "imagenet-star" / "timm--tie_b.in1k", "timm/tie_b.in1k")
    open_when_serving(driver, url)
    ranked = until(driver, lambda d: idle(d) and len(top10(d)) == 6 and top10(d))
    store = load_store(str(root), trusted_keys=f"{key_of(root)}.pub")
    expected = sorted((e for e in store.entries if e.verified), key=lambda e: -np.mean(
        [e.record["metrics"]["configs"][c]["acc1"]["value"] for c in ("shift_01", "shift_02")]))
    assert ranked[:3] == [e.model_id for e in expected][:3] and "timm/community.in1k" not in ranked
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "Community entries (not verified, not ranked)" in body and "Deploy" not in body
    grid_cells = until(driver, lambda d: cells(d))
    assert "None" not in grid_cells and "nan" not in grid_cells and "✓ verified" in grid_cells
    headers = driver.execute_script("return Array.from(document.querySelectorAll('[role=columnheader]'))"
                                    ".map(h => h.textContent)")
    assert "95% lo" in headers and "mean shift acc@1 (%)" in headers
    assert not driver.execute_script("return Array.from(document.scripts)"
                                     ".some(s => (s.text || '').includes('alert(1)'))")
    # a shared link into a model's drilldown: its pictures, and the link stays in the address bar
    driver.get(url + "?tab=Model+drilldown&model=timm%2Ftie_b.in1k&params=5.0&params=20.0")
    until(driver, lambda d: idle(d) and "strength 0.810" in d.find_element(By.TAG_NAME, "body").text)
    imgs = until(driver, lambda d: [i for i in d.find_elements(By.CSS_SELECTOR, "[data-testid='stImage'] img")
                                    if i.get_property("naturalWidth") > 0])
    assert len(imgs) == 3 and "golden retriever" in driver.find_element(By.TAG_NAME, "body").text
    assert "model=timm%2Ftie_b.in1k" in driver.current_url and "params=5.0" in driver.current_url


def test_real_browser_swapped_predictions_lose_their_rank_without_a_restart(page):
    from tests.browser import idle, open_when_serving, top10, until

    root, url, driver, server = page
    open_when_serving(driver, url)
    before = until(driver, lambda d: idle(d) and len(top10(d)) == 6 and top10(d))
    victim, donor = before[0], before[-1]
    shutil.copyfile(root / "imagenet-star" / folder_name(donor) / "predictions" / "shift_01.parquet",
                    root / "imagenet-star" / folder_name(victim) / "predictions" / "shift_01.parquet")
    driver.get(url)  # not read yet: the signed record still stands
    assert until(driver, lambda d: idle(d) and len(top10(d)) == 6 and top10(d)) == before
    driver.get(url + f"?tab=Model+drilldown&model={victim.replace('/', '%2F')}")  # the drilldown reads its files
    after = until(driver, lambda d: idle(d) and len(top10(d)) == 5 and top10(d))
    assert victim not in after and after == [m for m in before if m != victim]
    driver.get(url)  # another visit: stale for every visitor
    assert until(driver, lambda d: idle(d) and len(top10(d)) == 5 and top10(d)) == after
    assert server.poll() is None  # the same server process throughout
