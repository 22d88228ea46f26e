"""The .pyi stubs match the module: every public name of pinstage is in
python/pinstage/__init__.pyi and the other way round, class by class; and the package
ships py.typed."""
import ast
import inspect
import pathlib
import types

import pinstage

STUB = pathlib.Path(pinstage.__file__).with_name("__init__.pyi")


def stub_tree():
    assert STUB.exists(), f"{STUB} missing: the build copies it next to the package"
    return ast.parse(STUB.read_text())


def stub_only(node):
    """A typing helper the stub alone has (a TypedDict of keywords: _WorkerOptions, ...)."""
    return isinstance(node, ast.ClassDef) and any(
        isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases)


def runtime_nodes():
    """The stub's top-level statements, less its stub-only typing helpers."""
    return [node for node in stub_tree().body if not stub_only(node)]


def public(names):
    return {n for n in names if not n.startswith("_") or n in ("__dlpack__", "__version__")}


def test_py_typed_ships_with_the_package():
    assert STUB.with_name("py.typed").exists()


def test_every_public_name_is_stubbed_and_exists():
    tree = stub_tree()
    stubbed = {node.name for node in runtime_nodes()
               if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    stubbed |= {a.asname or a.name for t in tree.body if isinstance(t, ast.ImportFrom)
                and t.module is None for a in t.names}
    missing = set(pinstage.__all__) - stubbed
    assert not missing, f"public names without a stub: {sorted(missing)}"
    for name in stubbed:
        assert hasattr(pinstage, name), f"stub names pinstage.{name}, which does not exist"


def test_class_members_match():
    for node in runtime_nodes():
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


def stub_targets():
    """(stub node, runtime object) for every stubbed function and method (not
    properties)."""
    for node in runtime_nodes():
        if isinstance(node, ast.FunctionDef):
            yield node, getattr(pinstage, node.name)
        elif isinstance(node, ast.ClassDef):
            cls = getattr(pinstage, node.name)
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list):
                    yield f, getattr(cls, f.name)


def stub_parameters(fn):
    """[(name, kind, default source or None)] of a stubbed def."""
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(positional, defaults):
        out.append((arg.arg, "positional", default))
    if a.vararg:
        out.append((a.vararg.arg, "*", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "keyword", default))
    if a.kwarg:
        out.append((a.kwarg.arg, "**", None))
    return [(n, k, NO_DEFAULT if d is None
             else ANY_DEFAULT if isinstance(d, ast.Constant) and d.value is Ellipsis
             else ast.literal_eval(d)) for n, k, d in out]


# A parameter without a default, told apart from one whose default is None (a stub with
# "worker: Worker" against a runtime "worker=None" is a mismatch); and the stub's "= ...",
# written where the default is not a literal, which matches any default.
NO_DEFAULT = "<no default>"
ANY_DEFAULT = "<any default>"


KIND = {inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "*",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_KEYWORD: "**"}


def test_every_stubbed_callable_has_a_signature_matching_its_stub():
    """inspect.signature() reads every function and method, C++ ones included (their
    docstrings start with a text signature), and its parameters, kinds and defaults are
    the stub's."""
    checked = 0
    for stub, runtime in stub_targets():
        signature = inspect.signature(runtime)  # raises for a C++ def without a signature
        got = [(n, KIND[p.kind], NO_DEFAULT if p.default is inspect.Parameter.empty
                else p.default) for n, p in signature.parameters.items()]
        expected = stub_parameters(stub)
        if expected and expected[0][0] == "self" and (not got or got[0][0] != "self"):
            expected = expected[1:]  # a bound or Python-level view without self
        for i, (want, have) in enumerate(zip(expected, got)):
            if want[2] == ANY_DEFAULT and have[2] != NO_DEFAULT:
                want = (want[0], want[1], have[2])
            assert want == have, (stub.name, i, want, have)
        assert len(expected) == len(got), (stub.name, expected, got)
        checked += 1
    assert checked > 50


def test_cpp_docstrings_name_python_types_only():
    """No docstring of the extension names a C++ type, and every C++ method and function
    starts with its signature."""
    import pinstage._pinstage as core

    def docs():
        for name, obj in vars(core).items():
            if isinstance(obj, type):
                for member_name, member in vars(obj).items():
                    yield f"{name}.{member_name}", member
            else:
                yield name, obj

    seen = 0
    for name, obj in docs():
        doc = obj.__doc__ if isinstance(obj, property) else getattr(obj, "__doc__", None)
        if not isinstance(doc, str):
            continue
        assert "::" not in doc and "pinstage._pinstage." not in doc, (name, doc)
        if callable(obj) and type(obj).__name__ in ("builtin_function_or_method",
                                                    "instancemethod"):
            if obj.__name__ in ("__repr__", "__str__", "__init__") and obj.__doc__ is None:
                continue
            func = getattr(obj, "__func__", obj)
            assert func.__text_signature__, f"{name}: no signature in {doc[:60]!r}"
            seen += 1
    assert seen > 50


def test_property_docs_start_with_the_stubs_type():
    """help() shows each C++ property's Python type: its docstring starts with the type
    the stub gives ("int: pinned host bytes held.")."""
    checked = 0
    for node in runtime_nodes():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(pinstage, node.name)
        for item in node.body:
            if isinstance(item, ast.AnnAssign):
                name, annotation = item.target.id, item.annotation
            elif isinstance(item, ast.FunctionDef) and item.decorator_list:
                name, annotation = item.name, item.returns
            else:
                continue
            attr = inspect.getattr_static(cls, name, None)
            if not isinstance(attr, property):
                continue  # an exception's attribute, or Python-level
            if isinstance(attr.fget, types.FunctionType):
                continue  # a Python property: its stub and code are read by the checker
            doc = attr.__doc__ or ""
            assert doc.startswith(ast.unparse(annotation) + ": "), (node.name, name, doc)
            checked += 1
    assert checked > 60


def field_list_classes():
    """(stub class, runtime class) of every class whose properties a header's field list
    makes (PINSTAGE_PY_DEF_FIELDS gives it `_fields`, the list's names in order)."""
    for node in runtime_nodes():
        if isinstance(node, ast.ClassDef) and "_fields" in vars(getattr(pinstage, node.name)):
            yield node, getattr(pinstage, node.name)


def stub_members(node):
    """The names a stub class declares, attributes and properties, in order."""
    out = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign):
            out.append(item.target.id)
        elif isinstance(item, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
            out.append(item.name)
    return out


def test_field_list_classes_are_stubbed_in_list_order():
    """Each field list's class declares its fields first in the stub, in the list's order,
    so a field added to a list (WorkerStats, TensorBindReport, ...) and not to the .pyi, or
    stubbed out of order, fails here."""
    seen = []
    for node, cls in field_list_classes():
        fields = list(cls._fields)
        assert stub_members(node)[:len(fields)] == fields, (node.name, fields)
        seen.append(node.name)
    assert {"WorkerStats", "TensorBindReport", "GroupBindReport", "SceneRound", "SceneReport",
            "TensorComparison", "Comparison"} <= set(seen), seen


def test_option_keywords_are_stubbed_as_their_lists():
    """_WorkerOptions and _BindOptions, the stub's types of **options, hold one key per
    field of PINSTAGE_WORKER_OPTION_FIELDS and PINSTAGE_BIND_OPTION_FIELDS, in order: a
    field added to either list and not to the stub fails here."""
    lists = pinstage._pinstage._field_lists()
    typed = {node.name: stub_members(node) for node in stub_tree().body if stub_only(node)}
    assert typed["_WorkerOptions"] == lists["PINSTAGE_WORKER_OPTION_FIELDS"]
    assert typed["_BindOptions"] == ["execute" if k == "execute_callable" else k
                                     for k in lists["PINSTAGE_BIND_OPTION_FIELDS"]]
