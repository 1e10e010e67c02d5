"""The gate's HTML in a real headless browser: it renders, and its figures decode and display."""

import re
import shutil
import subprocess

import pytest

from test_gate import _result

from lossless_check.faces.gate import write_reports

pytest.importorskip("matplotlib")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs it)")

# Counts, once the page has loaded, the images that decoded to a real picture.
PROBE = """<script>window.addEventListener('load', () => {
  const shown = [...document.images].filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute('data-images', document.images.length);
  document.body.setAttribute('data-shown', shown);
});</script>"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_report_renders_with_its_figures(tmp_path):
    page = write_reports(_result(), tmp_path / "gate", title="mymod:Gen")[2]
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
         probed.as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    images = int(re.search(r'data-images="(\d+)"', dom).group(1))
    shown = int(re.search(r'data-shown="(\d+)"', dom).group(1))
    assert images >= 2 and shown == images  # the failing case's distribution and acceptance-law charts
    assert "not_lossless" in dom and "inconsistent" in dom  # the grid and the provenance table rendered
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}",
                    "--window-size=1200,1600", page.as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000  # a page with charts, not a blank one
