"""The web page of graphormer-serve in a real browser (issue 40): headless Chromium driven by
Playwright. Chromium is Playwright's own (``playwright install chromium``) or the executable
named by GRAPHORMER_CHROMIUM (e.g. @sparticuz/chromium's)."""

import os
from pathlib import Path

import pytest

from graphormer.testing import running_server

pytest.importorskip("litserve", reason="the serve extra (litserve) is absent")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

# Flags a browser needs in a container without user namespaces.
CHROMIUM_ARGS = ["--no-sandbox", "--single-process", "--no-zygote"]


@pytest.fixture(scope="module")
def browser():
    executable = os.environ.get("GRAPHORMER_CHROMIUM")
    if executable and not Path(executable).is_file():
        pytest.skip(f"GRAPHORMER_CHROMIUM={executable} is not a file")
    with sync_api.sync_playwright() as playwright:
        try:
            found = playwright.chromium.launch(
                executable_path=executable or None, args=CHROMIUM_ARGS, headless=True
            )
        except Exception as error:  # Playwright's own error type for a missing browser
            pytest.skip(
                "no Chromium to drive: run `playwright install chromium` or set "
                f"GRAPHORMER_CHROMIUM to a Chromium executable ({str(error).splitlines()[0]})"
            )
        yield found
        found.close()


def test_page_predicts_and_shows_a_picture(browser, tmp_path, esol_checkpoint):
    """Three SMILES, one invalid: three rows, one error; a click shows the molecule."""
    with running_server(esol_checkpoint, f"hydra.run.dir={tmp_path / 'serve'}") as (url, _):
        page = browser.new_page()
        page.goto(url + "/")
        sync_api.expect(page.locator("#model")).to_contain_text("regression")
        page.fill("#smiles", "CCO\nC1CC\nc1ccccc1O")
        page.click("#predict")
        rows = page.locator("tr.row")
        sync_api.expect(rows).to_have_count(3)
        sync_api.expect(page.locator("td.error")).to_have_count(1)
        assert "invalid SMILES" in page.locator("td.error").inner_text()
        assert rows.nth(1).locator("td").first.inner_text() == "C1CC"
        rows.nth(2).click()
        picture = page.locator("#picture img")
        sync_api.expect(picture).to_have_count(1)
        page.wait_for_function("document.querySelector('#picture img').naturalWidth > 0")
        with page.expect_download() as download:
            page.click("#download")
        text = Path(download.value.path()).read_text()
        assert text.splitlines()[0] == "smiles,task_0,error"
        assert len(text.splitlines()) == 4
