"""Every test a doc names exists: the docs' promises point at the tests that hold them
(RELIABILITY's tables, LAUNCHER's parity table, TESTING, README), and a renamed or removed test
would leave a promise that nothing checks. Reads the Markdown files given (default: README.md,
docs/*.md but the benchmark history, bindings/*/README.md), takes every `code span` that names a
test (a Rust test path `area::name` or a name of four or more words joined by underscores, a Go
`TestName`, a Python `test_name`, a C++ `Suite.Name`; `{a,b}` spelled out), and fails, listing
each one, when the repository has no such test function.

And the parity table of docs/LAUNCHER.md ("the test in the last column checks what it does"):
each row's test must use the row's flag, in one of its spellings, or its PET_ variable.

And the module maps (the path to each room, written down): every module a crate root declares
is named in its comment (core/src/lib.rs, cli/src/main.rs), every folder and file of the
libraries' `core/src/` and `src/` in DESIGN's table, every folder and file of `cli/src/` in
LAUNCHER's "How it is built"."""

import itertools
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPAN = re.compile(r"`([^`\n]+)`")
# Code spans that look like test names but are not: other crates' paths, etcd's and the
# lighthouse's and the exporter's metrics, wheel
# platform tags.
NOT_TEST_PATHS = {"rdzv", "std", "etcd_client", "tokio", "torch", "tonic"}
NOT_TEST_WORDS = ("etcd_", "manylinux_", "musllinux_", "rdzv_lighthouse_", "rdzv_job_")


def expand(token):
    """`Name{A,B}` -> NameA, NameB."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    head, tail = token[: m.start()], token[m.end():]
    return list(itertools.chain.from_iterable(expand(head + alt + tail) for alt in m.group(1).split(",")))


def definitions():
    """Every function name defined in the repository's sources, by language."""
    rust, go, python, cpp, modules = set(), set(), set(), set(), set()
    c = set()
    for path in ROOT.rglob("*"):
        if any(part in {"target", ".git", "build", "node_modules"} for part in path.parts):
            continue
        if not path.is_file():
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".rs":
            rust.update(re.findall(r"\bfn\s+([a-z_][a-z0-9_]*)\s*[<(]", text))
            # Tests a macro makes from a table of cases (`name: Killed, Waiting, Cancel;`).
            rust.update(re.findall(r"^\s*([a-z_][a-z0-9_]*):\s*[A-Z]\w*(?:,\s*[A-Z]\w*)*;", text, re.M))
            modules.add(path.stem if path.stem not in {"mod", "main"} else path.parent.name)
        elif path.suffix == ".go":
            go.update(re.findall(r"\bfunc\s+(Test\w+|Example\w*|Benchmark\w+)\s*\(", text))
        elif path.suffix == ".py":
            python.update(re.findall(r"\bdef\s+(test_\w+)\s*\(", text))
        elif path.suffix == ".c":
            c.update(re.findall(r"^(?:static\s+)?(?:void|int|bool)\s+(\w+)\s*\(", text, re.M))
        elif path.suffix in {".cpp", ".cc", ".hpp"}:
            cpp.update(".".join(t) for t in re.findall(r"\bTEST(?:_F|_P)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", text))
    return rust | c, go, python, cpp, modules


def claims(text):
    """(token, kind) for each code span that names a test. A C++ `Suite.Name` counts only on a
    line that speaks of C++ (elsewhere it is a method: Go's `Store.Close`)."""
    for span in SPAN.findall(text):
        for token in expand(span.strip()):
            token = token.strip().rstrip("(),.;")
            if re.fullmatch(r"([a-z_][a-z0-9_]*::)+(\*|[a-z_][a-z0-9_]*)", token):
                # Paths into other crates and modules themselves (`rdzv::admin`) name no test.
                first, last = token.split("::")[0], token.split("::")[-1]
                if first not in NOT_TEST_PATHS and last != "tests":
                    yield token, "rust"
            elif re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+){4,}", token) and not token.startswith(NOT_TEST_WORDS):
                yield token, "rust-or-python"
            elif re.fullmatch(r"Test[A-Z]\w+", token):
                yield token, "go"
            elif re.fullmatch(r"test_[a-z0-9_]+", token):
                yield token, "python"
            elif re.fullmatch(r"[A-Z]\w+\.[A-Z]\w+", token) and "C++" in text:
                yield token, "cpp"


def rust_test_body(name):
    """The text of the Rust function `name` in the launcher's tests, to its closing brace."""
    for path in sorted((ROOT / "cli" / "tests").rglob("*.rs")):
        text = path.read_text()
        m = re.search(r"\bfn " + re.escape(name) + r"\s*\(", text)
        if m:
            end = text.find("\n}\n", m.end())
            return text[m.start(): end if end >= 0 else len(text)]
    return None


def parity_rows():
    """(line number, spellings, test) of each row of LAUNCHER.md's parity table."""
    lines = (ROOT / "docs" / "LAUNCHER.md").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| torchrun flag |")) + 2
    for i in range(start, len(lines)):
        if not lines[i].startswith("|"):
            return
        cells = [c.strip() for c in lines[i].split("|")[1:-1]]
        yield i + 1, SPAN.findall(cells[0]), "".join(SPAN.findall(cells[-1]))


def parity_problems():
    """Rows whose test does not use their flag."""
    for lineno, spellings, test in parity_rows():
        body = rust_test_body(test)
        if body is None:
            yield f"docs/LAUNCHER.md:{lineno}: no test `{test}` in cli/tests"
            continue
        flag = spellings[0].lstrip("-") if spellings else ""
        pet = "PET_" + re.sub(r"[-_]", "_", flag).upper()
        if not any(sp in body for sp in spellings) and pet not in body:
            yield (f"docs/LAUNCHER.md:{lineno}: `{test}` does not use {' or '.join(spellings)} "
                   f"(nor {pet}): it cannot check what the row says")


def declared_modules(path):
    """The modules a crate root declares (`mod x;`, `pub mod x;`; not inline `mod x {`)."""
    return re.findall(r"^(?:pub(?:\([a-z]+\))? )?mod ([a-z_][a-z0-9_]*);", path.read_text(), re.M)


def doc_comment(path):
    """The crate root's `//!` comment."""
    return "\n".join(l[3:] for l in path.read_text().splitlines() if l.startswith("//!"))


def source_files(folder):
    """(folder relative to the crate's src, file names) for each folder of a crate's sources:
    the modules a map must name, tests and `mod.rs` aside."""
    for d in sorted(p for p in [folder, *folder.rglob("*")] if p.is_dir()):
        names = sorted(f.name for f in d.glob("*.rs") if f.name not in {"mod.rs", "tests.rs"})
        if names or d == folder:
            yield d.relative_to(folder), names


def section(text, heading):
    """The Markdown section under `heading`, to the next heading of its level or above."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level),
               len(lines))
    return "\n".join(lines[start:end])


def map_problems():
    """Modules missing from the maps that say where things are: each crate root's comment (the
    modules it declares), DESIGN's table (every folder and file of the libraries' `core/src/`
    and `src/`) and
    LAUNCHER's "How it is built" (every folder and file of the launcher's `cli/src/`)."""
    for root, what in ((ROOT / "core" / "src" / "lib.rs", "core/src/lib.rs's layers"),
                       (ROOT / "cli" / "src" / "main.rs", "cli/src/main.rs's module list")):
        doc = doc_comment(root)
        for m in declared_modules(root):
            if f"`{m}`" not in doc:
                yield f"{root.relative_to(ROOT)}: module `{m}` is missing from {what}"
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    for src in ("core/src", "src"):
        rows = {}
        for line in design.splitlines():
            if line.startswith(f"| `{src}/"):
                cells = line.split("|")
                for name in re.findall(r"`" + re.escape(src) + r"/([^`]+)`", cells[1]):
                    rows[name.rstrip("/")] = line
        for folder, names in source_files(ROOT / src):
            if str(folder) == ".":
                for n in names:
                    if n != "lib.rs" and n not in rows:
                        yield f"docs/DESIGN.md: `{src}/{n}` has no row in the module map"
                continue
            row = rows.get(str(folder.parts[0]))
            if row is None:
                yield f"docs/DESIGN.md: `{src}/{folder}` has no row in the module map"
                continue
            for n in names:
                if f"`{n}`" not in row:
                    yield f"docs/DESIGN.md: `{src}/{folder}/{n}` is not named in the row of `{src}/{folder.parts[0]}`"
    built = section((ROOT / "docs" / "LAUNCHER.md").read_text(), "## How it is built")
    for folder, names in source_files(ROOT / "cli" / "src"):
        if str(folder) == ".":
            for n in names:
                if n != "main.rs" and f"`{n}`" not in built:
                    yield f"docs/LAUNCHER.md (How it is built): `{n}` is not named"
            continue
        # The folder's bullet: from "- `folder/`" to the next bullet.
        m = re.search(r"^- `" + re.escape(str(folder)) + r"/`.*?(?=^- `|\Z)", built, re.M | re.S)
        if m is None:
            nested = f"`{folder.name}/`" in built
            if not nested:
                yield f"docs/LAUNCHER.md (How it is built): folder `{folder}/` is not named"
                continue
            bullet = built
        else:
            bullet = m.group(0)
        for n in names:
            if f"`{n}`" not in bullet:
                yield f"docs/LAUNCHER.md (How it is built): `{folder}/{n}` is not named in the bullet of `{folder}/`"


def main(argv):
    files = [pathlib.Path(a) for a in argv] or (
        [ROOT / "README.md"]
        + sorted(p for p in (ROOT / "docs").glob("*.md") if "HISTORY" not in p.name)
        + sorted(ROOT.glob("bindings/*/README.md"))
    )
    rust, go, python, cpp, modules = definitions()
    missing, checked = [], 0
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for token, kind in claims(line):
                checked += 1
                if kind == "rust":
                    module, name = token.split("::")[0], token.split("::")[-1]
                    ok = module in modules and (name == "*" or name in rust)
                elif kind == "rust-or-python":
                    ok = token in rust or token in python
                elif kind == "go":
                    ok = token in go
                elif kind == "python":
                    ok = token in python
                else:
                    # `Suite.Name` of a known gtest suite; anything else is a method's name.
                    suites = {t.split(".")[0] for t in cpp}
                    ok = token in cpp or token.split(".")[0] not in suites
                if not ok:
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    missing.append(f"{where}:{lineno}: no {kind} test `{token}`")
    parity = [] if argv else list(parity_problems())
    maps = [] if argv else list(map_problems())
    for m in missing + parity + maps:
        print(m, file=sys.stderr)
    print(f"docs name {checked} tests; {len(missing)} not found")
    if not argv:
        print(f"LAUNCHER.md's parity table: {len(parity)} row(s) whose test does not use its flag")
        print(f"module maps: {len(maps)} module(s) missing")
    return 1 if missing or parity or maps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
