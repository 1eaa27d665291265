"""Project hygiene that users meet on first install: the product and test environments stay
apart, big test files do not pile up, dependency ranges are bounded, and the README's install
section covers CPU and CUDA."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _default_venv(script: str) -> str:
    text = (ROOT / "scripts" / script).read_text()
    match = re.search(r"^VENV=\$\{[^:}]+:-([^}]+)\}", text, re.M) or re.search(r"^VENV=([^\s$]+)$", text, re.M)
    assert match, script
    return match.group(1)


def test_tests_do_not_install_into_the_product_environment():
    product = _default_venv("install-product-env.sh")
    assert _default_venv("demo.sh") == _default_venv("serve.sh") == product
    assert _default_venv("install-test-env.sh") != product
    assert _default_venv("test.sh") == _default_venv("install-test-env.sh")
    ignored = (ROOT / ".gitignore").read_text().split()
    assert f"{_default_venv('test.sh')}/" in ignored


def test_docs_run_pytest_from_the_test_environment():
    """pytest is installed in .venv-test only: a command running it from .venv fails."""
    product, tests = _default_venv("install-product-env.sh"), _default_venv("install-test-env.sh")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").glob("*.sh"))]:
        text = path.read_text()
        assert f"{product}/bin/python -m pytest" not in text and f"{product}/bin/pytest" not in text, path.name
    assert f"{tests}/bin/python -m pytest" in (ROOT / "docs" / "testing.md").read_text()


def test_docs_name_the_scripts_that_make_the_product_environment():
    """The README's quick start makes .venv with serve.sh; the test docs must not say only demo.sh."""
    for path in (ROOT / "docs" / "testing.md", ROOT / "scripts" / "install-test-env.sh"):
        text = " ".join(path.read_text().split())
        assert "scripts/serve.sh" in text, path.name


def test_ci_runs_the_test_script():
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_pytest_removes_temporary_files_of_passed_tests():
    options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert options["tmp_path_retention_policy"] == "failed"
    assert int(options["tmp_path_retention_count"]) <= 1


def _test_sources():
    for path in sorted((ROOT / "tests").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_fixtures_wider_than_a_test_remove_their_temporary_directories():
    """pytest keeps its temp dirs after a failed run, so a module- or session-scoped fixture's
    directory must go when its scope ends (tests/conftest.py: module_tmp_path_factory,
    session_tmp_path_factory); only a failed test's own tmp_path is kept."""
    bare = [name for name, text in _test_sources()
            if name != "tests/conftest.py" and re.search(r"(?<![\w.])tmp_path_factory\.mktemp\(", text)]
    assert not bare, f"use module_tmp_path_factory or session_tmp_path_factory in {bare}"


def test_tests_write_nothing_outside_pytest_temp_dirs():
    """No directory in the system's temp dir (Ray replicas and CLI subprocesses included: they
    get pytest's base temp dir through tests/voices/checkpoints.BASE_ENV)."""
    outside = [f"{name}: {call}" for name, text in _test_sources()
               for call in re.findall(r"\b(?:mkdtemp|mkstemp|TemporaryDirectory|NamedTemporaryFile)\([^)]*\)", text)
               if "dir=" not in call]
    assert not outside, outside


def test_shared_test_checkpoints_live_under_pytest_temp_dir(tmp_path_factory):
    """Also in child processes (the session sets BASE_ENV); tests/conftest.py removes them at the
    session's end (checkpoints.remove_shared)."""
    import os
    import shutil

    from tests.voices import checkpoints

    directory = Path(checkpoints.scratch_dir("chorus-test-probe-"))
    shutil.rmtree(directory)
    assert directory.parent == tmp_path_factory.getbasetemp()
    assert os.environ[checkpoints.BASE_ENV] == str(tmp_path_factory.getbasetemp())


def test_every_dependency_has_an_upper_bound():
    deps = PYPROJECT["project"]["dependencies"]
    assert deps and [d for d in deps if "<" not in d] == []


def test_readme_shows_cpu_and_cuda_installs_and_every_extra():
    readme = (ROOT / "README.md").read_text()
    assert "download.pytorch.org/whl/cpu" in readme and re.search(r"download\.pytorch\.org/whl/cu\d+", readme)
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        assert f"[{extra}]" in readme, extra
    assert "3.11" in readme and "3.12" in readme


def _readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_readme_gives_the_clip_length_the_server_accepts():
    """Turbo refuses a clip of exactly its minimum (compared with '>'), so 'N s or more' is wrong."""
    from chorus.models.variants import get_variant

    minimum = get_variant("turbo").min_reference_seconds
    quick = " ".join(_readme_quick_start().split())
    assert f"longer than {minimum:g} s" in quick and "or more" not in quick


def test_readme_speaks_with_the_id_the_upload_returns():
    quick = _readme_quick_start()
    assert '["id"]' in quick and '"voice": "\'"$VOICE"\'"' in quick
