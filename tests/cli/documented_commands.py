"""Every meshtensor command in the README and docs/ is one the binary accepts: its subcommand
exists (`--help` exits 0) and every option the line names is among that subcommand's options.
Usage: documented_commands.py <meshtensor> <source dir>"""
import pathlib
import re
import subprocess
import sys

binary, root = sys.argv[1], pathlib.Path(sys.argv[2])
files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def commands(text):
    """Command lines in ```sh blocks (`meshtensor ...`, also after mpirun) and in other blocks
    after a `$ ` prompt, with the indented and backslash-continued lines that follow joined on;
    and inline `meshtensor ...` code in the prose."""
    out = [" ".join(m.split()) for m in re.findall(r"(?<!`)`meshtensor ([^`]+)`", text)]
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang not in ("", "sh"):
            continue
        if lang == "":
            block = "\n".join(l[2:] if l.startswith("$ ") else ("" if not l.startswith(" ") else l)
                              for l in block.split("\n"))
        current = None
        for line in block.split("\n"):
            continued = current is not None and (line.startswith(" ") or current.endswith("\\"))
            if continued:
                current = current.rstrip("\\") + " " + line.strip()
                continue
            if current is not None:
                out.append(current)
            current = None
            m = re.search(r"(?:^|\s)meshtensor\s+(.*)$", line.split("#")[0].strip())
            if m and not line.lstrip().startswith("#"):
                current = m.group(1)
        if current is not None:
            out.append(current)
    return out


help_cache = {}


def help_of(path):
    if path not in help_cache:
        run = subprocess.run([binary, *path, "--help"], capture_output=True, text=True)
        help_cache[path] = (run.returncode, run.stdout + run.stderr)
    return help_cache[path]


def subcommand_path(words):
    path = []
    for word in words:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
            break
        code, text = help_of(tuple(path))
        listed = re.findall(r"^  ([a-z][a-z0-9-]*)\s", text, re.M)
        if word not in listed:
            break
        path.append(word)
    return tuple(path)


checked = 0
failures = []
for file in files:
    for line in commands(file.read_text()):
        words = line.split()
        path = subcommand_path(words)
        where = f"{file.relative_to(root)}: meshtensor {line[:100]}"
        if not path:
            failures.append(f"{where}: no subcommand")
            continue
        code, text = help_of(path)
        rest = words[len(path)] if len(words) > len(path) else ""
        if "Subcommands:" in text and re.fullmatch(r"[a-z][a-z0-9-]*", rest):
            failures.append(f"{where}: `{' '.join(path)}` has no subcommand {rest}")
            continue
        if code != 0:
            failures.append(f"{where}: `{' '.join(path)} --help` exited {code}")
            continue
        known = set(re.findall(r"(--[a-z][a-z0-9-]*)", text))
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line):
            # --[no-]x documents --x and --no-x.
            if flag not in known and flag != "--help":
                failures.append(f"{where}: `{' '.join(path)}` has no option {flag}")
        checked += 1

for failure in failures:
    print("FAILED:", failure)
print(f"{checked} documented commands checked, {len(failures)} failures")
sys.exit(1 if failures or checked == 0 else 0)
