"""Reduces an `abidw` dump of librdzv to its public interface, for scripts/abi-check.sh.

Usage: abi_public.py HEADER [CRATE] < DUMP > PUBLIC     (CRATE: the library's crate name, rdzv)

abidw describes every type of the Rust crate's debug information (megabytes, and different
with every compiler release). The C ABI is only what the exported `rdzv_*` functions reach:
their parameters and returns, and what those types contain. This keeps exactly that, with the
handles the header declares opaque (`typedef struct rdzv_t rdzv_t;`) made declaration-only, so
a change inside a handle (a Rust field) is not an ABI change, while a changed `#[repr(C)]`
struct, enum or signature is. The result is one translation unit with namespaces merged and
elements sorted, so the same interface always gives the same file.
"""

import re
import sys
import xml.etree.ElementTree as ET

# Elements that define a type (the id other elements refer to with type-id).
TYPE_TAGS = {
    "type-decl",
    "class-decl",
    "union-decl",
    "enum-decl",
    "typedef-decl",
    "pointer-type-def",
    "reference-type-def",
    "qualified-type-def",
    "array-type-def",
    "function-type",
    "subrange",
    "pointer-to-member-type",
}


def main() -> None:
    header = open(sys.argv[1]).read()
    crate = sys.argv[2] if len(sys.argv) > 2 else "rdzv"
    ffi_module = re.compile(rf"\b{crate}::ffi::\w+::")
    opaque = set(re.findall(r"^typedef struct (\w+) \1;$", header, re.M))
    root = ET.parse(sys.stdin).getroot()

    # Every type definition (first one wins: abidw repeats a type in each unit using it),
    # with the namespace path it sits in; and the exported functions.
    types: dict[str, tuple[tuple[str, ...], ET.Element]] = {}
    functions: list[tuple[tuple[str, ...], ET.Element]] = []

    def walk(el: ET.Element, path: tuple[str, ...]) -> None:
        for child in el:
            if child.tag == "namespace-decl":
                walk(child, path + (child.get("name", ""),))
            elif child.tag == "function-decl" and child.get("elf-symbol-id"):
                functions.append((path, child))
            elif child.tag in TYPE_TAGS and child.get("id"):
                types.setdefault(child.get("id"), (path, child))

    for unit in root.iter("abi-instr"):
        walk(unit, ())

    # The types the functions reach. An opaque handle reaches nothing: its fields are Rust's.
    def referenced(el: ET.Element) -> set[str]:
        return {e.get("type-id") for e in el.iter() if e.get("type-id")}

    reached: set[str] = set()
    todo = set().union(*(referenced(f) for _, f in functions))
    while todo:
        tid = todo.pop()
        if tid in reached or tid not in types:
            continue
        reached.add(tid)
        el = types[tid][1]
        if el.tag == "class-decl" and el.get("name") in opaque:
            continue
        # Types nested in a class (member-type) are defined inside it, and kept with it.
        todo |= referenced(el)
    if not functions:
        sys.exit("abi_public.py: no exported function has debug information: build with debug info")
    # Every function the header declares must be in the dump, or the check would pass on a
    # library it cannot see into (stripped, or a dump that lost them). The self-test's copies
    # (another crate name) remove functions on purpose: there abidiff must report them.
    declared = set(re.findall(r"^[A-Za-z_][\w \*]*?\b(rdzv_\w+)\(", header, re.M))
    dumped = {f.get("name") for _, f in functions}
    if crate == "rdzv" and declared - dumped:
        sys.exit(f"abi_public.py: functions of the header missing from the dump: {sorted(declared - dumped)}")

    out = ET.Element("abi-corpus", {k: v for k, v in root.attrib.items() if k != "path"})
    for tag in ("elf-needed", "elf-function-symbols", "elf-variable-symbols"):
        el = root.find(tag)
        if el is not None and len(el):
            el[:] = sorted(el, key=lambda e: e.get("name", ""))
            out.append(el)
    unit = ET.SubElement(
        out, "abi-instr", {"address-size": "64", "path": "rdzv.h", "language": "LANG_C"}
    )
    if (first := root.find("abi-instr")) is not None:
        unit.set("address-size", first.get("address-size", "64"))

    namespaces: dict[tuple[str, ...], ET.Element] = {(): unit}

    def namespace(path: tuple[str, ...]) -> ET.Element:
        if path not in namespaces:
            namespaces[path] = ET.SubElement(namespace(path[:-1]), "namespace-decl", {"name": path[-1]})
        return namespaces[path]

    # C has no modules: which file of src/ffi defines a type or function is not part of the ABI.
    def place(path: tuple[str, ...], el: ET.Element) -> None:
        if path[:2] == (crate, "ffi"):
            path = ()
        for e in el.iter():
            if "name" in e.attrib:
                e.set("name", ffi_module.sub("", e.get("name")))
        namespace(path).append(el)

    for tid in sorted(reached):
        path, el = types[tid]
        if el.tag == "class-decl" and el.get("name") in opaque:
            el = ET.Element(
                "class-decl",
                {
                    "name": el.get("name"),
                    "is-struct": el.get("is-struct", "yes"),
                    "visibility": "default",
                    "is-declaration-only": "yes",
                    "id": tid,
                },
            )
        place(path, el)
    for path, el in sorted(functions, key=lambda f: f[1].get("name", "")):
        place(path, el)

    def order(el: ET.Element) -> None:
        # Namespaces first, then types by kind and name, then functions by name.
        def key(e: ET.Element) -> tuple[int, str, str, str]:
            rank = 0 if e.tag == "namespace-decl" else 2 if e.tag == "function-decl" else 1
            return (rank, e.tag, e.get("name", ""), e.get("id", ""))

        if el.tag in ("abi-instr", "namespace-decl"):
            el[:] = sorted(el, key=key)
        for child in el:
            order(child)

    order(unit)
    # Every type referred to is defined, else abidiff could not read the result.
    defined = {e.get("id") for e in out.iter() if e.get("id")}
    if missing := sorted(referenced(out) - defined):
        sys.exit(f"abi_public.py: types {missing} are referred to but not defined in the dump")
    ET.indent(out, space="  ")
    sys.stdout.write(ET.tostring(out, encoding="unicode") + "\n")


if __name__ == "__main__":
    main()
