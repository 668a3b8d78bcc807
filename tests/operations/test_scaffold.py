"""``python -m bus init``: a new app that runs as written - provisioned, sent to from a plain
script and handled exactly once by the app under the local host (``python -m bus host``,
Microsoft's worker running its function_app.py) on Azurite - and, from a wheel of this package
installed into a fresh virtualenv, the same quickstart as a new user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Endpoint, connect
from bus.operations.cli import main
from bus.operations.scaffold import INFRA

ROOT = Path(__file__).resolve().parents[2]
# The new app is a Functions app (Python 3.13, the Durable Functions SDK): init imports it to
# write its topology file.
pytest.importorskip("azure.durable_functions", reason="the Functions app's SDK (Python 3.13)")


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """The new app's modules are imported by name: none of another app's may linger."""
    names = ("function_app", "contracts")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    yield
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


def test_init_writes_an_app_and_its_bicep(tmp_path: Path, clean_modules: None) -> None:
    folder = tmp_path / "shop"
    result = CliRunner().invoke(main, ["init", str(folder)])
    assert result.exit_code == 0, result.output
    written = {line.removeprefix(f"wrote {folder}/") for line in result.output.splitlines()
               if line.startswith("wrote ")}
    assert {"function_app.py", "contracts.py", "send.py", "host.json", "local.settings.json",
            "requirements.txt", "README.md", ".funcignore", "infra/main.bicep",
            "infra/topology.json"} <= written
    topology = json.loads((folder / "infra" / "topology.json").read_text())
    assert [e["name"] for e in topology["endpoints"]] == ["greeter"]
    settings = json.loads((folder / "local.settings.json").read_text())["Values"]
    assert settings["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert (folder / "requirements.txt").read_text().startswith("eobus[functions]")


def test_the_bicep_is_the_project_s_own(tmp_path: Path, clean_modules: None) -> None:
    """One copy of the Bicep: the package's is a link to infra/, and init copies it whole."""
    CliRunner().invoke(main, ["init", str(tmp_path / "shop")])
    for source in (ROOT / "infra").rglob("*.bicep"):
        relative = source.relative_to(ROOT / "infra")
        assert (INFRA / relative).read_bytes() == source.read_bytes()
        assert (tmp_path / "shop" / "infra" / relative).read_bytes() == source.read_bytes()


def test_init_overwrites_nothing(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text("# mine\n")
    result = CliRunner().invoke(main, ["init", str(tmp_path)])
    assert result.exit_code == 2
    assert "already holds function_app.py" in result.output
    assert (tmp_path / "function_app.py").read_text() == "# mine\n"


def test_the_new_app_s_topology_file_is_in_sync(tmp_path: Path, clean_modules: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    CliRunner().invoke(main, ["init", str(tmp_path / "shop")])
    monkeypatch.chdir(tmp_path / "shop")
    result = CliRunner().invoke(main, ["topology", "check"])
    assert result.exit_code == 0, result.output


def test_worker_names_an_unknown_endpoint(tmp_path: Path, clean_modules: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    CliRunner().invoke(main, ["init", str(tmp_path / "shop")])
    monkeypatch.chdir(tmp_path / "shop")
    result = CliRunner().invoke(main, ["worker", "--endpoint", "billing"])
    assert result.exit_code == 2
    assert "function_app has no endpoint 'billing': it has greeter" in result.output


NOBODY = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
          "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
          + "".join(f"{kind}Endpoint=http://127.0.0.1:9/devstoreaccount1;"
                    for kind in ("Blob", "Queue", "Table")))
"""A connection to storage that is not there (port 9: the discard port, closed here)."""


def test_worker_until_idle_says_when_storage_does_not_answer(
        tmp_path: Path, clean_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "nothing to do": a poll that fails finds nothing, which is not idle."""
    CliRunner().invoke(main, ["init", str(tmp_path / "shop")])
    monkeypatch.chdir(tmp_path / "shop")
    monkeypatch.setenv("AzureWebJobsStorage", NOBODY)
    result = CliRunner().invoke(main, ["worker", "--until-idle"])
    assert result.exit_code == 1
    assert "storage did not answer" in result.output and "nothing to do" not in result.output


def users_environment() -> dict[str, str]:
    """This process's environment without the app settings and paths other tests set (the
    new app's settings are its local.settings.json's, as in a new user's shell)."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith(("BUS_", "AzureWebJobs", "FUNCTIONS_", "APPLICATIONINSIGHTS",
                                    "OTEL_"))
            and name not in ("PYTHONPATH", "VIRTUAL_ENV")}


def readme_commands(readme: str) -> list[str]:
    """The commands of a README's first ``sh`` block, comments left out."""
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def quickstart(folder: Path, python: str, connection: str, prefix: str, env: dict[str, str],
               *, installs: bool = False) -> list[str]:
    """The new app's README, verbatim, each command in a process of its own: its ``python``
    commands but the dashboard (it serves until stopped); what each printed. Its other two
    are the test's to do: the package is installed already, and Azurite runs on the test's
    ports (the connection goes into local.settings.json, where the README's Azurite would be
    found by UseDevelopmentStorage=true). ``installs``: run its ``pip install`` too (into a
    virtualenv that has the package already: it finds every requirement satisfied)."""
    commands = readme_commands((folder / "README.md").read_text())
    assert [c.split()[0] for c in commands] == ["pip", "npx", "python", "python", "python",
                                                "python"]
    settings = json.loads((folder / "local.settings.json").read_text())
    settings["Values"]["AzureWebJobsStorage"] = connection
    settings["Values"]["BUS_PREFIX"] = prefix  # the test's own names in a shared Azurite
    (folder / "local.settings.json").write_text(json.dumps(settings))
    printed = []
    for command in commands:
        words = command.split()
        if words[0] == "pip" and installs:
            words = ["python", "-m", *words]
        if words[0] != "python" or words[-1] == "dashboard":
            continue
        done = subprocess.run([python, *words[1:]], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        printed.append(done.stdout)
    return printed


HOST_SAYS = "bus_endpoint_greeter: 1 succeeded\n"
"""What ``python -m bus host --until-idle`` prints after the README's message: the greeter's
queue-triggered function (its name in the Functions app) ran once, in Microsoft's worker."""


def greetings(connection: str, prefix: str) -> dict[str, object]:
    bus = connect(connection, [Endpoint("greeter")], prefix=prefix)
    return {"ada": bus.read_state("greeter", "ada", "greetings")}


@pytest.mark.azurite
@pytest.mark.worker
def test_the_quickstart_runs_from_the_checkout(tmp_path: Path, azurite_connection: str,
                                               prefix: str, clean_modules: None) -> None:
    folder = tmp_path / "shop"
    CliRunner().invoke(main, ["init", str(folder)])
    env = {**users_environment(), "PYTHONPATH": str(ROOT)}
    printed = quickstart(folder, sys.executable, azurite_connection, prefix, env)
    assert printed[-1] == HOST_SAYS
    assert greetings(azurite_connection, prefix) == {"ada": {"times": 1}}


@pytest.mark.azurite
@pytest.mark.worker
def test_the_quickstart_runs_from_an_installed_wheel(tmp_path: Path, azurite_connection: str,
                                                     prefix: str) -> None:
    """What a new user does: pip install the built package (its Functions extra), init an
    app, and run the README's commands - nothing of this checkout on the path."""
    wheels = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                    "--disable-pip-version-check", "-w", str(wheels)], check=True, timeout=300)
    [wheel] = wheels.glob("eobus-*.whl")
    # A user's environment for every step: a PYTHONPATH to this checkout (the Spark tests
    # set one in this process) would have pip find the package installed already.
    env = users_environment()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"{wheel}[functions]"], check=True, timeout=600, env=env)
    made = subprocess.run([python, "-m", "bus", "init", "shop"], cwd=tmp_path, env=env,
                          timeout=120, capture_output=True, text=True, check=False)
    assert made.returncode == 0, (made.stdout, made.stderr)
    folder = tmp_path / "shop"
    version = re.findall(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[0]
    assert (folder / "requirements.txt").read_text() == f"eobus[functions]=={version}\n"
    printed = quickstart(folder, python, azurite_connection, prefix, env, installs=True)
    assert printed[-1] == HOST_SAYS
    assert greetings(azurite_connection, prefix) == {"ada": {"times": 1}}


def test_the_project_readme_shows_the_same_quickstart(tmp_path: Path,
                                                      clean_modules: None) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own app", 1)[1].split("\n## ", 1)[0]
    install, rest = section.split("```sh\n")[1:3]
    CliRunner().invoke(main, ["init", str(tmp_path / "shop")])
    assert readme_commands(f"```sh\n{rest}") == readme_commands(
        (tmp_path / "shop" / "README.md").read_text())
    version = re.findall(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[0]
    assert f"dist/eobus-{version}-py3-none-any.whl[functions]" in install


def test_provision_and_worker_in_process_on_the_memory_backend(
        tmp_path: Path, clean_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two commands, in the developer's loop: ``memory:`` is one store per process."""
    folder = tmp_path / "shop"
    CliRunner().invoke(main, ["init", str(folder)])
    settings = json.loads((folder / "local.settings.json").read_text())
    settings["Values"]["AzureWebJobsStorage"] = "memory:scaffold-test"
    (folder / "local.settings.json").write_text(json.dumps(settings))
    monkeypatch.chdir(folder)
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    provisioned = CliRunner().invoke(main, ["provision"])
    assert provisioned.exit_code == 0, provisioned.output
    assert provisioned.output == ("provisioned 1 endpoint(s) of function_app (greeter), "
                                  "prefix (none)\n")
    from contracts import Greet  # type: ignore[import-not-found]  # the new app's

    connect(routes={Greet: "greeter"}).send(Greet(name="ada"))
    worked = CliRunner().invoke(main, ["worker", "--until-idle"])
    assert worked.exit_code == 0, worked.output
    assert worked.output == "greeter: 1 processed\n"
    again = CliRunner().invoke(main, ["worker", "--until-idle", "--endpoint", "greeter"])
    assert again.output == "greeter: nothing to do\n"


def test_send_sends_a_command_and_publishes_an_event_from_the_command_line(
        tmp_path: Path, clean_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "shop"
    CliRunner().invoke(main, ["init", str(folder)])
    monkeypatch.chdir(folder)
    monkeypatch.setenv("AzureWebJobsStorage", "memory:send-test")
    CliRunner().invoke(main, ["provision"])
    sent = CliRunner().invoke(main, ["send", "Greet", '{"name": "ada"}'])
    assert sent.exit_code == 0, sent.output
    assert re.fullmatch(r"sent Greet [0-9a-f]{32} to greeter\n", sent.output)
    published = CliRunner().invoke(main, ["send", "Greeted", '{"name": "ada", "times": 1}',
                                          "--delay", "5"])
    assert re.fullmatch(r"published Greeted \w+ to its subscribers\n", published.output)
    assert CliRunner().invoke(main, ["worker", "--until-idle"]).output == (
        "greeter: 1 processed\n")
    from bus.operations.apps import load_bus

    assert load_bus().read_state("greeter", "ada", "greetings") == {"times": 1}
    for args, says in ((["Greet", "{}"], "PAYLOAD is not a Greet: name: Field required"),
                       (["Greet", "[1"], "PAYLOAD is not a Greet: (root): Invalid JSON"),
                       (["Wave"], "function_app has no contract 'Wave': it has Greet, Greeted"),
                       (["Greeted", '{"name": "a", "times": 1}', "--to", "greeter"],
                        "Greeted is an event: it goes to its topic's subscribers")):
        refused = CliRunner().invoke(main, ["send", *args])
        assert refused.exit_code == 2 and says in refused.output, (args, refused.output)


def test_provision_without_a_connection_says_what_to_set(
        tmp_path: Path, clean_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "shop"
    CliRunner().invoke(main, ["init", str(folder)])
    (folder / "local.settings.json").unlink()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    result = CliRunner().invoke(main, ["provision"])
    assert result.exit_code == 2
    assert "app setting 'AzureWebJobsStorage' is missing" in result.output
