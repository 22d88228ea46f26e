"""The .pyi stubs match the module: every public name of pinstage is in
python/pinstage/__init__.pyi and the other way round, class by class; and the package
ships py.typed."""
import ast
import inspect
import pathlib

import pinstage

STUB = pathlib.Path(pinstage.__file__).with_name("__init__.pyi")


def stub_tree():
    assert STUB.exists(), f"{STUB} missing: the build copies it next to the package"
    return ast.parse(STUB.read_text())


def public(names):
    return {n for n in names if not n.startswith("_") or n in ("__dlpack__", "__version__")}


def test_py_typed_ships_with_the_package():
    assert STUB.with_name("py.typed").exists()


def test_every_public_name_is_stubbed_and_exists():
    tree = stub_tree()
    stubbed = {node.name for node in tree.body
               if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    stubbed |= {a.asname or a.name for t in tree.body if isinstance(t, ast.ImportFrom)
                and t.module is None for a in t.names}
    missing = set(pinstage.__all__) - stubbed
    assert not missing, f"public names without a stub: {sorted(missing)}"
    for name in stubbed:
        assert hasattr(pinstage, name), f"stub names pinstage.{name}, which does not exist"


def test_class_members_match():
    for node in stub_tree().body:
        if not isinstance(node, ast.ClassDef) or issubclass(getattr(pinstage, node.name),
                                                            BaseException):
            continue
        cls = getattr(pinstage, node.name)
        stubbed = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                stubbed.add(item.name)
            elif isinstance(item, ast.AnnAssign):
                stubbed.add(item.target.id)
        runtime = public(n for n in dir(cls) if not n.startswith("__") or n in stubbed)
        runtime -= {n for n in dir(object)}
        stub_public = public(stubbed) - {"__init__"}
        assert stub_public - set(dir(cls)) == set(), (node.name, stub_public - set(dir(cls)))
        assert runtime - stubbed == set(), (node.name, runtime - stubbed)


def test_python_level_signatures_match():
    """Where inspect can read the runtime signature (Python code), the stub's parameters
    are the same."""
    def params(fn):
        args = fn.args
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]

    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)

    for node in stub_tree().body:
        targets = []
        if isinstance(node, ast.FunctionDef):
            targets.append((node, getattr(pinstage, node.name)))
        elif isinstance(node, ast.ClassDef):
            cls = getattr(pinstage, node.name)
            targets += [(f, getattr(cls, f.name)) for f in node.body
                        if isinstance(f, ast.FunctionDef) and hasattr(cls, f.name)
                        and not isinstance(getattr(cls, f.name, None), property)]
        for stub, runtime in targets:
            try:
                signature = inspect.signature(runtime)
            except (TypeError, ValueError):
                continue  # a C++ function: inspect cannot read it
            names = [n for n, p in signature.parameters.items() if p.kind not in variadic]
            expected = params(stub)
            if names and names[0] != "self" and expected and expected[0] == "self":
                expected = expected[1:]
            assert names == expected, (stub.name, names, expected)
