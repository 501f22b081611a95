"""The report page in a real browser: headless Chromium loads report.html and every plot in it
decodes to an image with a width (a broken data URI or path shows as naturalWidth 0)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpupace.cli import main
from gpupace.sim import presets, simulate, write_telemetry

pytestmark = pytest.mark.timeout(120)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Appended to a copy of the page: after load, every <img> reports whether it decoded.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.setAttribute('data-imgs', imgs.length);
  document.body.setAttribute('data-ok',
      imgs.filter(i => i.complete && i.naturalWidth > 0).length);
  document.body.setAttribute('data-widths', imgs.map(i => i.naturalWidth).join(','));
});
</script>"""


def _dump_dom(page, profile) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
           "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (Debian: apt-get install -y chromium)")
def test_every_plot_loads_in_headless_chromium(tmp_path, capsys):
    paths = []
    for label, policy in (("baseline", "none"), ("paced", "gpupace")):
        res = simulate(presets.mixed(1, 4), policy=policy, steps=150, seed=4)
        paths.append(write_telemetry(res, tmp_path / f"{label}.jsonl", label=label))
    out = tmp_path / "out"
    assert main(["report", *map(str, paths), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    html = (out / "report.html").read_text()
    n_imgs = html.count("<img ")
    assert n_imgs >= 8
    probe = out / "probe.html"  # beside report.html, so relative links resolve the same
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = _dump_dom(probe, tmp_path / "profile")
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:500]
    attrs = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', body.group(0)))
    assert attrs.get("data-imgs") == str(n_imgs), attrs
    assert attrs.get("data-ok") == str(n_imgs), attrs
    assert all(int(w) >= 400 for w in attrs["data-widths"].split(",")), attrs
