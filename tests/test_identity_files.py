"""The project's identity: LICENSE matching pyproject.toml, CITATION.cff (the paper and the software), the README's
paper section and the quick start a Flower user lands on; every relative link of those pages resolves."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

PAPER_TITLE = "The Dynamics of Collapse and Recovery in Clustered Federated Learning"


def _project(repository: Path) -> dict:
    with open(repository / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["project"]


def test_the_license_file_is_the_apache_2_text_pyproject_names(repository: Path) -> None:
    text = (repository / "LICENSE").read_text()
    assert _project(repository)["license"] == "Apache-2.0" and _project(repository)["license-files"] == ["LICENSE"]
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for section in ("1. Definitions.", "2. Grant of Copyright License.", "3. Grant of Patent License.",
                    "4. Redistribution.", "9. Accepting Warranty or Additional Liability.",
                    "END OF TERMS AND CONDITIONS"):
        assert section in text, section
    assert len(text.splitlines()) > 190  # the full text, not a notice


def test_citation_names_the_paper_and_this_software_without_invented_identifiers(repository: Path) -> None:
    citation = yaml.safe_load((repository / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert citation["version"] == _project(repository)["version"]
    assert citation["license"] == _project(repository)["license"]
    assert citation["authors"] and citation["message"]
    paper = citation["preferred-citation"]
    assert paper["title"] == PAPER_TITLE and paper["type"] == "article" and paper["authors"]
    def keys(node):
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from keys(value)
        elif isinstance(node, list):
            for value in node:
                yield from keys(value)

    assert not {"doi", "identifiers", "year", "journal", "conference"} & set(keys(citation))  # none is known
    assert "placeholder" in paper["authors"][0]["name"]  # and the unknown authors say so


def test_the_readme_says_which_paper_and_where_its_results_are(repository: Path) -> None:
    text = (repository / "README.md").read_text()
    section = text.split("## The paper", 1)[1].split("\n## ", 1)[0]
    assert PAPER_TITLE in " ".join(section.split()) and "docs/results.md" in section and "CITATION.cff" in section
    for experiment in ("fig1", "linear", "characters", "gmm", "housing", "scenarios"):
        assert f"fedroute reproduce {experiment}" in section, experiment
    flower = text.split("## Flower's own workflow: `flwr run .`", 1)[1].split("\n## ", 1)[0]
    for needle in ("flwr run . --stream", "num-supernodes=", "flwr federation simulation-config", "flwr ls",
                   "conf/linear.toml", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"):
        assert needle in flower, needle
    assert "docs/quickstart.md" in text


def test_the_quick_start_covers_simulation_deployment_and_the_plugin(repository: Path) -> None:
    text = (repository / "docs" / "quickstart.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert [heading.split(":")[0] for heading in headings] == ["Simulation", "Deployment", "Your own Flower app"]
    for needle in ("flwr run .", "flwr ls", "num-supernodes", "flower-superlink", "flower-supernode",
                   "partition-id", "ClusteredRouting", "routing_train", "conf/linear.toml"):
        assert needle in text, needle
    for name in ("fig1", "linear", "gmm", "housing", "characters", "scenarios"):
        assert f"conf/{name}.toml" in text, name


def test_relative_links_resolve(repository: Path) -> None:
    for page in ("README.md", "docs/quickstart.md", "docs/plugin.md", "docs/deployment.md"):
        path = repository / page
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{page}: {target}"
