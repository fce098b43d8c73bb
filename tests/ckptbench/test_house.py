"""The house rules of ckptbench/, read from the code's own imports: folders by concept, imports pointing down, across
folders only to the modules a folder's face (__init__.__all__) names, no circles, the UI reached through one door."""

from __future__ import annotations

import ast
import importlib
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ckptbench")
# floors, lowest first: a folder imports only folders on its own floor or below
FLOORS = [("core", "mark"), ("system", "testing"), ("checkpoint",), ("sources", "records"), ("restore",),
          ("save", "watch", "distributed"), ("plan",), ("checklist",), ("cli",)]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _modules() -> dict[str, str]:
    out = {}
    for root, _, names in os.walk(PKG):
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(root, n)
                rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: str) -> list[str]:
    """Every ckptbench module a file imports (at any depth in it: lazy imports count too)."""
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptbench"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.append(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("ckptbench")]
    return out


def _folder(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_at_most_a_handful_of_files_sit_directly_in_the_package():
    top = sorted(m for m, p in MODULES.items() if os.path.dirname(p) == PKG)
    assert top == ["ckptbench", "ckptbench.__main__", "ckptbench.mark"], top


def test_every_folder_is_on_a_floor_and_imports_point_down():
    for module, path in MODULES.items():
        me = _folder(module)
        if not me or me == "__main__":
            continue
        assert me in FLOOR, f"{me}/ is on no floor of this test: place it"
        for target in _imports(path):
            other = _folder(target)
            if other and other != me:
                assert FLOOR[other] <= FLOOR[me], f"{module} imports {target}: {other}/ is above {me}/"


def test_across_folders_only_the_modules_a_face_names():
    for module, path in MODULES.items():
        me = _folder(module)
        for target in _imports(path):
            other = _folder(target)
            if not other or other == me or other == "mark" or target == f"ckptbench.{other}":
                continue
            face = importlib.import_module(f"ckptbench.{other}")
            public = getattr(face, "__all__", [])
            first = target.split(".")[2]
            assert first in public, \
                f"{module} imports {target}: {first} is not on ckptbench.{other}'s face {public}"


def test_no_circles():
    edges = {m: {t for t in _imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        for t in sorted(edges[m]):
            visit(t, path + [m])
        done.add(m)

    for m in sorted(edges):
        visit(m, [])


def test_the_ui_is_reached_through_one_door():
    for module, path in MODULES.items():
        tree = ast.parse(open(path).read())
        names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        ui = [n for n in names if n.split(".")[0] in ("tui", "textual")]
        assert not ui or module == "ckptbench.cli.ui", f"{module} imports {ui}: only cli/ui.py opens the UI"
