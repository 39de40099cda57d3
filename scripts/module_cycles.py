#!/usr/bin/env python3
"""Lists import cycles between the modules of each crate in the workspace.

    python3 scripts/module_cycles.py [CRATE_DIR...]   # default: every crate
    python3 scripts/module_cycles.py --self-test      # finds planted cycles

A crate's source files give its modules (`a.rs` and `a/mod.rs` are `a`,
`a/b.rs` is `a::b`); each `crate::`, `super::` and `self::` path in a file,
in `use` statements or inline, is an edge from the file's module to the
module that defines the named item. Re-exports (`pub use`, globs included)
are followed to the item's own module, so a re-export cannot hide a cycle.
An edge between `a::x` and `a::y::z` counts between the siblings `a::x` and
`a::y`; a module's uses of its ancestors or of its own children are not
edges. Test-only code (`#[cfg(test)]` items and modules) is left out.
Each strongly connected group of sibling modules is printed with the file
and line of one use behind every edge. Exit status 1 when any cycle is
found, else 0.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))

# A line comment, a (raw) string or a char literal: blanked before parsing.
NOISE = re.compile(r'//[^\n]*|r(#*)"(?:.|\n)*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\\\'])\'')
BLOCK_COMMENT = re.compile(r"/\*(?:.|\n)*?\*/", re.S)
ITEM = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+(\w+)"
)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"\b(?:crate|super|self)(?:\s*::\s*(?:\w+|\*))+")


def blank(m):
    """Replaces a match by spaces, keeping its newlines (line numbers stay)."""
    return re.sub(r"[^\n]", " ", m.group(0))


def strip(src):
    """Source without comments, strings and `#[cfg(test)]` items."""
    src = BLOCK_COMMENT.sub(blank, src)
    # Strings before line comments: "//" inside a string is no comment.
    out, i = [], 0
    for m in NOISE.finditer(src):
        out.append(src[i : m.start()])
        out.append(blank(m))
        i = m.end()
    out.append(src[i:])
    src = "".join(out)
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]", src))):
        end = item_end(src, m.end())
        src = src[: m.start()] + blank_text(src[m.start() : end]) + src[end:]
    return src


def blank_text(s):
    return re.sub(r"[^\n]", " ", s)


def item_end(src, i):
    """End of the item starting at `i`: its `;` or its balanced `{...}`."""
    depth = 0
    while i < len(src):
        c = src[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return i


def expand_use(tree):
    """`a::{b, c::{d as e}}` -> [(['a','b'], 'b'), (['a','c','d'], 'e')]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []

    def walk(prefix, t):
        t = t.strip()
        if not t:
            return
        if t.endswith("}") and "{" in t:
            head, body = t[: t.index("{")], t[t.index("{") + 1 : -1]
            head = [s for s in head.strip().rstrip(":").split("::") if s.strip()]
            for part in split_top(body):
                walk(prefix + [s.strip() for s in head], part)
            return
        alias = None
        m = re.match(r"(.*?)\s+as\s+(\w+)$", t)
        if m:
            t, alias = m.group(1), m.group(2)
        segs = [s.strip() for s in t.split("::") if s.strip()]
        if segs == ["self"]:
            segs = []
        full = prefix + segs
        if full:
            out.append((full, alias or full[-1]))

    walk([], tree)
    return out


def split_top(body):
    parts, depth, cur = [], 0, ""
    for c in body:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


class Crate:
    """One crate root: its modules, their items and re-exports, its edges."""

    def __init__(self, name, files):
        self.name = name
        self.modules = {}  # path tuple -> (file, stripped source)
        self.items = {}  # path tuple -> set of names defined there
        self.reexports = {}  # path tuple -> {name: absolute path list}
        self.globs = {}  # path tuple -> [absolute module path lists]
        self.modules = dict(files)
        for mod, (f, src) in self.modules.items():
            self.items[mod] = set(ITEM.findall(src))
        for mod, (f, src) in self.modules.items():
            rex, globs = {}, []
            for m in USE.finditer(src):
                if not m.group(1):
                    continue
                for path, alias in expand_use(m.group(2)):
                    absolute = self.absolute(mod, path)
                    if absolute is None:
                        continue
                    if path[-1] == "*":
                        globs.append(absolute[:-1])
                    else:
                        rex[alias] = absolute
            self.reexports[mod] = rex
            self.globs[mod] = globs

    def absolute(self, mod, path):
        """`path` as seen from module `mod`, from the crate root; None if external."""
        path = list(path)
        if path[0] == "crate":
            return path[1:]
        if path[0] in ("super", "self"):
            cur = list(mod)
            while path and path[0] in ("super", "self"):
                if path.pop(0) == "super":
                    cur = cur[:-1]
            return cur + path
        if tuple(mod) + (path[0],) in self.modules:
            return list(mod) + path
        if path[0] in self.reexports.get(tuple(mod), {}) or path[0] in self.items.get(tuple(mod), ()):
            return list(mod) + path
        return None

    def owner(self, path, seen=None):
        """The module that defines the item `path` names (followed through re-exports)."""
        seen = seen or set()
        key = tuple(path)
        if key in seen:
            return ()
        seen.add(key)
        cur = ()
        for i, seg in enumerate(path):
            if cur + (seg,) in self.modules:
                cur = cur + (seg,)
                continue
            if seg in self.items.get(cur, ()):
                return cur
            target = self.reexports.get(cur, {}).get(seg)
            if target is not None:
                return self.owner(target + list(path[i + 1 :]), seen)
            for g in self.globs.get(cur, []):
                found = self.owner(g + list(path[i:]), seen)
                if found != tuple(g) or seg in self.items.get(tuple(g), ()):
                    return found
            return cur
        return cur

    def edges(self):
        """{(from sibling, to sibling): (file, line, text)} over all modules."""
        out = {}
        for mod, (f, src) in sorted(self.modules.items()):
            refs = []
            for m in USE.finditer(src):
                for path, _ in expand_use(m.group(2)):
                    refs.append((path, m.start()))
            for m in PATH.finditer(src):
                segs = [s.strip() for s in m.group(0).split("::")]
                refs.append((segs, m.start()))
            for path, at in refs:
                absolute = self.absolute(mod, path)
                if absolute is None:
                    continue
                if absolute and absolute[-1] == "*":
                    absolute = absolute[:-1]
                target = self.owner(absolute)
                pair = sibling_pair(mod, target)
                if pair and pair not in out:
                    line = src.count("\n", 0, at) + 1
                    out[pair] = (os.path.relpath(f, ROOT), line)
        return out


def sibling_pair(a, b):
    """The siblings under the common parent of `a` and `b`, or None."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    if n == len(a) or n == len(b):
        return None  # one is the other's ancestor (or itself)
    return (a[: n + 1], b[: n + 1])


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


MOD = re.compile(r"\bmod\s+(\w+)\s*;")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def module_files(root_file):
    """{module path: (file, stripped source)} of a crate, found by following
    its `mod x;` declarations from its root file (test-only ones are left
    out). An inline `mod x { ... }` is a module of its own: its source is
    the block's (the rest of its file blanked, so lines keep their numbers),
    blanked in the file's, and its `mod y;` are files under `x/`."""
    with open(root_file, encoding="utf-8") as fh:
        root_src = strip(fh.read())
    found = {}
    # (module, file, its stripped source, the directory of its children's files)
    todo = [((), root_file, root_src, os.path.dirname(root_file))]
    while todo:
        mod, f, src, base = todo.pop()
        # Top-level inline blocks become modules of their own.
        i = 0
        while True:
            m = INLINE_MOD.search(src, i)
            if m is None:
                break
            end = item_end(src, m.start())
            name = m.group(1)
            body = blank_text(src[: m.end()]) + src[m.end() : end] + blank_text(src[end:])
            todo.append((mod + (name,), f, body, os.path.join(base, name)))
            src = src[: m.start()] + blank_text(src[m.start() : end]) + src[end:]
            i = end
        if mod in found and found[mod][0] == f:
            # Two blocks of one name (`#[cfg(unix)] mod imp {..}` and its
            # other-platform twin): one module holding both bodies.
            src = "".join(x if not x.isspace() else y for x, y in zip(src, found[mod][1]))
        found[mod] = (f, src)
        for name in MOD.findall(src):
            for cand, owns in ((os.path.join(base, name + ".rs"), False), (os.path.join(base, name, "mod.rs"), True)):
                if os.path.exists(cand):
                    with open(cand, encoding="utf-8") as fh:
                        child = strip(fh.read())
                    child_base = os.path.dirname(cand) if owns else cand[:-3]
                    todo.append((mod + (name,), cand, child, child_base))
                    break
    return found


def crates_of(crate_dir):
    """(name, {module: file}) of each crate root (library, binaries) of the
    package in `crate_dir`, as its Cargo.toml declares them."""
    with open(os.path.join(crate_dir, "Cargo.toml"), encoding="utf-8") as fh:
        toml = fh.read()
    name = re.search(r'^name\s*=\s*"([^"]+)"', toml, re.M).group(1)
    src = os.path.join(crate_dir, "src")
    roots = []
    if os.path.exists(os.path.join(src, "lib.rs")):
        roots.append((name, os.path.join(src, "lib.rs")))
    bins = re.findall(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"\s*path\s*=\s*"([^"]+)"', toml)
    for bin_name, path in bins:
        roots.append((f"{name} (bin {bin_name})", os.path.join(crate_dir, path)))
    if not bins:
        if os.path.exists(os.path.join(src, "main.rs")):
            roots.append((f"{name} (bin)", os.path.join(src, "main.rs")))
        bin_dir = os.path.join(src, "bin")
        if os.path.isdir(bin_dir):
            for x in sorted(os.listdir(bin_dir)):
                p = os.path.join(bin_dir, x)
                if x.endswith(".rs"):
                    roots.append((f"{name} (bin {x[:-3]})", p))
                elif os.path.exists(os.path.join(p, "main.rs")):
                    roots.append((f"{name} (bin {x})", os.path.join(p, "main.rs")))
    return [(n, module_files(f)) for n, f in roots]


def workspace_crates():
    with open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8") as fh:
        text = fh.read()
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", text).group(1)
    return [ROOT] + [os.path.join(ROOT, m) for m in re.findall(r'"([^"]+)"', members)]


def self_test():
    """Plants cycles in a throwaway crate (one hidden behind a re-export,
    one through `super::` between nested siblings, one between the files of
    an inline module) and checks that each is found, and that the crate
    without them is clean."""
    import tempfile

    files = {
        "Cargo.toml": '[package]\nname = "planted"\n',
        "src/lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\nmod e {\n    pub mod p;\n    pub mod q;\n}\npub use b::Thing;\n",
        "src/a.rs": "use crate::Thing;\npub fn f() -> Thing { Thing }\n",
        "src/b.rs": "pub struct Thing;\n",
        "src/c.rs": "// crate::a::f() in a comment is no edge\npub fn g() {}\n",
        "src/d/mod.rs": "mod x;\nmod y;\npub fn h() {}\n",
        "src/d/x.rs": "pub fn one() { super::h() }\n",
        "src/d/y.rs": "pub fn two() {}\n",
        "src/e/p.rs": "pub fn three() {}\n",
        "src/e/q.rs": "pub fn four() { super::p::three() }\n",
    }
    planted = {
        "src/b.rs": "pub struct Thing;\npub fn uses_a() { crate::a::f(); }\n",
        "src/d/x.rs": "pub fn one() { super::y::two() }\n",
        "src/d/y.rs": "use super::x::one;\npub fn two() { let _ = one; }\n",
        "src/e/p.rs": "pub fn three() { super::q::four() }\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        clean = [cycles(Crate(*c).edges()) for c in crates_of(tmp)]
        for name, text in planted.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        found = [cycles(Crate(*c).edges()) for c in crates_of(tmp)]
    want = [[[("a",), ("b",)], [("d", "x"), ("d", "y")], [("e", "p"), ("e", "q")]]]
    if clean != [[]] or found != want:
        print(f"self-test failed: clean {clean}, planted {found}, expected {want}")
        return 1
    print("self-test: every planted cycle found, none in the clean crate")
    return 0


def main(args):
    if args == ["--self-test"]:
        return self_test()
    dirs = args or workspace_crates()
    found = 0
    for d in dirs:
        for name, files in crates_of(d):
            crate = Crate(name, files)
            edges = crate.edges()
            comps = cycles(edges)
            if not comps:
                n = len(crate.modules)
                print(f"{name}: {n} module{'' if n == 1 else 's'}, no cycle")
                continue
            for comp in comps:
                found += 1
                names = ", ".join("::".join(m) for m in comp)
                print(f"{name}: cycle between {names}")
                for a in comp:
                    for b in comp:
                        if (a, b) in edges:
                            f, line = edges[(a, b)]
                            print(f"    {'::'.join(a)} -> {'::'.join(b)}  ({f}:{line})")
    if found:
        print(f"{found} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
