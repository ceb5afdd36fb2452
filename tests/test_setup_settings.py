"""Every environment variable is read in tenantlab/settings.py, and the README lists each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tenantlab import settings

ROOT = Path(__file__).resolve().parent.parent
READS = re.compile(r"os\.environ\.get|os\.getenv|os\.environ\[[^\]]+\](?!\s*=)|environ\.get\(")


def test_only_settings_reads_the_environment() -> None:
    readers = [f"{path.relative_to(ROOT)}:{n}"
               for path in sorted((ROOT / "tenantlab").rglob("*.py"))
                   # the production worker stands alone: it reads its own JOBQUEUE_DSN
                   if path.name != "settings.py" and "jobqueue" not in path.parts
               for n, line in enumerate(path.read_text().splitlines(), 1) if READS.search(line)]
    assert readers == [], f"read the environment through tenantlab.settings: {readers}"


def test_the_readme_lists_every_variable() -> None:
    readme = (ROOT / "README.md").read_text()
    names = set(re.findall(r'"((?:TENANTLAB|JUPYTER)_[A-Z_]+|[A-Z_]+_HOME)"',
                           (ROOT / "tenantlab" / "settings.py").read_text()))
    assert {"TENANTLAB_DATABASE_URL", "TENANTLAB_PORT", "JUPYTER_TOKEN"} <= names
    missing = [n for n in sorted(names) if f"`{n}`" not in readme]
    assert missing == []
    assert "mamba env create -f environment.yml" in readme  # environment.yml is documented


def test_the_readme_lists_every_variable_the_compose_file_reads() -> None:
    readme = (ROOT / "README.md").read_text()
    names = set(re.findall(r"\$\{(\w+)", (ROOT / "docker-compose.yml").read_text()))
    assert {"POSTGRES_PASSWORD", "TENANTLAB_LAB_PORT", "JUPYTER_TOKEN"} <= names
    missing = [n for n in sorted(names) if f"`{n}`" not in readme and f"`{n}=" not in readme]
    assert missing == []


def test_a_bare_database_url_needs_to_be_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENANTLAB_DATABASE_URL", raising=False)
    monkeypatch.delenv("TENANTLAB_USE_DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://someone-elses-app/db")
    assert settings.database_url() is None and settings.ignored_database_url()
    monkeypatch.setenv("TENANTLAB_USE_DATABASE_URL", "1")
    assert settings.database_url() == "postgresql://someone-elses-app/db"
    monkeypatch.setenv("TENANTLAB_DATABASE_URL", "postgresql://the-kits/db")
    assert settings.database_url() == "postgresql://the-kits/db"


def test_a_bad_port_variable_says_what_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANTLAB_PORT", "eighty")
    with pytest.raises(settings.TenantlabError, match="TENANTLAB_PORT must be a port number"):
        settings.port()


def test_tenantlab_port_naming_no_running_server_is_refused(
        admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TENANTLAB_PORT names the embedded server's port: another port is said, not ignored."""
    from tenantlab import db
    from tenantlab.errors import ConfigurationError
    from tenantlab.server import embedded, free_port

    if settings.database_url():
        pytest.skip("the suite runs on TENANTLAB_DATABASE_URL, not the embedded server")
    monkeypatch.setenv("TENANTLAB_PORT", str(free_port()))
    with pytest.raises(ConfigurationError, match=r"but the embedded server in .* runs on port"):
        db.admin_dsn()
    monkeypatch.setenv("TENANTLAB_PORT", str(embedded().port()))
    assert db.admin_dsn() == admin_dsn
