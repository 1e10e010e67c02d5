"""The documentation: the site builds in strict mode, and every example of README.md and docs/ runs.

The site (mkdocs.yml) builds with ``mkdocs build --strict``: a broken link, a missing anchor, a page
left out of the nav or a docstring mkdocstrings cannot render fails it (the negative control breaks a
link and an anchor and must fail). Examples are the pages' fenced blocks (fixtures/readme.py): python
and bash blocks run here unless a marker says which test runs them or why they are not run; every
``lossless-check`` command shown, run or not, is parsed by the command's own parser.
"""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import fields

import pytest
import yaml

from fixtures.readme import DOCS, LANGUAGES, PAGES, PLUGIN_PAGE, README, ROOT, blocks, shown

ALL = [block for page in PAGES for block in blocks(page)]
#: At most this many blocks are not run: each says why in its marker (installs, the main job, the
#: suite itself, placeholders for a user's own classes or checkpoints, a CI workflow).
MOST_NOT_RUN = 12  # 11th: the plugin form of a model-pair check (a user's own checkpoints); 12th: --transformers X with a user's class
#: The README's two commands: the main job, and the test command .ci/run runs.
MAIN_JOB = ("python -m pip install -q torch==2.13.0 -e '.[tested]' && lossless-check run --matrix default --workers 2 "
            "--json lossless-report.json")


def _hook(name: str):
    """A docs hook module (docs/hooks/NAME.py): the tests use the hooks' own code, not a copy of it."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(config, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_with_every_generated_part(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-4000:]
    site = tmp_path / "site"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    parser = _hook("cli_reference").build_parser()
    (commands,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in commands.choices.items():
        assert f"lossless-check {name}" in cli
        for action in sub._actions:
            for option in action.option_strings if action.help != "==SUPPRESS==" else ():
                assert option in cli, (name, option)
    api = (site / "reference" / "api" / "index.html").read_text()
    for name in ("check", "run", "CaseResult", "RunResult", "fuzz", "FuzzResult", "check_models", "ModelsResult",
                 "warper_stacks"):
        assert 'id="lossless_check.' in api and re.search(rf'id="lossless_check\.[\w.]*\b{name}"', api), name
    assert ":class:" not in api and ":func:" not in api
    for path in _hook("repo_pages").mounted():
        page = site / path.replace("README.md", "index.html").replace(".md", "/index.html")
        assert page.is_file(), path


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """Negative control: the same configuration over a copy of the pages with one link to a page that
    does not exist and one to an anchor that does not exist."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("hooks"))
    with open(tmp_path / "docs" / "index.md", "a") as index:
        index.write("\n[gone](no-such-page.md) and [nowhere](guarantee.md#no-such-section)\n")
    config["docs_dir"] = str(tmp_path / "docs")
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-section" in done.stderr, done.stderr[-3000:]


def test_every_block_says_what_it_is_and_markers_are_honest():
    assert [b.id for b in ALL if b.lang not in LANGUAGES] == []
    not_run = [b for b in ALL if b.marker and b.marker.startswith("not-run")]
    assert len(not_run) <= MOST_NOT_RUN, [b.id for b in not_run]
    for block in not_run:
        assert block.lang in ("bash", "python", "yaml"), block.id
        assert len(block.marker.split(":", 1)[1].strip()) > 20, f"{block.id}: say why it is not run"
    for block in ALL:
        if block.marker and block.marker.startswith("run-by"):
            path, test = block.marker.split(": ", 1)[1].split("::")
            assert f"def {test}(" in (ROOT / path).read_text(), block.id


def test_files_shown_on_several_pages_are_the_same_file():
    shown_as = defaultdict(set)
    for block in ALL:
        if block.name:
            shown_as[block.name].add(block.code)
    assert {name: len(codes) for name, codes in shown_as.items() if len(codes) > 1} == {}


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    test_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    commands = [b.code.strip() for b in blocks(README) if b.lang == "bash"]
    assert MAIN_JOB in commands and test_command in commands
    # Its links are relative paths (to docs/*.md and the repository's folders), so that they work where
    # the repository is read; the site's build checks the pages' own links.
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert targets and [t for t in targets if "://" in t or not (ROOT / t).exists()] == []
    # The README's plugin output is an excerpt of the guide's, which tests/test_downstream.py checks.
    excerpt = shown(README, "the command that repeats the check:").splitlines()
    assert set(excerpt) <= set(shown(PLUGIN_PAGE, "fails the drafter:").splitlines())


def _commands(block) -> list[list[str]]:
    """The lossless-check commands of a bash or yaml block, as argument lists."""
    if block.lang == "yaml":
        steps = [s for job in yaml.safe_load(block.code)["jobs"].values() for s in job["steps"]]
        lines = [s["run"] for s in steps if "run" in s]
    else:
        lines = block.code.splitlines()
    found = []
    for line in lines:
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["lossless-check"]:
                found.append(words[1:])
            elif words[:3] == ["python", "-m", "lossless_check"]:
                found.append(words[3:])
    return found


def test_every_command_shown_parses():
    parser = _hook("cli_reference").build_parser()
    shown_commands = [(b.id, c) for b in ALL if b.lang in ("bash", "yaml") for c in _commands(b)]
    assert len(shown_commands) >= 8
    for where, args in shown_commands:
        try:
            parser.parse_args(args)
        except (SystemExit, Exception) as exc:  # the command's parser raises its usage error (exit 2)
            pytest.fail(f"{where}: lossless-check {shlex.join(args)} does not parse: {exc}")


def test_configuration_examples_parse():
    tomllib = pytest.importorskip("tomllib")
    for block in ALL:
        if block.lang == "toml":
            tomllib.loads(block.code)
        elif block.lang == "yaml":
            yaml.safe_load(block.code)


def test_the_json_reference_lists_every_field():
    from lossless_check import CaseResult, RunResult
    from lossless_check.outputs.report import to_json

    page = (DOCS / "reference" / "json-report.md").read_text()
    written = set(to_json(RunResult([], 1e-6, 0, 10))) | {f.name for f in fields(CaseResult)} - {"exact_failure"}
    assert {name for name in written if f"`{name}`" not in page} == set()


def test_the_plugin_reference_lists_every_option():
    done = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, cwd=ROOT)
    options = set(re.findall(r"--lossless-[a-z-]+", done.stdout))
    page = (DOCS / "reference" / "pytest-plugin.md").read_text()
    assert options and {o for o in options if f"`{o}" not in page} == set()


@pytest.mark.parametrize("block", [b for b in ALL if b.runs_here], ids=lambda b: b.id)
def test_example_runs(block, tmp_path):
    """Run in a folder of its own that holds every file the page shows, as a reader would."""
    for other in blocks(block.page):
        if other.name and other.lang == "python":
            (tmp_path / other.name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / other.name).write_text(other.code)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    if block.lang == "python":
        script = block.name or "example.py"
        (tmp_path / script).write_text(block.code)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script] \
            if os.path.basename(script).startswith("test_") else [sys.executable, script]
    else:
        command = ["bash", "-e", "-c", block.code]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == block.expected_exit, f"{block.id}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_example_checks_can_fail(tmp_path, capsys):
    """Negative controls: a misspelt option does not parse, a block without a language and a malformed
    marker are caught, and an ``exits N`` marker sets the exit code a run must end with."""
    page = tmp_path / "page.md"
    page.write_text("<!-- example: exits 1 -->\n```bash\nlossless-check run --no-such-option\n```\n\n```\nplain\n```\n")
    bad, bare = blocks(page)
    with pytest.raises(Exception, match="unrecognized arguments: --no-such-option"):
        _hook("cli_reference").build_parser().parse_args(_commands(bad)[0])
    assert bare.lang not in LANGUAGES and bad.expected_exit == 1 and bad.runs_here
    page.write_text("<!-- example: not-run -->\n```bash\nlossless-check list\n```\n")
    with pytest.raises(ValueError, match="malformed example marker"):
        blocks(page)
    capsys.readouterr()
