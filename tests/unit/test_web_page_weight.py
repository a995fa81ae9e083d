"""The operator page stays light: its HTML, script and style sheet together under 200 kB."""

from importlib import resources

from terra_controller.rest import WEB_FILES

PAGE_BYTES_MAX = 200_000


def test_page_html_js_and_css_weigh_under_200_kB():
    web = resources.files("terra_controller") / "web"
    sizes = {name: len((web / name).read_bytes()) for name, _ in WEB_FILES.values()}
    assert set(sizes) == {"index.html", "app.js", "style.css"}
    assert all(size > 1000 for size in sizes.values())
    assert sum(sizes.values()) < PAGE_BYTES_MAX, sizes
