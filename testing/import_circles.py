#!/usr/bin/env python3
"""Fails on an import circle between the files of one crate (see docs/testing.md).

Each `.rs` file of a crate's src (test code left out) is a node; a `use` declaration or an
inline `crate::`/`super::`/`self::` path in one file that names something in another file's
module is an edge; a module file's paths into its own submodules (`mod x; use x::Y;`) are
not. Every strongly connected component of 2+ files is a circle. The circles known today are
allowed below until issue 40 removes them; the list may only shrink.

    python3 testing/import_circles.py          # exit 1 on a new or a gone circle
    python3 testing/import_circles.py --list   # also print every circle found, with its names
"""
import os
import re
import sys
from collections import defaultdict, deque

CRATES = {"ml": "ml/src", "core": "core/src", "driver": "driver/src",
          "executor": "executor/src", "ringflow": "src"}

# Circles tolerated for now, each a set of files (none: issue 40 removed the last). An entry
# is removed when its circle is gone; the check fails on any other circle.
ALLOWED: list[frozenset] = []

LEXEME = re.compile(r'//[^\n]*|/\*|(?<!\w)b?r(#*)"|b?"(?:\\.|[^"\\])*"|'
                    r"b?'(?:\\(?:u\{[0-9a-fA-F]*\}|x..|.)|[^\\'])'", re.S)
COMMENT_MARK = re.compile(r"/\*|\*/")
TEST_CFG = r"#\[cfg\((?:test|all\(test\b[^\]]*)\)\]\s*(?:#\[[^\]]*\]\s*)*"
TEST_MOD_BLOCK = re.compile(TEST_CFG + r"(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
TEST_MOD_FILE = re.compile(TEST_CFG + r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
PATH_MOD = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*'
                      r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")
USE = re.compile(r"(?<![\w$])use\s+([^;]*);")
INLINE_PATH = re.compile(r"(?<![\w:$])(?:crate|super|self)(?:\s*::\s*\w+)+")


def strip_comments_and_literals(text):
    """Returns the source with comments dropped and string and char literals emptied."""
    out, i = [], 0
    while True:
        m = LEXEME.search(text, i)
        if not m:
            return "".join(out) + text[i:]
        out.append(text[i:m.start()])
        tok = m.group(0)
        if tok == "/*":  # block comments nest
            depth, i = 1, m.end()
            while depth and (c := COMMENT_MARK.search(text, i)):
                depth, i = depth + (1 if c[0] == "/*" else -1), c.end()
            out.append(" ")
            i = i if depth == 0 else len(text)
        elif m.group(1) is not None:  # raw string r#"..."#
            end = text.find('"' + m.group(1), m.end())
            out.append('""')
            i = len(text) if end < 0 else end + 1 + len(m.group(1))
        else:
            out.append(" " if tok.startswith("//") else '""')
            i = m.end()


def block_end(text, open_brace):
    """The index just past the `}` that closes the `{` at `open_brace`."""
    depth = 0
    for j in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def strip_test_blocks(code):
    """Drops every `#[cfg(test)] mod x { ... }` block."""
    while m := TEST_MOD_BLOCK.search(code):
        code = code[:m.start()] + " " + code[block_end(code, m.end() - 1):]
    return code


def module_of(rel):
    """The module path (a tuple) of a file, from its path relative to the crate's src."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def crate_files(repo, src):
    """Maps each non-test file of a crate (path relative to src) to its module and its code."""
    modules, test_modules, renamed = {}, set(), {}
    for root, dirs, names in os.walk(os.path.join(repo, src)):
        dirs[:] = sorted(d for d in dirs if d != "tests")
        for name in (n for n in names if n.endswith(".rs") and n != "tests.rs"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
            rel = os.path.relpath(os.path.join(root, name), os.path.join(repo, src))
            rel = rel.replace(os.sep, "/")
            mod, here = module_of(rel), os.path.dirname(rel)
            for target, child in PATH_MOD.findall(text):  # `#[path = "x/mod.rs"] mod y;`
                renamed[module_of(os.path.normpath(os.path.join(here, target)))] = mod + (child,)
            code = strip_test_blocks(strip_comments_and_literals(text))
            test_modules.update(mod + (child,) for child in TEST_MOD_FILE.findall(code))
            modules[rel] = (mod, code)
    for rel, (mod, code) in list(modules.items()):
        if any(mod[:len(t)] == t for t in test_modules):
            del modules[rel]  # a file of a `#[cfg(test)] mod x;`
            continue
        for old, new in renamed.items():
            if mod[:len(old)] == old:
                modules[rel] = (new + mod[len(old):], code)
    return modules


def use_paths(tree):
    """The paths (lists of segments) a use tree such as `crate::a::{b::{C, D}, e}` names."""
    tokens = re.findall(r"::|[{},*]|\w+", tree)
    pos = 0

    def parse(prefix):
        nonlocal pos
        segs, found = list(prefix), []
        while pos < len(tokens) and tokens[pos] not in (",", "}"):
            tok = tokens[pos]
            pos += 1
            if tok == "{":
                while pos < len(tokens) and tokens[pos] != "}":
                    found += parse(segs)
                    pos += tokens[pos:pos + 1] == [","]
                pos += 1
                return found
            if tok == "as":
                pos += 1
            elif tok != "::" and not (tok == "self" and len(segs) > 0):
                segs.append(tok)
        return found + [segs]

    return parse([]) if tokens and tokens[0] != "::" else []


def resolve(path, here, mod_files):
    """The deepest module of the crate that `path`, used in module `here`, names, or None."""
    first = path[0]
    if first == "crate":
        mod, rest = (), path[1:]
    elif first in ("self", "super"):
        mod, rest = here, path
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                if not mod:
                    return None, None
                mod = mod[:-1]
            rest = rest[1:]
    elif here + (first,) in mod_files:  # `use child::X` in the parent
        mod, rest = here, path
    else:
        return None, None  # another crate, or an item in scope
    while rest and mod + (rest[0],) in mod_files:
        mod, rest = mod + (rest[0],), rest[1:]
    return mod, "::".join(rest) or (path[-1] if len(path) > 1 else first)


def crate_edges(repo, src):
    """The file graph of one crate: {file: {file it imports from: set of names taken}}."""
    modules = crate_files(repo, src)
    mod_files = defaultdict(list)
    for rel, (mod, _) in modules.items():
        mod_files[mod].append(rel)
    edges = defaultdict(lambda: defaultdict(set))
    for rel, (mod, code) in modules.items():
        code = re.sub(r"pub\s*\(\s*in\s[^)]*\)", "pub", code)
        spans = [(m.start(), block_end(code, m.end() - 1), m.group(1))
                 for m in INLINE_MOD.finditer(code)]

        def module_at(pos):
            return mod + tuple(name for start, end, name in spans if start < pos < end)

        found = [(p, m.start()) for m in USE.finditer(code) for p in use_paths(m.group(1))]
        found += [(re.split(r"\s*::\s*", m.group(0)), m.start())
                  for m in INLINE_PATH.finditer(USE.sub(lambda u: " " * len(u[0]), code))]
        for path, pos in found:
            target, name = resolve(path, module_at(pos), mod_files)
            if target is None or target[:len(mod)] == mod and len(target) > len(mod):
                continue  # a module file's own submodules are its parts, not its imports
            for other in mod_files.get(target, []):
                if other != rel:
                    edges[f"{src}/{rel}"][f"{src}/{other}"].add(name)
    return edges


def circles(edges):
    """The strongly connected components of 2+ files (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def walk(edges, component):
    """A closed chain of imports through every file of a circle: [a, b, ..., a]."""
    start = min(component)
    chain, left = [start], set(component) - {start}
    while True:
        seen, queue = {chain[-1]: None}, deque([chain[-1]])
        while queue:  # breadth first to the nearest file not yet in the chain
            v = queue.popleft()
            if (v in left or (not left and v == start)) and v != chain[-1]:
                break
            for w in sorted(edges[v]):
                if w in component and w not in seen:
                    seen[w] = v
                    queue.append(w)
        step = [v]
        while seen[step[-1]] != chain[-1]:
            step.append(seen[step[-1]])
        chain += reversed(step)
        left -= set(step)
        if chain[-1] == start:
            return chain


def describe(crate, edges, component):
    """One line naming a circle, then one line per import within it with the names taken."""
    chain = walk(edges, component)
    lines = [f"{crate}: " + " -> ".join(chain)]
    for a in sorted(component):
        for b in sorted(set(edges[a]) & component):
            lines.append(f"    {a} -> {b} (names taken: {', '.join(sorted(edges[a][b]))})")
    return "\n".join(lines)


def main():
    """Finds every crate's circles, prints them (`--list`) and checks them against ALLOWED."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found, failed = {}, False
    for crate, src in CRATES.items():
        edges = crate_edges(repo, src)
        for component in circles(edges):
            found[component] = describe(crate, edges, component)
    for component, text in sorted(found.items(), key=lambda kv: kv[1]):
        if component not in ALLOWED:
            failed = True
            print(f"new import circle:\n{text}")
            if any(component < allowed for allowed in ALLOWED):
                print("  An allow-listed circle shrank: replace its entry by these files.")
            else:
                print("  Fix it: move the names these files share into a leaf file that "
                      "imports from none of them.")
        elif "--list" in sys.argv:
            print(f"allowed (issue 40):\n{text}")
    for component in ALLOWED:
        if component not in found:
            failed = True
            print(f"gone: remove it from the allow-list: {', '.join(sorted(component))}")
    print(f"{len(found)} import circles, {len(ALLOWED)} allowed: "
          + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
