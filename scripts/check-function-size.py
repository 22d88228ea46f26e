#!/usr/bin/env python3
"""No Python function in the tree is over 80 lines (the same rule clang-tidy's
readability-function-size holds C++ to). Usage: check-function-size.py ROOT [FILE ...];
without files, every *.py git tracks under ROOT. Exits 1 naming each long function."""
import ast
import subprocess
import sys

LIMIT = 80


def long_functions(path, text):
    """(line, name, length) of each function or method in text over LIMIT lines."""
    out = []
    for node in ast.walk(ast.parse(text, filename=path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > LIMIT:
                out.append((node.lineno, node.name, length))
    return out


def main(argv):
    root = argv[1] if len(argv) > 1 else "."
    files = argv[2:] or subprocess.check_output(
        ["git", "-C", root, "ls-files", "*.py"], text=True).split()
    found = 0
    for name in files:
        path = name if len(argv) > 2 else f"{root}/{name}"
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, func, length in long_functions(path, text):
            print(f"{path}:{line}: {func} is {length} lines (limit {LIMIT})")
            found += 1
    if found:
        return 1
    print(f"python functions: {len(files)} files, none over {LIMIT} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
