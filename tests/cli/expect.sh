# Sourced by the CLI test scripts. expect <status> <pattern> <command...>: runs the command and
# fails the script unless it exits <status> with a line matching <pattern>.
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
