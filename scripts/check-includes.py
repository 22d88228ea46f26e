#!/usr/bin/env python3
"""The include check: every `#include "..."` of the library, plugins, scenes, Python module,
CLI and tools obeys docs/design/architecture.md's table "What each layer may include".

    scripts/check-includes.py [ROOT]     exits 1 and names each violation, else 0

The link check (conformance.<backend>.PluginLinksBaseOnly) sees only what a binary links;
this sees what a source includes, which is where a layer leak starts. tests/, bench/ and
fuzz/ may reach internals and are not checked.
"""
import os
import re
import sys

# The layer of each public header in include/pinstage/ (the flat directory). A new public
# header must be added here: an unmapped one is an error, so the table stays whole.
PUBLIC_HEADER_LAYER = {
    "atomic_file.h": "base", "clock.h": "base", "error.h": "base", "export.h": "base",
    "files.h": "base", "free_ranges.h": "base", "log.h": "base", "names.h": "base",
    "pages.h": "base", "parallel.h": "base", "report.h": "base", "settings.h": "base",
    "version.h": "base",
    "worker.h": "runtime", "worker_group.h": "runtime",
    "dtype.h": "tensor", "random.h": "tensor", "safetensors.h": "tensor",
    "tensor.h": "tensor",
    "bind.h": "bind", "staging_ring.h": "bind",
    "cache.h": "checkpoint", "checkpoint.h": "checkpoint", "load_plan.h": "checkpoint",
    "scene.h": "scene_registry",
    "ab_bench.h": "bench", "run_info.h": "bench",
}

# src/<dir> -> layer; the layers that make up libpinstage.so may use each other's private
# headers (they are one library), always downwards.
SRC_LAYER = {"base": "base", "runtime": "runtime", "tensor": "tensor", "bind": "bind",
             "checkpoint": "checkpoint", "scene": "scene_registry", "bench": "bench"}
LIBPINSTAGE = {"runtime", "tensor", "bind", "checkpoint", "scene_registry", "bench"}
LIBRARY = {"abi", "sdk", "base"} | LIBPINSTAGE
BELOW = {"abi", "sdk", "base"}

# What each layer may include (public headers), from the architecture table. "abi" is the
# C ABI (platform_abi.h), which base uses for status codes and fault names; "sdk" is the
# rest of the plugin SDK (include/pinstage/backend/), which builds on base.
MAY_INCLUDE = {
    "abi": {"abi"},
    "sdk": BELOW,
    "base": {"base", "abi"},
    "backend": BELOW,
    "runtime": BELOW | {"runtime"},
    # tensor's allocators take a Worker through its public API where they pin: in their
    # sources, never in tensor's public headers (a forward declaration serves there).
    "tensor": BELOW | {"tensor"},
    "bind": BELOW | {"runtime", "tensor", "bind"},
    "checkpoint": BELOW | {"runtime", "tensor", "bind", "checkpoint"},
    "scene_registry": BELOW | {"runtime", "tensor", "bind", "scene_registry"},
    "bench": BELOW | {"runtime", "tensor", "bind", "scene_registry", "bench"},
    # "python" here is the module's public binding header, pinstage/python/binding.h.
    "scene": LIBRARY | {"python"},
    "python": LIBRARY | {"python"},
    "app": LIBRARY,
    "tool": LIBRARY,
}
SOURCE_ONLY = {"tensor": {"runtime"}}

# Known leaks, each to be removed by issue 28 (scenes above Python: a public binding header
# the module exports). Nothing else may join this list without a reason beside it.
KNOWN = set()

# Folders other targets name on their include path: a bare "x.h" found there is theirs.
PRIVATE_INCLUDE_DIRS = {"python/src": ("python", None), "apps/pinstage": ("app", "pinstage")}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
CHECKED = ("src/", "include/", "scenes/", "python/src/", "python/include/", "apps/", "tools/")


def file_layer(rel):
    """(layer, owner) of a checked file; owner names a backend, scene or app folder."""
    parts = rel.split("/")
    if parts[0] == "include":
        if parts[1:2] == ["pinstage"] and parts[2:3] == ["backend"]:
            return ("abi" if parts[3] == "platform_abi.h" else "sdk"), None
        name = "/".join(parts[2:])
        if name not in PUBLIC_HEADER_LAYER:
            raise LookupError(f"{rel}: a public header with no layer: add it to "
                              "PUBLIC_HEADER_LAYER in scripts/check-includes.py")
        return PUBLIC_HEADER_LAYER[name], None
    if parts[0] == "src":
        if parts[1] == "backends":
            return "backend", parts[2]
        if parts[1] not in SRC_LAYER:
            raise LookupError(f"{rel}: a source outside every layer: add its folder to "
                              "SRC_LAYER in scripts/check-includes.py")
        return SRC_LAYER[parts[1]], None
    if parts[0] == "scenes":
        return "scene", parts[1]
    if parts[0] == "python":
        return "python", None
    if parts[0] == "apps":
        return "app", parts[1]
    return "tool", parts[1]


def include_target(root, rel, name, scenes):
    """(layer, owner, private) of what `#include "name"` in rel reaches."""
    parts = name.split("/")
    if parts[0] == "pinstage":
        if parts[1] == "backend":
            return ("abi" if parts[2:] == ["platform_abi.h"] else "sdk"), None, False
        if parts[1] == "python":  # the Python module's public header (python/include)
            return "python", None, False
        if len(parts) > 2 and parts[1] in scenes:
            return "scene", parts[1], False
        if name.removeprefix("pinstage/") not in PUBLIC_HEADER_LAYER:
            raise LookupError(f"{rel}: includes {name}, a public header with no layer")
        return PUBLIC_HEADER_LAYER[name.removeprefix("pinstage/")], None, False
    if parts[0] == "backends":
        return "backend", parts[1], True
    if parts[0] in SRC_LAYER and os.path.exists(os.path.join(root, "src", name)):
        return SRC_LAYER[parts[0]], None, True
    here = os.path.dirname(rel)
    if os.path.exists(os.path.join(root, here, name)):
        layer, owner = file_layer(rel)
        return layer, owner, True
    # A bare name found only in another folder: the build reaches it through that folder's
    # include path, so it is that folder's private header.
    for folder, (layer, owner) in PRIVATE_INCLUDE_DIRS.items():
        if os.path.exists(os.path.join(root, folder, name)):
            return layer, owner, True
    return None, None, False


def check(root):
    scenes = {d for d in os.listdir(os.path.join(root, "scenes"))
              if os.path.isdir(os.path.join(root, "scenes", d))}
    problems = []
    for top, _, files in os.walk(root):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(top, f), root).replace(os.sep, "/")
            if not rel.startswith(CHECKED) or not f.endswith((".h", ".cpp", ".cc", ".cu")):
                continue
            try:
                layer, owner = file_layer(rel)
            except LookupError as e:
                problems.append(str(e))
                continue
            is_header = f.endswith(".h")
            with open(os.path.join(top, f), encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m or (m.group(1) == "<" and not m.group(2).startswith("pinstage/")):
                        continue
                    name = m.group(2)
                    try:
                        t_layer, t_owner, private = include_target(root, rel, name, scenes)
                    except LookupError as e:
                        problems.append(str(e))
                        continue
                    if t_layer is None or (rel, name) in KNOWN:
                        continue
                    why = verdict(layer, owner, is_header, t_layer, t_owner, private)
                    if why:
                        problems.append(f"{rel}:{lineno}: includes {name}: {why}")
    return problems


def verdict(layer, owner, is_header, t_layer, t_owner, private):
    """Why this include breaks the table, or None."""
    if t_layer in ("backend", "scene", "app", "tool"):
        if layer == t_layer and owner == t_owner:
            return None
        if t_layer == "scene" and not private and layer in ("app", "tool"):
            return None
        return f"{layer} may not include {t_layer} {t_owner}'s headers"
    if private:
        same = t_layer == layer
        downwards = (layer in LIBPINSTAGE and t_layer in LIBPINSTAGE
                     and t_layer in MAY_INCLUDE[layer])
        return None if same or downwards else f"{layer} may not include {t_layer}'s private headers"
    allowed = MAY_INCLUDE[layer] | (set() if is_header else SOURCE_ONLY.get(layer, set()))
    return None if t_layer in allowed else f"{layer} may not include {t_layer}"


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems = check(root)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"include check: {len(problems)} violation(s) of docs/design/architecture.md",
              file=sys.stderr)
        return 1
    print("include check: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
