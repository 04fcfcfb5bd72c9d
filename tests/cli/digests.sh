# Helpers of the command-line tests that compare digests (sourced).
# field NAME: the first hex value after "NAME " in standard input.
field() { sed -n "s/.*$1 \([0-9a-f]*\).*/\1/p" | head -1; }
# same EXPECTED GOT WHAT: fails the test unless GOT is EXPECTED (and not empty).
same() {
  if [ -z "$2" ] || [ "$1" != "$2" ]; then
    echo "FAILED: $3: '$2', expected '$1'"
    exit 1
  fi
  echo "ok: $3: $2"
}
