"""The HTML report: escaping, metric tables, rebuild without the model, and a real headless Chromium check.

The browser is driven over the DevTools protocol through ``--remote-debugging-pipe``
(file descriptors 3 and 4, NUL-separated JSON), so nothing beyond the Debian
``chromium`` package and the standard library is needed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from kerascope.core.explanation import Explanation  # noqa: E402
from kerascope.numeric.resize import upsample  # noqa: E402
from kerascope.pipeline import explain_images  # noqa: E402
from kerascope.report import ReportEntry, html_table, read_report_data, rebuild_report, render, write_report  # noqa: E402

EVIL_FILE = "<img src=x onerror=alert(1)>.png"
EVIL_CLASS = "<script>alert(2)</script>"
CLASS_NAMES = [EVIL_CLASS, "dog & cat", "bird"]


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax", name="head"),
    ])


@pytest.fixture(scope="module")
def results(tiny_model, tmp_path_factory) -> Path:
    """A results folder written by the real pipeline: 2 images (one with a hostile name) + 1 unreadable file."""
    src = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in (EVIL_FILE, "plain.png"):
        Image.fromarray((rng.random((20, 24, 3)) * 255).astype(np.uint8)).save(src / name)
    (src / "broken.png").write_text("not a png")
    out = tmp_path_factory.mktemp("results")
    summary = explain_images(
        tiny_model, [src / EVIL_FILE, src / "plain.png", src / "broken.png"], out,
        methods=("gradcam", "saliency"), layer="conv", class_names=CLASS_NAMES, progress=False,
    )
    assert summary.processed == 2 and summary.failed == 1
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    return target


# ----------------------------------------------------------------------------------------------- escaping
def test_user_text_is_escaped_everywhere(results):
    page = (results / "index.html").read_text(encoding="utf-8")
    assert EVIL_FILE not in page and "onerror=alert" not in page.replace("&lt;img src=x onerror=alert(1)&gt;", "")
    assert "&lt;img src=x onerror=alert(1)&gt;.png" in page
    assert "<script" not in page  # the report ships no scripts at all
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page and "dog &amp; cat" in page
    assert "broken.png" in page  # unreadable input reported by name
    # every picture is a relative path inside the results folder (offline, no CDN)
    for src in _img_sources(page):
        assert not src.startswith(("http:", "https:", "//", "/")), src
        assert (results / src).is_file(), src


def _img_sources(page: str) -> list[str]:
    import re

    return re.findall(r"<img src='([^']*)'", page)


def test_render_escapes_every_field():
    entry = ReportEntry("<b>x", "a'.png", [("<i>cls</i>", 0.5)], {"<u>m</u>": "o\".png"}, target="<t>")
    page = render([entry], title="<h1>t", subtitle="<s>", errors={"<e>": "<why>"})
    for raw in ("<b>x", "<i>cls", "<u>m", "<t>", "<h1>t", "<s>", "<e>", "<why>", "a'.png"):
        assert raw not in page, raw
    assert "a&#x27;.png" in page and "&lt;why&gt;" in page


# ----------------------------------------------------------------------------------------------- tables
def test_metric_tables_from_dicts_and_rows(tmp_path):
    tables = {
        "metrics <all>": {"gradcam": {"pointing game": 0.875, "deletion AUC": 0.123456}, "<x>": {"pointing game": 1}},
        "per image": [{"image": "a.png", "iou": float("nan")}, {"image": "b.png", "iou": np.float32(0.5)}],
    }
    path = write_report(tmp_path / "index.html", [], tables=tables)
    page = path.read_text(encoding="utf-8")
    assert "<h2>metrics &lt;all&gt;</h2>" in page
    assert "<td>gradcam</td><td class='num'>0.875</td><td class='num'>0.1235</td>" in page
    assert "<td>&lt;x&gt;</td><td class='num'>1</td><td></td>" in page  # missing cell stays empty
    assert "<td>a.png</td><td class='num'>–</td>" in page and "<td class='num'>0.5</td>" in page
    saved = read_report_data(tmp_path)
    assert saved["tables"]["metrics <all>"]["gradcam"]["deletion AUC"] == pytest.approx(0.123456)
    assert saved["tables"]["per image"][0]["iou"] is None
    with pytest.raises(TypeError, match="Received: type=int"):
        html_table(3)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- rebuild
def test_rebuild_without_model_reproduces_report(results, tmp_path):
    folder = _copy(results, tmp_path)
    original = read_report_data(folder)
    before = {p.name: np.asarray(Image.open(p)) for p in (folder / "overlays").glob("*.png")}
    assert len(before) == 4
    shutil.rmtree(folder / "overlays")
    (folder / "index.html").unlink()
    path = rebuild_report(folder)
    rebuilt = read_report_data(folder)
    assert [(e.name, e.image, e.overlays, e.target) for e in rebuilt["entries"]] == [
        (e.name, e.image, e.overlays, e.target) for e in original["entries"]
    ]
    for a, b in zip(rebuilt["entries"], original["entries"]):
        assert [label for label, _ in a.predictions] == [label for label, _ in b.predictions]
        np.testing.assert_allclose([s for _, s in a.predictions], [s for _, s in b.predictions])
    for name, pixels in before.items():  # overlays redrawn from the .npz equal the originals
        np.testing.assert_array_equal(np.asarray(Image.open(folder / "overlays" / name)), pixels)
    assert "broken.png" in path.read_text(encoding="utf-8")


def test_rebuild_from_npz_only_with_labels_file(results, tmp_path):
    folder = _copy(results, tmp_path)
    (folder / "report.json").unlink()
    (folder / "index.html").unlink()
    explanation = Explanation.load(folder / "gradcam.npz")
    labels = ["zero", "<one>", "two"]
    rebuild_report(folder, class_names=labels, tables={"extra": {"gradcam": {"score": 1.5}}})
    data = read_report_data(folder)
    assert [e.target for e in data["entries"]] == [labels[int(t)] for t in explanation.targets]
    assert [e.name for e in data["entries"]] == [EVIL_FILE, "plain.png"]
    summary = json.loads((folder / "summary.json").read_text())
    for entry, path in zip(data["entries"], explanation.extras["paths"]):
        assert entry.predictions[0][0] == summary["predictions"][str(path)]
    assert data["tables"]["extra"]["gradcam"]["score"] == 1.5
    page = (folder / "index.html").read_text(encoding="utf-8")
    for target in explanation.targets:
        assert f"explained class: <b>{labels[int(target)].replace('<', '&lt;').replace('>', '&gt;')}</b>" in page


def test_rebuild_reports_mismatched_npz_and_missing_folder(results, tmp_path):
    folder = _copy(results, tmp_path)
    e = Explanation.load(folder / "saliency.npz")
    Explanation(e.attributions[:1], "saliency", {}, e.targets[:1], e.scores[:1]).save(folder / "saliency.npz")
    rebuild_report(folder)
    data = read_report_data(folder)
    assert "has 1 explanations but inputs/ has 2" in data["unreadable"]["saliency.npz"]
    assert "saliency.npz" not in data["errors"]  # input-level errors stay apart from unusable files
    assert all(list(entry.overlays) == ["gradcam"] for entry in data["entries"])
    with pytest.raises(FileNotFoundError, match="Received: results_dir="):
        rebuild_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="Nothing to rebuild"):
        rebuild_report(tmp_path / "empty")


def test_cli_report_json_and_embed(results, tmp_path, capsys):
    from kerascope.cli import main

    folder = _copy(results, tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("alpha\nbeta\ngamma\n")
    assert main(["report", str(folder), "--json", "--labels", str(labels), "--embed", "--redraw",
                 "--cmap", "viridis"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 2 and summary["methods"] == ["gradcam", "saliency"]
    page = (folder / "index.html").read_text(encoding="utf-8")
    sources = _img_sources(page)
    assert len(sources) == 6 and all(s.startswith("data:image/png;base64,") for s in sources)
    for src in sources:  # each inlined picture decodes to a real PNG
        raw = base64.b64decode(src.split(",", 1)[1])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["report", str(tmp_path / "missing"), "--quiet"]) == 2


# ----------------------------------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


#: What the page looks like once laid out: horizontal overflow, each entry's methods in page order with
#: the size of its picture and colour bar (the bar's CSS gradient), and the "About this page" box.
LAYOUT_PROBE = """JSON.stringify({
  scrollWidth: document.scrollingElement.scrollWidth, innerWidth: window.innerWidth,
  entries: Array.from(document.querySelectorAll('section.entry')).map(s => ({
    methods: Array.from(s.querySelectorAll('figure.method')).map(f => {
      const bar = f.querySelector('.bar'), img = f.querySelector('img');
      return {name: f.dataset.method, shown: img.getBoundingClientRect().width,
              right: f.getBoundingClientRect().right,
              bar: bar ? {width: bar.getBoundingClientRect().width, height: bar.getBoundingClientRect().height,
                          background: getComputedStyle(bar).backgroundImage} : null,
              legend: (f.querySelector('.legend') || {}).textContent || null};
    })})),
  about: (document.querySelector('section.about') || {}).innerText || null
})"""


class Browser:
    """Minimal DevTools-protocol client over ``--remote-debugging-pipe`` (stdlib only)."""

    def __init__(self, profile: Path) -> None:
        send_r, self._send_w = os.pipe()
        self._recv_r, recv_w = os.pipe()

        def child_fds() -> None:  # chromium reads commands on fd 3 and writes replies on fd 4
            a, b = os.dup(send_r), os.dup(recv_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(send_r)
        os.close(recv_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._send_w, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._on_event(reply, session)

    def _on_event(self, event: dict, session: str | None) -> None:
        self.events.append(event)
        if event.get("method") == "Page.javascriptDialogOpening" and session:
            os.write(self._send_w, json.dumps({"id": 0, "method": "Page.handleJavaScriptDialog",
                                               "params": {"accept": False}, "sessionId": session}).encode() + b"\0")

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._recv_r], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._recv_r, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def wait_for(self, method: str, session: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self._on_event(self._read(max(deadline - time.monotonic(), 0.01)), session)

    def open(self, url: str, screenshot: Path, width: int = 1100, mobile: bool = False,
             probe: str = LAYOUT_PROBE) -> dict:
        """Load ``url`` at a window ``width``; return its images' load state, layout facts (overflow, the
        methods' order, colour bars; or what another ``probe`` expression returns as JSON), console errors,
        exceptions and dialogs."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": mobile}, session=session)
        start = len(self.events)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        images = self.send("Runtime.evaluate", {
            "expression": "JSON.stringify(Array.from(document.images).map(i => "
                          "({src: i.getAttribute('src').slice(0, 60), complete: i.complete, width: i.naturalWidth})))",
            "returnByValue": True}, session=session)["result"]["value"]
        layout = self.send("Runtime.evaluate", {"expression": probe, "returnByValue": True},
                           session=session)["result"]["value"]
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        time.sleep(0.2)
        self.send("Runtime.evaluate", {"expression": "1"}, session=session)  # drain late events
        mine = [e for e in self.events[start:] if e.get("sessionId") == session]
        errors = [e["params"]["entry"]["text"] for e in mine
                  if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]
        errors += [" ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"])
                   for e in mine if e.get("method") == "Runtime.consoleAPICalled"
                   and e["params"]["type"] in ("error", "assert")]
        errors += [e["params"]["exceptionDetails"]["text"] for e in mine if e.get("method") == "Runtime.exceptionThrown"]
        dialogs = [e["params"]["message"] for e in mine if e.get("method") == "Page.javascriptDialogOpening"]
        self.send("Target.closeTarget", {"targetId": target})
        return {"images": json.loads(images), "errors": errors, "dialogs": dialogs, **json.loads(layout)}

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (OSError, TimeoutError, EOFError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._send_w)
        os.close(self._recv_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _assert_screenshot(path: Path) -> None:
    picture = np.asarray(Image.open(path).convert("RGB"))
    assert picture.shape[0] >= 800 and 1000 <= picture.shape[1] <= 1100  # minus a scrollbar, if any
    assert picture.std() > 5  # not a blank page


def test_report_renders_in_chromium(results, browser, tmp_path):
    report = browser.open((results / "index.html").as_uri(), tmp_path / "report.png")
    assert len(report["images"]) == 6, report  # 2 images x (input + 2 overlays)
    assert all(i["complete"] and i["width"] > 0 for i in report["images"]), report["images"]
    assert report["errors"] == [] and report["dialogs"] == []
    _assert_screenshot(tmp_path / "report.png")


def test_rebuilt_single_file_report_renders_in_chromium(results, browser, tmp_path):
    folder = _copy(results, tmp_path)
    path = rebuild_report(folder, embed_images=True, tables={"metrics": {"gradcam": {"pointing game": 0.5}}})
    lone = tmp_path / "lone" / "report.html"  # moved away from its pictures: must still show them
    lone.parent.mkdir()
    shutil.move(path, lone)
    report = browser.open(lone.as_uri(), tmp_path / "rebuilt.png")
    assert len(report["images"]) == 6
    assert all(i["width"] > 0 for i in report["images"]), report["images"]
    assert report["errors"] == [] and report["dialogs"] == []
    _assert_screenshot(tmp_path / "rebuilt.png")


def test_browser_check_detects_broken_pages(browser, tmp_path):
    """Control: the checker must see a missing picture, a console error and an alert."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><img src='missing.png'><img src=x onerror=\"console.error('boom')\">"
                    "<script>alert('hi')</script></body></html>")
    report = browser.open(page.as_uri(), tmp_path / "bad.png")
    assert [i["width"] for i in report["images"]] == [0, 0]
    assert any("boom" in e for e in report["errors"]) and any("ERR_FILE_NOT_FOUND" in e for e in report["errors"])
    assert report["dialogs"] == ["hi"]


# ------------------------------------------------------------------------------------------------------- layout
ORDER = ("saliency", "gradcam", "integrated_gradients")  # deliberately not alphabetical
SIZES = {"wide.png": (200, 300), "tiny.png": (8, 8), "big.png": (1000, 800)}  # natural (H, W)
SHOWN = {"wide.png": (200, 300), "tiny.png": (16, 16), "big.png": (512, 410)}  # <= 512 px, model input as floor


@pytest.fixture(scope="module")
def ordered(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    """A run with methods in a given order, pictures of several natural sizes, a saved model file, a bad file."""
    src = tmp_path_factory.mktemp("sized")
    rng = np.random.default_rng(1)
    for name, (h, w) in SIZES.items():
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(src / name)
    (src / "broken.png").write_text("not a png")
    model_file = src / "tiny.keras"
    tiny_model.save(model_file)
    out = tmp_path_factory.mktemp("ordered")
    explain_images(tiny_model, [src / n for n in (*SIZES, "broken.png")], out, methods=ORDER, layer="conv",
                   class_names=CLASS_NAMES, progress=False, model_path=model_file)
    return out, model_file


def test_overlays_at_natural_size_and_scales_follow_the_sign_convention(ordered):
    out, _ = ordered
    data = read_report_data(out)
    assert [e.name for e in data["entries"]] == list(SIZES)
    saliency = Explanation.load(out / "saliency.npz")
    for i, entry in enumerate(data["entries"]):
        assert list(entry.overlays) == list(ORDER) and list(entry.scales) == list(ORDER)
        for picture in (entry.image, *entry.overlays.values()):
            assert Image.open(out / picture).size[::-1] == SHOWN[entry.name], picture
        for method in ("saliency", "integrated_gradients"):  # signed: diverging, centred at zero
            scale = entry.scales[method]
            assert scale["cmap"] == "RdBu_r" and scale["signed"] and scale["low"] == -scale["high"] > -np.inf
        assert entry.scales["gradcam"]["cmap"] == "magma" and entry.scales["gradcam"]["low"] == 0
        # the limit is the 99.5th percentile of |channel sum| of the raw saliency
        summed = saliency.attributions[i].astype(np.float64).sum(-1)
        assert entry.scales["saliency"]["high"] == pytest.approx(np.percentile(np.abs(summed), 99.5))
        # where the saliency is largest the overlay is red; the smallest value is much less red (blue if < 0)
        overlay = np.asarray(Image.open(out / entry.overlays["saliency"]).convert("RGB")).astype(int)
        shown = upsample(summed[None].astype(np.float32), SHOWN[entry.name])[0]  # the map at the picture's size
        hot, cold = (np.unravel_index(f(shown), shown.shape) for f in (np.argmax, np.argmin))
        red_share = overlay[..., 0] / overlay.sum(-1).clip(1)  # 1/3 for grey
        assert red_share[hot] > 0.45 and red_share[hot] > red_share[cold] + 0.1, (overlay[hot], overlay[cold])
        if shown[cold] < -0.5 * shown[hot]:
            assert overlay[cold][2] > overlay[cold][0] + 40
        assert entry.target_probability is not None and 0 < entry.target_probability <= 1


def test_about_box_order_and_unreadable_message(ordered, tmp_path):
    import hashlib

    import kerascope

    out, model_file = ordered
    about = read_report_data(out)["about"]
    assert about["model"] == "sequential" or about["model"]  # the model's name
    assert about["model file"] == "tiny.keras"
    assert about["model sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()[:16]
    assert list(about["methods"]) == list(ORDER) and about["methods"]["gradcam"]["layer"] == "conv"
    assert "layer" not in about["methods"]["saliency"]  # --layer names the CAM layer only
    assert about["kerascope version"] == kerascope.__version__
    page = (out / "index.html").read_text(encoding="utf-8")
    assert about["model sha256"] in page and "About this page" in page
    row = next(r for r in page.split("<tr>") if "broken.png" in r)
    assert row.count("broken.png") == 1 and "not a readable image" in row  # the reason without the path again
    # a rebuild (all overlays redrawn) keeps the order, the colour bars and the box
    folder = _copy(out, tmp_path)
    rebuild_report(folder, redraw=True)
    rebuilt = read_report_data(folder)
    before = read_report_data(out)
    assert [list(e.overlays) for e in rebuilt["entries"]] == [list(ORDER)] * 3
    assert [e.scales for e in rebuilt["entries"]] == [e.scales for e in before["entries"]]
    assert rebuilt["about"]["model sha256"] == about["model sha256"]


@pytest.mark.parametrize("width,mobile", [(1280, False), (390, True)], ids=["desktop", "phone"])
def test_report_layout_in_chromium(ordered, browser, tmp_path, width, mobile):
    out, _ = ordered
    shot = Path(os.environ.get("KERASCOPE_SCREENSHOTS", tmp_path)) / f"report-{width}.png"  # set it to look at them
    page = browser.open((out / "index.html").as_uri(), shot, width=width, mobile=mobile)
    assert page["errors"] == [] and page["dialogs"] == []
    assert page["scrollWidth"] <= page["innerWidth"] == width  # no horizontal overflow
    assert len(page["images"]) == 3 * 4 and all(i["complete"] and i["width"] > 0 for i in page["images"])
    assert [[m["name"] for m in e["methods"]] for e in page["entries"]] == [list(ORDER)] * 3
    for entry in page["entries"]:
        for method in entry["methods"]:
            bar = method["bar"]
            assert bar is not None and bar["height"] >= 8 and bar["width"] >= 0.9 * method["shown"], method
            assert bar["background"].startswith("linear-gradient") and method["legend"]
        signed = [m["legend"] for m in entry["methods"] if m["name"] != "gradcam"]
        assert all(text.startswith("red raises") for text in signed)
        assert entry["methods"][1]["legend"].startswith("brighter")
        if mobile:  # one column: pictures as wide as the screen allows
            assert all(m["shown"] >= 0.75 * width for m in entry["methods"])
        else:  # the grid uses the page width: input + 3 methods side by side, each bigger than the old 160 px
            assert entry["methods"][-1]["right"] > 0.6 * width and all(m["shown"] > 180 for m in entry["methods"])
    assert "model sha256" in page["about"]
    picture = np.asarray(Image.open(shot).convert("RGB"))
    assert width - 20 <= picture.shape[1] <= width and picture.shape[0] >= 800 and picture.std() > 5  # minus a scrollbar


def test_colour_bars_and_about_box_from_a_hostile_report_json(results, tmp_path):
    """Scales, facts and details read back from report.json reach the page only as escaped text / checked colours."""
    folder = _copy(results, tmp_path)
    data = json.loads((folder / "report.json").read_text())
    for entry in data["entries"]:
        entry["scales"]["gradcam"] = {"stops": ["#000000", "red);background:url(//evil.example/x"], "low": 0,
                                      "high": 1, "signed": False, "cmap": "magma"}
        entry["scales"]["saliency"] = {"stops": ["#000000", "#ffffff"], "low": "nan", "high": 1}
        entry["details"] = {"<b>layer</b>": "<script>alert(7)</script>"}
    data["about"] = {"model": "<img src=x onerror=alert(8)>", "methods": {"gradcam": {"layer": "<i>conv</i>"}}}
    (folder / "report.json").write_text(json.dumps(data))
    rebuild_report(folder)  # overlays kept: their saved scales are reused, so they must be checked
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert "url(" not in page and "evil.example" not in page and "<script" not in page and "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(8)&gt;" in page
    assert "class='bar'" not in page  # both hostile scales refused: no bar rather than a wrong one
    assert "&lt;script&gt;alert(7)&lt;/script&gt;" in page and "&lt;i&gt;conv&lt;/i&gt;" in page
