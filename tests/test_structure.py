"""The structure the README draws, checked from the code's own imports (function-local ones included): arrows
evals → agents → mcpregistry → audit and agents → audit; nothing from the audit core to agents or mcpregistry; nothing
from mcpregistry to agents; no circle of imports between modules of the apps. And Django's start, its checks and the web
process's URLconf load none of what a run executes (LangGraph, LangChain, the MCP SDK, the model providers), which
a worker loads before it is ready."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("agent_platform", "agents", "mcpregistry", "audit", "auditor", "evals")
AUDIT_CORE = ("audit.models", "audit.chain", "audit.masking", "audit.services")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            if "migrations" in parts or "demo_server" in parts:
                continue
            name = list(path.relative_to(ROOT).with_suffix("").parts)
            if name[-1] == "__init__":
                name = name[:-1]
            found[".".join(name)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module → the modules of the apps it imports (anywhere in its body)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                resolved = resolve(target)
                if resolved and resolved != module:
                    edges[module].add(resolved)
                    break
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in edges:
        if v not in index:
            visit(v)
    return found


def forbidden_arrows(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for a, targets in edges.items():
        for b in targets:
            if a.startswith("mcpregistry") and b.startswith(("agents", "auditor")):
                found.append(f"{a} -> {b}")
            # The whole audit app is a leaf: joins with runs, keys and agents live in the auditor workspace above.
            if (
                a.startswith(("audit.", "audit"))
                and a.split(".")[0] == "audit"
                and b.startswith(("agents", "mcpregistry", "auditor", "evals"))
            ):
                found.append(f"{a} -> {b}")
            if a.startswith("agents") and b.startswith(("auditor", "evals")):
                found.append(f"{a} -> {b}")
            # evals sits above agents: nothing below it knows it.
            if a.startswith("mcpregistry") and b.startswith("evals"):
                found.append(f"{a} -> {b}")
    for core in AUDIT_CORE:
        path = ROOT / (core.replace(".", "/") + ".py")
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if any(f'"{app}.' in text or f"'{app}." in text for app in ("agents", "mcpregistry")):
            found.append(f"{core} names a model of agents or mcpregistry by string")
    return sorted(found)


def test_no_module_imports_against_the_arrows() -> None:
    assert forbidden_arrows(import_graph()) == []


def test_no_circle_of_imports_between_or_inside_the_apps() -> None:
    assert circles(import_graph()) == []


@pytest.mark.slow
def test_the_walk_sees_function_local_imports() -> None:
    edges = import_graph()
    assert "agents.execution" in edges["agents.tasks"]  # imported inside run_agent's body


# What a run executes and nothing else needs: about three seconds of imports on this machine, two of them the MCP
# SDK and LangChain's core, which every ``manage.py`` command and web process paid at start before.
RUN_PATH_PACKAGES = ("langgraph", "mcp", "langchain_core", "langsmith", "langchain_aws", "boto3", "openai")


def _loaded_after(script: str) -> list[str]:
    """The run path's packages loaded in a fresh process after ``script`` (Django's settings set)."""
    script += f"\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & set({RUN_PATH_PACKAGES!r})))\n"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_django_s_start_its_checks_and_the_web_urlconf_load_none_of_the_run_path() -> None:
    # What every manage.py command does before its work (the system checks load the URLconf), and what a web
    # process does to route a request: the admin's pages, the API, the auditor's and the evals' endpoints.
    loaded = _loaded_after(
        "import django\n"
        "django.setup()\n"
        "from django.core import checks\n"
        "checks.run_checks()\n"
        "from django.urls import resolve\n"
        "for url in ('/api/v1/runs', '/api/v1/audit/events', '/api/v1/evals/runs', '/admin/', "
        "'/admin/agents/rule-tester/', '/mcp/', '/a2a/company-assistant/'):\n"
        "    resolve(url)\n"
    )
    assert loaded == []


@pytest.mark.slow
def test_a_worker_imports_the_run_path_before_it_is_ready() -> None:
    # ``worker_init`` fires in the worker's main process before its pool starts: the pool processes forked from
    # it have the run path, and no run waits for its imports.
    loaded = _loaded_after(
        "import django\n"
        "django.setup()\n"
        "from agent_platform.celery import app\n"
        "from celery.signals import worker_init\n"
        "worker_init.send(sender=None)\n"
        "import sys\n"
        "assert 'agents.execution' in sys.modules\n"
    )
    assert set(loaded) == set(RUN_PATH_PACKAGES)
