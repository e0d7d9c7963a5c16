"""The documentation site: built with `mkdocs build --strict`, served on
127.0.0.1, and read in headless Chromium.

FUNCTX_SITE_DIR=path     use a site already built there (CI builds it once,
                         running every recipe, and hands it to this test);
                         without it the test builds one in a temporary folder,
                         running only the recipe it looks at.
FUNCTX_REQUIRE_SITE_TEST=1  fail, instead of skipping, when mkdocs, Playwright
                         or Chromium is missing (CI sets it).
FUNCTX_CHROMIUM=path     the Chromium binary (default /usr/bin/chromium).
FUNCTX_SITE_SCREENSHOTS=folder  also save a full-page screenshot of each page read.

The tools come with the `[docs]` extra and Debian's `chromium` package.
"""

import functools
import http.server
import importlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

ROOT = pathlib.Path(__file__).parent.parent
CHROMIUM = os.environ.get("FUNCTX_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("FUNCTX_REQUIRE_SITE_TEST") == "1"
RECIPE = "jacobians_hessians"  # the recipe page the browser reads
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# every public namespace and the API page that must document each of its exports
API_PAGES = {
    "functx": "api/functx", "functx.autograd": "api/autograd",
    "functx.autograd.functional": "api/autograd", "functx.autograd.forward_ad": "api/autograd",
    "functx.autograd.graph": "api/autograd", "functx.autograd.profiler": "api/autograd",
    "functx.numpy": "api/numpy", "functx.numpy.linalg": "api/numpy",
    "functx.numpy.fft": "api/numpy", "functx.lax": "api/lax", "functx.nn": "api/nn-random",
    "functx.random": "api/nn-random", "functx.test_util": "api/util", "functx.config": "api/util",
}


def _missing_tools():
    missing = [name for name in ("mkdocs", "mkdocstrings", "material", "jupytext", "nbclient",
                                 "playwright")
               if importlib.util.find_spec(name) is None]
    if not os.path.exists(CHROMIUM):
        missing.append(f"chromium ({CHROMIUM})")
    return missing


def _need_tools():
    missing = _missing_tools()
    if missing:
        message = (f"the documentation tools are not installed: {', '.join(missing)} "
                   "(pip install -e '.[docs]' and apt-get install chromium)")
        if REQUIRED:
            pytest.fail(message + "; FUNCTX_REQUIRE_SITE_TEST=1 asks for this test")
        pytest.skip(message)


@pytest.fixture(scope="module")
def site():
    """The folder of a built site."""
    _need_tools()
    given = os.environ.get("FUNCTX_SITE_DIR")
    if given:
        path = pathlib.Path(given)
        assert (path / "index.html").exists(), f"FUNCTX_SITE_DIR={given} holds no built site"
        yield path
        return
    folder = tempfile.mkdtemp(prefix="functx-site-")
    try:
        env = dict(os.environ, FUNCTX_DOCS_EXECUTE=RECIPE, NO_MKDOCS_2_WARNING="1")
        build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", folder],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr[-6000:]}"
        yield pathlib.Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server(site):
    """The site served over HTTP on 127.0.0.1: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    _need_tools()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        print(f"test_site: Chromium {b.version} ({CHROMIUM})")
        yield b
        b.close()


def _open(browser, url):
    """Load `url`; return the page and the list of problems seen while loading
    (console errors, uncaught exceptions, failed requests to the site)."""
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
            if r.status >= 400 else None)
    response = page.goto(url, wait_until="load")
    assert response is not None and response.ok, f"{url}: {response and response.status}"
    page.wait_for_load_state("networkidle")
    shots = os.environ.get("FUNCTX_SITE_SCREENSHOTS")
    if shots:
        pathlib.Path(shots).mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w]+", "_", url.split("/", 3)[-1]).strip("_") or "home"
        page.screenshot(path=str(pathlib.Path(shots) / f"{name}.png"), full_page=True)
    return page, problems


# -- quick checks of the site's sources (no build) ----------------------------

def test_every_example_is_a_recipe_page_in_the_nav():
    """examples/*.py and the Recipes section of mkdocs.yml name the same files,
    so a new example cannot be left out of the site (nor a removed one break it)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    in_nav = set(re.findall(r"recipes/(\w+)\.md", nav)) - {"index"}
    examples = {p.stem for p in (ROOT / "examples").glob("*.py")}
    assert in_nav == examples


def test_api_hook_sorts_exports():
    """The API pages render functx's own functions with their docstrings and
    list the ones taken over from JAX in a table, by the rule in docs/hooks/api.py."""
    if importlib.util.find_spec("mkdocs") is None:
        _need_tools()
    spec = importlib.util.spec_from_file_location("functx_docs_api", ROOT / "docs/hooks/api.py")
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    import functx

    assert api.kind(functx.grad) == "own"
    assert api.kind(functx.numpy.sin) == "jax"
    assert api.kind(functx.numpy.float32) == "value"
    assert api.kind(functx.lax) == "module"
    assert api.kind(functx.lax.scan) == "own"
    text = api.section("functx.lax", None)
    assert "::: functx.lax.scan" in text
    assert '<span id="functx.lax.sin"></span>' in text and "jax.lax.sin.html" in text


# -- the built site --------------------------------------------------------------

@pytest.mark.slow
def test_api_pages_document_every_public_name(site):
    """Every name each public namespace exports has an entry (an element with
    the id `module.name`) on its API page."""
    missing = []
    for module_name, page in API_PAGES.items():
        module = importlib.import_module(module_name)
        html = (site / page / "index.html").read_text()
        ids = set(re.findall(r'id="([^"]+)"', html))
        missing += [f"{module_name}.{n} ({page})" for n in module.__all__
                    if f"{module_name}.{n}" not in ids]
    assert not missing, f"public names without an API entry: {missing}"


@pytest.mark.slow
def test_home_api_and_recipe_pages_render_in_chromium(site, server, browser):
    # the home page: the three rules and a highlighted example
    page, problems = _open(browser, server)
    assert "functx" in page.title()
    assert page.locator("article h1").first.inner_text().strip().rstrip("¶") == "functx"
    article = page.locator("article").inner_text()
    assert "Three rules to start with" in article and "functx.jit" in article
    assert page.locator("article .highlight code").count() >= 1
    nav = page.locator("nav.md-nav--primary").first.inner_text()
    assert "API reference" in nav and "Recipes" in nav
    assert not problems, problems
    page.close()

    # an API page: grad's signature and docstring, rendered by mkdocstrings
    page, problems = _open(browser, server + "api/functx/")
    assert page.locator('[id="functx.grad"]').count() == 1
    entry = page.locator('[id="functx.grad"] + div.doc')
    assert entry.locator(".doc-heading").first.inner_text().strip().startswith("functx.grad")
    signature = entry.locator(".doc-signature").first.inner_text()
    assert re.search(r"grad\(\s*func,\s*argnums=0,\s*has_aux=False", signature), signature
    assert "Gradient of a scalar function" in entry.inner_text()
    assert page.locator('[id="functx.vmap"] + div.doc .doc-signature').count() == 1
    assert not problems, problems
    page.close()

    # a recipe: the script's prose, code, printed output and a figure
    page, problems = _open(browser, server + f"recipes/{RECIPE}/")
    assert "Jacobians" in page.locator("article h1").first.inner_text()
    outputs = page.locator("article pre.recipe-output")
    assert outputs.count() >= 3, "the recipe's printed output is missing"
    printed = "\n".join(outputs.all_inner_texts())
    assert re.search(r"Jacobian|jacrev", printed), printed[:500]
    images = page.locator("article img")
    assert images.count() >= 1, "the recipe shows no figure"
    widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert all(w > 100 for w in widths), f"figures that did not load: {widths}"
    assert page.locator("article .highlight code").count() >= 5
    assert not problems, problems
    page.close()
