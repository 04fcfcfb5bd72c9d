# The shared helpers of the command-line test scripts (sourced by every one of them).

# fail MESSAGE...: ends the script with "FAILED: MESSAGE".
fail() {
  echo "FAILED: $*"
  exit 1
}

# expect <status> <pattern> <command...>: runs the command and fails the script unless it exits
# <status> with a line matching <pattern>.
expect() {
  local status=$1 pattern=$2
  shift 2
  set +e
  out=$("$@" 2>&1)
  got=$?
  set -e
  if [ "$got" != "$status" ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAILED: $*: exit $got (expected $status), output:"
    head -c 2000 <<<"$out"
    exit 1
  fi
  echo "ok: exit $got: $(grep -- "$pattern" <<<"$out" | head -1 | cut -c1-200)"
}

# field NAME: the first hex value after "NAME " in standard input ("weights digest", "OK", ...).
field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" | head -1; }

# digests COMMAND...: the "weights logits" digests a run prints.
digests() {
  local out
  out=$("$@")
  echo "$(field "weights digest" <<<"$out") $(field "logits digest" <<<"$out")"
}

# same EXPECTED GOT WHAT: fails the test unless GOT is EXPECTED (and not empty).
same() {
  if [ -z "$2" ] || [ "$1" != "$2" ]; then
    echo "FAILED: $3: '$2', expected '$1'"
    exit 1
  fi
  echo "ok: $3: $2"
}

# npm_packages SCRATCH PACKAGE@VERSION...: the packages installed into SCRATCH/node_modules
# (once; the folder is kept between runs); exits 77 (skipped) where node or npm's registry is
# missing. Prints the node_modules folder.
npm_packages() {
  local scratch=$1 package missing=0
  shift
  command -v node >/dev/null || { echo "SKIPPED: node is not installed" >&2; exit 77; }
  for package in "$@"; do
    [ -d "$scratch/node_modules/${package%@*}" ] || missing=1
  done
  if [ "$missing" = 1 ]; then
    mkdir -p "$scratch"
    npm install --prefix "$scratch" --no-audit --no-fund --silent "$@" >/dev/null 2>&1 ||
      { echo "SKIPPED: cannot install the npm packages" >&2; exit 77; }
  fi
  echo "$scratch/node_modules"
}

# agree_with_references WHAT IDS REFERENCES: fails unless every line of the file REFERENCES (one
# JSON array of ids per reference implementation) is IDS; prints how many agreed.
agree_with_references() {
  local what=$1 ids=$2 references=$3 line
  while read -r line; do
    [ "$line" = "$ids" ] ||
      fail "$what: ours $(head -c 300 <<<"$ids"), reference $(head -c 300 <<<"$line")"
  done <"$references"
  echo "ok: $what: $(wc -l <"$references") reference(s) agree ($(tr -cd , <<<"$ids" | wc -c) ids)"
}
