"""The three dependency lists agree, and the compose file is valid and safe."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
REQ = re.compile(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)$")


def _norm(req: str) -> tuple[str, str]:
    name, spec = REQ.match(req).groups()
    return name.lower().replace("_", "-"), ",".join(sorted(spec.replace(" ", "").split(",")))


def pyproject_deps() -> set[tuple[str, str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {_norm(r) for r in data["project"]["dependencies"]}


def environment_deps() -> set[tuple[str, str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            out |= {_norm(d) for d in dep["pip"] if not d.startswith("-")}
        elif not dep.startswith(("python", "pip")):
            # conda spells "pkg>=1,<2" the same way; "python=3.12" is checked below.
            out.add(_norm(dep))
    return out


def dockerfile_deps() -> set[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    return {_norm(r) for r in re.findall(r'"([A-Za-z][^"]*)"', text) if not r.startswith("/")}


def test_environment_yml_names_the_same_dependencies() -> None:
    assert environment_deps() == pyproject_deps()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.12" in env["dependencies"] and env["channels"] == ["conda-forge"]


def test_dockerfile_names_the_same_dependencies() -> None:
    assert dockerfile_deps() == pyproject_deps()
    base = re.search(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert re.fullmatch(r"quay\.io/jupyter/minimal-notebook:\d{4}-\d{2}-\d{2}", base), base


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    from check_jsonschema.builtin_schemas import get_builtin_schema
    from jsonschema.validators import validator_for

    schema = get_builtin_schema("vendor.compose-spec")
    validator = validator_for(schema)(schema)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert [e.message for e in validator.iter_errors(compose)] == []
    # The validator does reject a broken file (so the check above can fail).
    broken = json.loads(json.dumps(compose))
    broken["services"]["db"]["healthcheck"]["interval"] = 5
    assert list(validator.iter_errors(broken))


def test_compose_file_is_what_the_lab_needs() -> None:
    c = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert c["db"]["image"] == "postgres:17"
    health = c["db"]["healthcheck"]["test"]
    # The TCP form: the socket-only first-init server must not count as ready.
    assert "pg_isready" in health and health[health.index("-h") + 1] == "127.0.0.1"
    assert c["lab"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert c["lab"]["environment"]["DATABASE_URL"].startswith("postgresql://")
    assert "JUPYTER_TOKEN" in c["lab"]["environment"]
    for service in c.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{port} is reachable from other machines"
