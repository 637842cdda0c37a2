"""The import structure of agentrl/ and sandbox/: no import cycles, no import that runs up the layers.

Read statically (`ast`, nothing is imported), so the test costs well under a second and sees every import,
including those inside functions. Imports inside functions are allowed and common: they are how the code defers
heavy imports (torch, transformers, ray) until a command needs them. They still count here: a deferred import
is a dependency all the same, and deferring one only hides a cycle or an upward import from the interpreter,
not from a reader.

A module may import modules of its own layer or of any layer below it. Entry points sit above every layer and
may import anything: the command-line handlers (`agentrl/cli.py`, every `*/cli.py`, `sandbox/__main__.py`)
and the benches (`*bench*.py`: measurement commands that build a model, an engine and a loop).
The sandbox is a separate service: every module under sandbox/, entry points included, imports only agentrl's
base layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom to top. A name stands for the module and everything under it.
LAYERS = [
    ("base", ["agentrl", "agentrl.types", "agentrl.errors", "agentrl.config", "agentrl.console", "agentrl.numerics",
              "agentrl.files", "agentrl.retry", "agentrl.services", "agentrl.stats", "agentrl.auth"]),
    ("sandbox", ["sandbox"]),
    ("components", ["agentrl.tools", "agentrl.inference", "agentrl.models"]),
    # Environments (agentrl/envs) are the tool agent's peers: their loop shares its turn bookkeeping, and the
    # rollout and the agent config use their registry.
    ("agent_loop", ["agentrl.agent_loop", "agentrl.envs"]),
    # Above the agent loop: demonstrations are rendered with its chat template and graded by its code tests.
    ("data", ["agentrl.data"]),
    ("evaluation", ["agentrl.evaluation"]),
    ("trainer", ["agentrl.trainer"]),  # runs evaluations during training and shares their metrics
    ("apps", ["agentrl.preflight", "agentrl.viewer", "agentrl.quickstart"]),
]
ENTRY_POINTS = ["agentrl.cli"]  # plus every `cli`, `__main__` and `*bench*` module

# Upward imports that exist today, each with what removes it. An entry that no longer occurs fails the test,
# so the list only shrinks.
UPWARD_EXCEPTIONS = {
    # resolve_model_dir (a checkpoint -> a model directory) for `agentrl eval --model CHECKPOINT`.
    ("agentrl.evaluation.run", "agentrl.trainer.export"),
}
# Cycles that exist today (as sets of modules), each with what removes it.
CYCLE_EXCEPTIONS = [
    # Reward type "verl" recurses into resolve_reward_fn for reward.verl_reward_type; rewards.py reaches
    # verl_reward.py through an import inside resolve_reward_fn.
    {"agentrl.agent_loop.rewards", "agentrl.agent_loop.verl_reward"},
]


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under agentrl/ and sandbox/."""
    found = {}
    for package in ("agentrl", "sandbox"):
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported agentrl/sandbox module: line of the first such import}, every import in the file."""
    mods = modules(root)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in mods.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base for alias in node.names]
            else:
                continue
            for name in names:
                target = known(name)
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start, edges in graph.items():
        if start in index:
            continue
        work = [(start, iter(edges))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def is_entry_point(module: str) -> bool:
    last = module.rpartition(".")[2]
    return module in ENTRY_POINTS or last in ("cli", "__main__") or "bench" in last


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest matching name; None for a module no layer names."""
    best, level = -1, None
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, level = len(name), i
    return level


def layer_violations(graph: dict[str, dict[str, int]], root: Path) -> list[str]:
    files = modules(root)
    problems = []
    for module, edges in sorted(graph.items()):
        path = files[module].relative_to(root)
        if module.split(".")[0] == "sandbox":
            for target, line in sorted(edges.items()):
                if target.split(".")[0] == "agentrl" and layer_of(target) != 0:
                    problems.append(f"{path}:{line}: the sandbox imports {target}; it may import only agentrl's "
                                    f"base layer {LAYERS[0][1]}")
            continue
        if is_entry_point(module):
            continue
        mine = layer_of(module)
        if mine is None:
            problems.append(f"{module} is in no layer: add it to LAYERS in tests/unit/test_layering.py")
            continue
        for target, line in sorted(edges.items()):
            theirs = layer_of(target)
            upward = is_entry_point(target) or (theirs is not None and theirs > mine)
            if upward and (module, target) not in UPWARD_EXCEPTIONS:
                where = "an entry point" if is_entry_point(target) else f"layer {LAYERS[theirs][0]!r}"
                problems.append(f"{path}:{line}: {module} (layer {LAYERS[mine][0]!r}) imports {target} "
                                f"({where}), which is above it")
    return problems


def test_no_import_cycles():
    found = [c for c in cycles(imports(ROOT)) if c not in CYCLE_EXCEPTIONS]
    assert not found, "import cycles (module-level and in-function imports): " + "; ".join(
        " <-> ".join(sorted(c)) for c in found)


def test_no_import_runs_up_the_layers():
    problems = layer_violations(imports(ROOT), ROOT)
    assert not problems, "\n".join(problems)


def test_every_exception_still_occurs():
    graph = imports(ROOT)
    stale = [f"{a} -> {b}" for a, b in sorted(UPWARD_EXCEPTIONS) if b not in graph.get(a, {})]
    stale += [" <-> ".join(sorted(c)) for c in CYCLE_EXCEPTIONS if c not in cycles(graph)]
    assert not stale, f"no longer true, remove from tests/unit/test_layering.py: {stale}"


def test_the_check_sees_deferred_cycles_and_upward_imports(tmp_path):
    """A cycle through an import inside a function, and a base module importing the trainer, are both reported."""
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "__init__.py").write_text("")
    for name, text in {"__init__": "", "preflight": "def f():\n    from agentrl.trainer.sft import load\n",
                       "errors": "from agentrl.trainer import sft\n"}.items():
        (tmp_path / "agentrl").mkdir(exist_ok=True)
        (tmp_path / "agentrl" / f"{name}.py").write_text(text)
    (tmp_path / "agentrl" / "trainer").mkdir()
    (tmp_path / "agentrl" / "trainer" / "__init__.py").write_text("")
    (tmp_path / "agentrl" / "trainer" / "sft.py").write_text("def main():\n    import agentrl.preflight\n")
    graph = imports(tmp_path)
    assert cycles(graph) == [{"agentrl.preflight", "agentrl.trainer.sft"}]
    problems = layer_violations(graph, tmp_path)
    assert any(p.startswith("agentrl/errors.py:1: agentrl.errors (layer 'base') imports agentrl.trainer.sft")
               for p in problems), problems
