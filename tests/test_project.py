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


def test_ci_runs_the_test_script():
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_pytest_removes_temporary_files_of_passed_tests():
    options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert options["tmp_path_retention_policy"] == "failed"
    assert int(options["tmp_path_retention_count"]) <= 1


def test_every_dependency_has_an_upper_bound():
    deps = PYPROJECT["project"]["dependencies"]
    assert deps and [d for d in deps if "<" not in d] == []


def test_readme_shows_cpu_and_cuda_installs_and_every_extra():
    readme = (ROOT / "README.md").read_text()
    assert "download.pytorch.org/whl/cpu" in readme and re.search(r"download\.pytorch\.org/whl/cu\d+", readme)
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        assert f"[{extra}]" in readme, extra
    assert "3.11" in readme and "3.12" in readme
